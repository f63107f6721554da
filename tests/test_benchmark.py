"""tools/benchmark.py --quick: runs end to end, reports throughput, parity and streaming."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT


@pytest.mark.slow
def test_benchmark_quick(tmp_path):
    pytest.importorskip("paddlenlp")
    out = tmp_path / "tmp.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "benchmark.py"), "--quick",
                           "--output", str(out)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result == json.loads(proc.stdout[proc.stdout.index("{"):])

    tp = result["throughput"]
    for model in ("ours", "paddlenlp"):
        assert tp[model]["forward_tokens_per_s"] > 0
        assert tp[model]["forward_backward_tokens_per_s"] > 0
    assert tp["ratio_ours_over_paddlenlp"]["forward_tokens_per_s"] > 0

    parity = result["parity"]
    assert parity["ok"] and parity["max"] <= 1e-5
    assert set(parity["max_abs_diff"]) == {"sequence_output", "pooled_output", "memories"}
    assert all(0 <= d <= 1e-5 for d in parity["max_abs_diff"].values())

    streams = {s["document_tokens"]: s for s in result["streaming"]}
    assert set(streams) == {512, 2048}
    for length, s in streams.items():
        assert s["segments"] == length // 128
        assert s["wall_s"] > 0 and s["tokens_per_s"] > 0
        assert s["peak_rss_process_mb"] > 0
    summary = result["streaming_summary"]
    assert summary["length_ratio"] == 4.0
    # Memory does not grow with the document (4x longer: well under 1.5x the peak).
    assert summary["peak_rss_ratio"] < 1.5
    assert result["environment"]["paddle"]
