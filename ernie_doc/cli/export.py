#!/usr/bin/env python
"""Export ERNIE-Doc (bare or with a task head) for paddle.inference.

    ernie-doc export --config ernie-doc-base-en --output out/ernie_doc \
        [--head sequence_classification --num-labels 2 | question_answering |
         token_classification --num-labels N | multiple_choice --num-choices 4 |
         pair_matching | hotpotqa | keyphrase]
        [--batch-size 8 | --batch-size dynamic] [--seq-len 512]

--config is a released name, a checkpoint in any layout, a URL or .tar.gz, or a preset / config
JSON (random weights). Writes the program, <output>.pdiparams and the sidecar <output>.meta.json
(ernie_doc/predict/export.py and predict/engine.py describe them and the Predictor) and prints a
JSON summary; an existing export is replaced only with --overwrite. Errors: one `error:` line,
exit 2.
"""
import argparse
import contextlib
import inspect
import json
import os
import sys
import warnings
import zlib  # noqa: F401  before paddle (2.6.2 import-order bug, see ernie_doc/__init__)
from typing import Any, Dict, List, Optional

from ernie_doc.cli import exit_on_user_error, head_choices, user_error_types, with_notes_on_stdout
from ernie_doc.cli.run_document import is_checkpoint_spec
from ernie_doc.config import ErnieDocConfig
from ernie_doc.errors import ConfigError, ExportError
from ernie_doc.outputs import InputSet, check_output, create_new, temp_name
from ernie_doc.utils import open_regular, read_json

# the static-graph conversion warns about its own internals on stderr, where only an error
# line belongs (GLOG_minloglevel=0 shows the C++ ones again)
warnings.filterwarnings("ignore", message=r"The Attr\(force_cpu\) of Op", category=UserWarning)
os.environ.setdefault("GLOG_minloglevel", "2")

# A classification head's weight is hidden_size x num_labels floats: far beyond any label
# set, and past int32 (paddle's shape type) it is a C++ error instead of an allocation.
MAX_LABELS = 1_000_000


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    heads = head_choices(exportable=True)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True,
                   help="a released name (its weights, fetched once into the cache), a "
                        "checkpoint directory, URL or .tar.gz, or a preset name / config JSON "
                        "(random weights)")
    p.add_argument("--output", required=True, help="output prefix, e.g. out/ernie_doc")
    p.add_argument("--head", default="none",
                   choices=None if heads is None else ["none"] + heads)
    p.add_argument("--num-labels", type=int, default=None,
                   help="sequence/token classification labels (default: the config's)")
    p.add_argument("--num-choices", type=int, default=4, help="multiple choice: choices")
    p.add_argument("--batch-size", default="dynamic",
                   help="fixed batch size, or 'dynamic' (default)")
    p.add_argument("--seq-len", type=int, default=None,
                   help="segment length T (default: max_position_embeddings)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the files of an earlier export at --output")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    args = p.parse_args(argv)
    if args.batch_size == "dynamic":
        args.batch_size = None
    else:
        try:
            args.batch_size = int(args.batch_size)
        except ValueError:
            p.error(f"--batch-size must be an integer or 'dynamic', got {args.batch_size!r}")
        if args.batch_size < 1:
            p.error(f"--batch-size must be a positive integer or 'dynamic', got "
                    f"{args.batch_size}")
    if args.num_labels is not None and not 1 <= args.num_labels <= MAX_LABELS:
        p.error(f"--num-labels must be in [1, {MAX_LABELS:,}], got {args.num_labels}")
    if not 1 <= args.num_choices <= MAX_LABELS:
        p.error(f"--num-choices must be in [1, {MAX_LABELS:,}], got {args.num_choices}")
    if args.seq_len is not None and args.seq_len < 1:
        p.error(f"--seq-len must be a positive integer, got {args.seq_len}")
    if args.head == "multiple_choice" and args.batch_size and \
            args.batch_size % args.num_choices:
        p.error(f"--batch-size {args.batch_size} must be a multiple of --num-choices "
                f"{args.num_choices} (one row per choice)")
    if os.path.basename(args.output) in ("", ".", "..") or os.path.isdir(args.output):
        p.error(f"--output {args.output}: give a file prefix such as DIR/model, not a "
                f"directory")
    return args


def head_kwargs(args: argparse.Namespace, cls: Optional[type] = None) -> Dict[str, Any]:
    """The constructor arguments of the head `cls` (default: args.head's) that the command
    line gives: --num-labels (when given) and --num-choices, to the heads that take them."""
    from ernie_doc import auto
    if cls is None:
        if args.head == "none":
            return {}
        cls = auto.head_class(args.head)
    params = inspect.signature(cls.__init__).parameters
    kwargs = {}
    if "num_labels" in params and args.num_labels:
        kwargs["num_labels"] = args.num_labels
    if "num_choices" in params:
        kwargs["num_choices"] = args.num_choices
    return kwargs


def build_model(args: argparse.Namespace):
    """The model to export: (model, where its weights came from)."""
    from ernie_doc import auto
    from ernie_doc.modeling import ErnieDocModel

    cls = ErnieDocModel if args.head == "none" else auto.head_class(args.head)
    kwargs = head_kwargs(args, cls) if args.head != "none" else {}
    if os.path.isdir(args.config) or is_checkpoint_spec(args.config):
        return cls.from_pretrained(args.config, **kwargs), f"from_pretrained({args.config})"
    return cls(ErnieDocConfig.from_any(args.config), **kwargs), "random"


