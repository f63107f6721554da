"""tools/benchmark_explain.py (benchmarks/explain.py): gradient attribution against predict on
one long document, and occlusion's resident memory against the document's length. Run here at
--quick's tiny sizes, each measurement in this process (the tool runs each in its own): the
result's fields and what they must agree on, never a timing."""
import json

import pytest

from benchmarks import explain as bench


def test_quick_run_reports_every_field(tmp_path, monkeypatch, capsys):
    calls = []

    def here(args, what, folder, tokens, rows):
        calls.append((what, tokens, rows))
        return bench.worker(what, folder, tokens, rows)
    monkeypatch.setattr(bench, "in_subprocess", here)
    out = tmp_path / "explain.json"
    assert bench.main(["--quick", "--output", str(out)]) == 0
    result = json.loads(out.read_text())
    printed = capsys.readouterr().out   # the model loader's notes may come first
    assert result == json.loads(printed[printed.index("{"):])
    # one document, predicted with one row then explained with one row; occlusion of
    # documents of 6 and 12 segments with 4 variants a step
    assert calls == [("predict", 400, 1), ("gradient", 400, 1),
                     ("occlusion", 222, 4), ("occlusion", 414, 4)]

    g = result["gradient"]
    assert g["model"] == {"preset": "ernie-doc-small", "layers": 1, "hidden": 32, "heads": 2,
                          "memory_len": 16, "max_seq_len": 32, "stride": 16,
                          "retro_feed": True}
    # 400 tokens: a first window of 30, then 16 new tokens a window: 25 segments
    assert g["predict"]["segments"] == g["gradient"]["segments"] == 25
    assert g["same_prediction"] and g["predict"]["prediction"] in ("0", "1")
    assert g["ratio_gradient_over_predict"] == pytest.approx(
        g["gradient"]["seconds"] / g["predict"]["seconds"], abs=1e-3)
    assert g["gradient"]["recompute"] is False and g["predict"]["recompute"] is None
    for run in (g["predict"], g["gradient"]):
        assert run["seconds"] > 0 and run["peak_rss_mib"] >= run["rss_before_mib"] > 0

    o = result["occlusion"]
    assert o["model"]["max_seq_len"] == 64 and o["model"]["stride"] == 32 and o["rows"] == 4
    docs = o["documents"]
    assert [docs[k]["segments"] for k in ("6", "12")] == [6, 12]
    # ids (8 bytes a token), both readings' rows (20 bytes a position), a score a segment
    assert docs["12"]["document_bytes"] == 414 * 8 + 12 * 2 * 64 * 20 + 12 * 8
    assert o["allowed_growth_mib"] == pytest.approx(
        (docs["12"]["document_bytes"] - docs["6"]["document_bytes"]) / 2**20 + 32, abs=0.1)
    assert o["flat"] == (o["peak_growth_mib"] <= o["allowed_growth_mib"])
    assert result["environment"]["load_average_at_end"]


@pytest.mark.parametrize("argv", [["--tokens", "0"], ["--occlusion-segments", "0"],
                                  ["--threads", "0"]])
def test_bad_sizes_exit_with_one_line(argv, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(argv)
    assert e.value.code == 2
    assert "must be" in capsys.readouterr().err.splitlines()[-1]
