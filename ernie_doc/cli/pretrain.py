"""Pretrain ERNIE-Doc: masked LM + segment reordering on a streamed corpus (paper §3.4).

    ernie-doc pretrain --config configs/pretrain/tiny.yaml [--set key=value ...]
    fleetrun --nproc_per_node 2 tools/pretrain.py --config configs/pretrain/tiny.yaml
    ernie-doc pretrain --config ... --nproc 2              (the same, launched for you)
    ernie-doc pretrain --resume OUTPUT_DIR

The same trainer as tools/finetune.py (kind: pretraining). Writes OUTPUT_DIR/{run_config.yaml,
train.log, train_log.jsonl, results.json, curves.png, vdl/, checkpoints/, final/}, listed in
its manifest .ernie-doc-run.json (final/ and best/ load with from_pretrained and fine-tune
with tools/finetune.py). Bad input or configuration prints one `error:` line and exits with 2
(--debug: traceback).
"""
import sys
import zlib  # noqa: F401  before paddle (2.6.2 import-order bug, see ernie_doc/__init__)

from ernie_doc.cli import with_notes_on_stdout
from ernie_doc.cli.finetune import main as _main


def main(argv=None):
    return _main(argv, description=__doc__, config_flag=True, kind="pretraining",
                 command="ernie-doc pretrain")


def command(argv=None) -> int:
    return with_notes_on_stdout(main, argv)


if __name__ == "__main__":
    sys.exit(command())
