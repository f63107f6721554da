#!/usr/bin/env python
"""Train a SentencePiece tokenizer that ``load_tokenizer(DIR)`` can load.

    ernie-doc train-tokenizer --input a.txt b.txt --output-dir DIR \
        --vocab-size 8000 [--model-type unigram]

Writes DIR/spm.model and DIR/spm.vocab (ids 0-4: [PAD] [UNK] [CLS] [SEP] [MASK]).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from typing import List, Optional

from ernie_doc.data.document import file_kind, utf8_lines
from ernie_doc.errors import DataError
from ernie_doc.outputs import unwritable_file
from ernie_doc.tokenization.spm import train


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", nargs="+", required=True, help="plain-text training files")
    p.add_argument("--output-dir", required=True, help="directory for spm.model / spm.vocab")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--model-type", choices=["unigram", "bpe", "char", "word"], default="unigram")
    p.add_argument("--character-coverage", type=float, default=0.9995)
    p.add_argument("--normalization", default="nmt_nfkc", help="SentencePiece normalization rule")
    p.add_argument("--byte-fallback", action="store_true",
                   help="encode unknown characters as bytes")
    p.add_argument("--soft-vocab-limit", action="store_true",
                   help="allow a smaller vocab than --vocab-size on small corpora")
    p.add_argument("--input-sentence-size", type=int, default=0,
                   help="sample this many lines (0 = all)")
    p.add_argument("--num-threads", type=int, default=1)
    return p.parse_args(argv)


def check_input(path: str) -> Optional[str]:
    """None when `path` is a readable UTF-8 regular file with some text, else why not."""
    kind = file_kind(path)  # a regular file only: sentencepiece would block on a FIFO
    if kind is not None:
        return f"{path}: input file " + ("not found" if kind == "missing"
                                         else f"is {kind}, not a regular file")
    text = False
    try:
        for _, line in utf8_lines(path):   # every line: the decoding checks them all
            text = text or bool(line.strip())
    except DataError as e:   # invalid UTF-8 (names the line), unreadable
        return str(e)
    return None if text else f"{path}: input file has no text"


def _arguments_problem(args: argparse.Namespace) -> Optional[str]:
    """Why the arguments cannot train a tokenizer (the first problem found), or None: every
    input file, the numeric options, and --output-dir, all before SentencePiece runs."""
    for f in args.input:
        problem = check_input(f)
        if problem:
            return problem
    if args.vocab_size < 6:
        return "--vocab-size must leave room beyond the 5 special tokens"
    if not 0.98 <= args.character_coverage <= 1.0:   # SentencePiece's accepted range
        return f"--character-coverage must be in [0.98, 1], got {args.character_coverage}"
    if not 1 <= args.num_threads <= 1024:
        return f"--num-threads must be in [1, 1024], got {args.num_threads}"
    if args.input_sentence_size < 0:
        return f"--input-sentence-size must be >= 0, got {args.input_sentence_size}"
    if os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
        return f"--output-dir {args.output_dir}: exists and is not a directory"
    problem = unwritable_file(os.path.join(args.output_dir, "spm.model"))
    if problem:   # before training, not after
        return f"--output-dir {args.output_dir}: {problem}"
    return None


def main(argv: Optional[List[str]] = None) -> int:
    """Everything is checked before SentencePiece runs, in a temporary directory moved into
    --output-dir only on success. Bad input: one `error:` line, exit 2."""
    args = parse_args(argv)

    def fail(message: str) -> int:
        print(f"error: {message}", file=sys.stderr)
        return 2

    problem = _arguments_problem(args)
    if problem:
        return fail(problem)

    tmp = tempfile.mkdtemp(prefix="spm-")
    try:
        try:
            train(
                args.input,
                os.path.join(tmp, "spm"),
                vocab_size=args.vocab_size,
                model_type=args.model_type,
                character_coverage=args.character_coverage,
                normalization_rule_name=args.normalization,
                hard_vocab_limit=not args.soft_vocab_limit,
                byte_fallback=args.byte_fallback,
                input_sentence_size=args.input_sentence_size,
                num_threads=args.num_threads,
            )
        except (RuntimeError, ValueError, OSError) as exc:
            # sentencepiece reports e.g. "Vocabulary size is too high" as RuntimeError, with
            # its source location in front ("src/trainer_interface.cc(590) [...] ").
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
            return fail(f"sentencepiece training failed: {reason.split('] ')[-1]}")
        try:
            os.makedirs(args.output_dir, exist_ok=True)
            for name in ("spm.model", "spm.vocab"):
                shutil.move(os.path.join(tmp, name), os.path.join(args.output_dir, name))
        except OSError as exc:
            return fail(f"--output-dir {args.output_dir}: cannot write ({exc.strerror})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    model = os.path.join(args.output_dir, "spm.model")
    print(f"wrote {model} and {model[:-len('.model')]}.vocab")
    return 0


def command(argv=None) -> int:
    return main(argv)


if __name__ == "__main__":
    sys.exit(command())
