"""Convert an ERNIE-Doc checkpoint between layouts.

    ernie-doc convert SRC DST --to {ours,paddlenlp,official}
        [--config CONFIG_OR_PRESET] [--head HEAD] [--num-labels N] [--num-choices N]
        [--strict | --allow-partial]

SRC: a released name, a URL or .tar.gz, or a checkpoint directory in the official, PaddleNLP
or our layout (.pdparams are read by the restricted unpickler, never run). The model class is
the bare encoder unless --head is given or the checkpoint holds a head. DST files appear all
together or not at all; files DST already holds are replaced only with --overwrite, and DST is
never inside the source folder. A checkpoint that matches the model only in part is refused
unless --allow-partial. Expected errors print one line and exit with status 2.
"""
import argparse
import logging
import os
import sys
from typing import List, Optional

from ernie_doc.checkpoint import io, lodtensor
from ernie_doc.cli import head_choices
from ernie_doc.errors import CheckpointError, ErnieDocError, OutputError
from ernie_doc.hub import resolve
from ernie_doc.outputs import InputSet, check_output

TARGETS = {"ours": "safetensors", "safetensors": "safetensors", "paddlenlp": "paddlenlp",
           "official": "official"}


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src", help="checkpoint directory or weights file to read")
    p.add_argument("dst", help="directory to write (created if needed)")
    p.add_argument("--to", required=True, choices=sorted(TARGETS), help="target layout")
    p.add_argument("--config", help="preset name or JSON config; needed when SRC has none")
    p.add_argument("--head", choices=head_choices(), help="model class (default: from SRC)")
    p.add_argument("--num-labels", type=int, help="classes of a classification head")
    p.add_argument("--num-choices", type=int, help="choices of a multiple-choice head")
    p.add_argument("--strict", action="store_true",
                   help="fail if any tensor is missing from SRC or unused")
    p.add_argument("--allow-partial", action="store_true",
                   help="convert a checkpoint that matches the model only in part (encoder "
                        "tensors missing, a head only partly there, tensors of no known "
                        "head); what is missing keeps its fresh initialisation")
    p.add_argument("--source", choices=("official", "paddlenlp"),
                   help="a released name's weights (default $ERNIE_DOC_SOURCE, else official)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the files DST already holds that the conversion writes")
    p.add_argument("--quiet", action="store_true", help="print only errors")
    return p.parse_args(argv)


def written_names(dst: str, fmt: str) -> List[str]:
    """The files of DST that converting to `fmt` writes (for "official", the tensor files
    DST already holds stand for the ones it writes: their names come from the model)."""
    if fmt == "official":
        tensors = lodtensor.list_tensor_files(dst) if os.path.isdir(dst) else []
        return [io.OFFICIAL_CONFIG_FILE] + tensors
    return [io.SAFETENSORS_FILE if fmt == "safetensors" else io.PDPARAMS_FILE, io.CONFIG_FILE]


def check_destination(args: argparse.Namespace, source: str) -> None:
    """Refuse (OutputError, one line) a DST that is, aliases or lies inside `source`, a FIFO or
    device, or that exists without --overwrite."""
    if os.path.exists(args.dst) and not os.path.isdir(args.dst):
        raise OutputError(f"{args.dst}: is a file, not a directory")
    # a weights file is read with the config beside it: its folder is an input too
    # (every file of the folder, links followed, is an input: see ernie_doc.outputs)
    inputs = InputSet([source] if os.path.isdir(source) else [source, os.path.dirname(
        os.path.abspath(source))])
    for name in written_names(args.dst, TARGETS[args.to]):
        check_output(os.path.join(args.dst, name), inputs, what="DST", exists_ok=args.overwrite)


def convert(args: argparse.Namespace):
    """Read args.src, load it into its model class, write args.dst; → the model."""
    from ernie_doc import auto

    if os.path.abspath(args.src) == os.path.abspath(args.dst):
        raise CheckpointError(f"{args.dst}: the destination must differ from the source")
    source = resolve(args.src, kind="model", source=args.source)
    check_destination(args, os.fspath(source))
    ckpt = auto.read_checkpoint(source)
    cls = auto.head_class(args.head) if args.head else auto.model_class_for(ckpt)
    kwargs = {}
    if args.num_labels is not None:
        kwargs["num_labels"] = args.num_labels
    if args.num_choices is not None:
        kwargs["num_choices"] = args.num_choices
    model = cls.from_pretrained(ckpt, config=args.config, strict=args.strict,
                                allow_partial=args.allow_partial, **kwargs)
    model.save_pretrained(args.dst, format=TARGETS[args.to])
    return model


def main(argv: Optional[List[str]] = None, configure_logging: bool = False) -> int:
    """configure_logging: route warnings to stderr (the command line; a caller in-process
    keeps its own logging)."""
    args = parse_args(argv)
    if configure_logging:
        logging.basicConfig(level=logging.ERROR if args.quiet else logging.WARNING,
                            format="%(levelname)s: %(message)s", force=True)  # paddle set one
    try:
        model = convert(args)
    except (ErnieDocError, ValueError, KeyError, OSError) as e:
        # One line: the lines of a multi-line message (shape mismatches) are joined.
        lines = [line.strip() for line in str(e).splitlines() if line.strip()] or \
            [type(e).__name__]
        print("error: " + lines[0] + (" " + "; ".join(lines[1:]) if lines[1:] else ""),
              file=sys.stderr)
        return 2
    if not args.quiet:
        print(f"{type(model).__name__}: {model.load_report.summary()}")
        print(f"wrote {args.dst} ({args.to})")
    return 0


def command(argv: Optional[List[str]] = None) -> int:
    return main(argv, configure_logging=True)


if __name__ == "__main__":
    sys.exit(command())
