"""tools/run_document.py, the README's main command, on its built-in default."""
import json
import os
import subprocess
import sys

from helpers import ROOT


def test_run_document_default(tmp_path):
    out = tmp_path / "summary.json"
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "run_document.py"),
                           "--tokens", "1100", "--output", str(out)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "segment    3: sequence_output [1, 512, 256] pooled [1, 256] memories " \
           "[6, 1, 128, 256]" in proc.stdout
    summary = json.loads(out.read_text())
    assert summary["tokens"] == 1100 and summary["segments"] == 3
    assert summary["tokens_per_second"] > 0
