#!/usr/bin/env python
"""Train a SentencePiece tokenizer that ``load_tokenizer(DIR)`` can load.

    python tools/train_tokenizer.py --input a.txt b.txt --output-dir DIR \
        --vocab-size 8000 [--model-type unigram]

Writes DIR/spm.model and DIR/spm.vocab (ids 0-4: [PAD] [UNK] [CLS] [SEP] [MASK]).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

# Runnable from a checkout without installing the package.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", nargs="+", required=True, help="plain-text training files")
    p.add_argument("--output-dir", required=True, help="directory for spm.model / spm.vocab")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--model-type", choices=["unigram", "bpe", "char", "word"], default="unigram")
    p.add_argument("--character-coverage", type=float, default=0.9995)
    p.add_argument("--normalization", default="nmt_nfkc", help="SentencePiece normalization rule")
    p.add_argument("--byte-fallback", action="store_true", help="encode unknown characters as bytes")
    p.add_argument("--soft-vocab-limit", action="store_true",
                   help="allow a smaller vocab than --vocab-size on small corpora")
    p.add_argument("--input-sentence-size", type=int, default=0, help="sample this many lines (0 = all)")
    p.add_argument("--num-threads", type=int, default=1)
    return p.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    missing = [f for f in args.input if not os.path.isfile(f)]
    if missing:
        print(f"error: input file not found: {', '.join(missing)}", file=sys.stderr)
        return 2
    if args.vocab_size < 6:
        print("error: --vocab-size must leave room beyond the 5 special tokens", file=sys.stderr)
        return 2

    from ernie_doc.tokenization.spm import train

    try:
        model = train(
            args.input,
            os.path.join(args.output_dir, "spm"),
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
        # sentencepiece reports e.g. "Vocabulary size is too high" as RuntimeError.
        print(f"error: sentencepiece training failed: {str(exc).strip().splitlines()[-1]}", file=sys.stderr)
        return 1
    print(f"wrote {model} and {model[:-len('.model')]}.vocab")
    return 0


if __name__ == "__main__":
    sys.exit(main())
