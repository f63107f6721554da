"""Pretrain ERNIE-Doc: masked LM + segment reordering on a streamed corpus (paper §3.4).

    python tools/pretrain.py --config configs/pretrain/tiny.yaml [--set key=value ...]
    fleetrun --nproc_per_node 2 tools/pretrain.py --config configs/pretrain/tiny.yaml
    python tools/pretrain.py --resume OUTPUT_DIR

The same trainer as tools/finetune.py (kind: pretraining). Writes OUTPUT_DIR/{run_config.yaml,
train.log, train_log.jsonl, results.json, curves.png, vdl/, checkpoints/, final/} (final/ and
best/ load with from_pretrained and fine-tune with tools/finetune.py). Bad input or
configuration prints one `error:` line and exits with 2 (--debug: traceback).
"""
import os
import sys
import zlib  # noqa: F401  before paddle (2.6.2 import-order bug, see ernie_doc/__init__)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tools.finetune import main as _main  # noqa: E402


def main(argv=None):
    return _main(argv, description=__doc__, config_flag=True, kind="pretraining")


if __name__ == "__main__":
    from ernie_doc.utils import notes_to_stdout
    notes_to_stdout()   # readers' and loaders' notes with the run's log, not on stderr
    main()