def main(argv: Optional[List[str]] = None) -> int:
    """→ 0 after a complete export. Bad input or an unwritable output: one `error:` line
    and exit status 2 (SystemExit)."""
    args = parse_args(argv)
    try:
        return _export(args)
    except user_error_types() as e:   # or full disk, read-only, a file for a dir
        exit_on_user_error(e, args.debug, os.path.dirname(os.path.abspath(args.output)),
                           "--output")
        raise


PREDICT_FILES = ("task.json", "encoder.json", "vocab.bpe", "vocab.txt", "tokenizer_config.json")


def predict_files(source: str) -> List[str]:
    """The files `ernie-doc predict` needs beside an export (task.json, tokenizer files) of a
    fine-tuned model directory; [] when `source` is not one."""
    if not os.path.isfile(os.path.join(source, "task.json")):
        return []
    names = [n for n in sorted(os.listdir(source))
             if n in PREDICT_FILES or n.endswith(".model")]   # SentencePiece
    return [os.path.join(source, n) for n in names if os.path.isfile(os.path.join(source, n))]


def run_seq_len(source: str) -> Optional[int]:
    """The max_seq_len a fine-tuned model was trained with (its task.json), or None."""
    path = os.path.join(source, "task.json")
    if not os.path.isfile(path):
        return None
    record = read_json(path, ConfigError)
    value = record.get("config", {}).get("max_seq_len") if isinstance(record, dict) else None
    return value if isinstance(value, int) else None


EXPORT_SUFFIXES = (".json", ".pdmodel", ".pdiparams", ".pdiparams.info", ".meta.json")


def check_outputs(args: argparse.Namespace, directory: str) -> List[str]:
    """Every file the export writes, checked by ernie_doc.outputs' rule (ExportError,
    one line) before anything is written → the paths of the predict files to write."""
    inputs = InputSet([args.config] if os.path.exists(args.config) else [])
    out_dir = os.path.dirname(os.path.abspath(args.output))
    copies = [os.path.join(out_dir, os.path.basename(path))
              for path in (predict_files(directory) if directory else [])]
    for path in [args.output + suffix for suffix in EXPORT_SUFFIXES] + copies:
        check_output(path, inputs, exists_ok=args.overwrite, error=ExportError)
    return copies


def stage_copies(sources: List[str], out_dir: str) -> List[str]:
    """Copy `sources` into `out_dir` under new temporary names (O_EXCL) → those names, renamed
    once the export is done. ExportError (one line) for an unreadable source, copies removed."""
    staged = []
    try:
        for source in sources:
            with open_regular(source, "predict file", ExportError) as src:
                staged.append(os.path.join(out_dir, temp_name()))
                with os.fdopen(create_new(staged[-1]), "wb") as dst:
                    while True:
                        try:
                            block = src.read(1 << 20)
                        except OSError as e:
                            raise ExportError(f"{source}: cannot read ({e.strerror})") \
                                from None
                        if not block:
                            break
                        dst.write(block)   # a full disk: the caller's one line
    except BaseException:
        remove_files(staged)
        raise
    return staged


def remove_files(paths: List[str]) -> None:
    """Remove the files this run created (`paths`), those still there."""
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _export(args):
    from ernie_doc.predict.export import export
    directory = args.config if os.path.isdir(args.config) else ""
    copies = check_outputs(args, directory)
    model, source = build_model(args)
    # the run's segment length T: predict reads documents in the windows training used
    seq_len = args.seq_len or (directory and run_seq_len(directory)) or \
        model.config.max_position_embeddings
    if seq_len > model.config.max_position_embeddings:
        raise ExportError(f"--seq-len {seq_len} exceeds the model's max_position_embeddings "
                          f"{model.config.max_position_embeddings}")
    out_dir = os.path.dirname(os.path.abspath(args.output))
    made = not os.path.isdir(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    # the predict files are staged before the export writes and renamed after it: a failed
    # export leaves none of them, and replaces nothing
    staged = []
    try:
        staged = stage_copies(predict_files(directory) if directory else [], out_dir)
        info = export(model, args.output, seq_len=seq_len, batch_size=args.batch_size)
        for tmp, target in zip(staged, copies):
            os.replace(tmp, target)
    except BaseException:
        remove_files(staged)
        if made:
            with contextlib.suppress(OSError):
                os.rmdir(out_dir)
        raise
    copied = [os.path.basename(path) for path in copies]
    if source == "random":
        print("warning: --config is a config, not a checkpoint: exported random weights",
              file=sys.stderr)
    summary = {
        "model_path": info["model_path"],
        "params_path": info["params_path"],
        "meta_path": info["meta_path"],
        "model_class": info["model_class"],
        "weights": source,
        "seq_len": info["seq_len"],
        "batch_size": info["batch_size"],
        "memory_shape": info["memory_shape"],
        "inputs": [i["name"] for i in info["inputs"]],
        "head_inputs": sorted(info.get("head_inputs", {})),
        "outputs": [o["name"] for o in info["outputs"]],
        "predict_files": copied,
    }
    print(json.dumps(summary, indent=2))
    return 0


def command(argv: Optional[List[str]] = None) -> int:
    return with_notes_on_stdout(main, argv)


if __name__ == "__main__":
    sys.exit(command())
