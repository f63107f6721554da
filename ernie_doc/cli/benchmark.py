#!/usr/bin/env python
"""`ernie-doc benchmark`: the two benchmarks under the one command line they had before the
split; it routes by its options.

    ernie-doc benchmark [--quick] [--preset P --batch-size B --seq-len T ...]
        → ernie-doc benchmark-model (ernie_doc/cli/benchmark_model.py): the model's forward
          and forward+backward throughput against PaddleNLP, parity, streaming
    ernie-doc benchmark --pretrain-config CONFIG [--pretrain-nproc N ...] [--pretrain-steps S]
        [--pretrain-warmup W] [--set k=v ...]
        → ernie-doc benchmark-train (ernie_doc/cli/benchmark_train.py): real pretraining
          runs; the model's options are accepted and ignored, as they always were

--threads and --output belong to both. The same results, JSON and exit status as the tools
themselves; their --help says what is measured.
"""
import argparse
import sys
from typing import List, Optional

from ernie_doc.cli import benchmark_model, benchmark_train
from ernie_doc.cli.benchmark_common import add_common_arguments


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    benchmark_model.add_model_arguments(p)
    add_common_arguments(p)
    g = p.add_argument_group("pretraining throughput (a mode of its own: ernie-doc "
                             "benchmark-train)")
    benchmark_train.add_train_arguments(g, legacy=True)
    return p


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Both tools' options → the namespace of the one that runs (pretrain_config set: the
    training benchmark's)."""
    p = build_parser()
    args = p.parse_args(argv)
    if args.pretrain_config is None:
        if args.overrides or args.pretrain_nproc or args.pretrain_steps is not None \
                or args.pretrain_warmup is not None:
            p.error("--set and --pretrain-* need --pretrain-config")
        benchmark_model.check_args(p, args, argv, build_parser)
    else:
        benchmark_train.check_args(p, args, legacy=True)
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if args.pretrain_config is not None:
        return benchmark_train.run(args)
    return benchmark_model.run(args)


def command(argv: Optional[List[str]] = None) -> int:
    return main(argv)


if __name__ == "__main__":
    sys.exit(command())
