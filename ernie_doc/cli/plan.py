"""Estimate a run before running it: memory per device and GPU-hours, from its config.

    ernie-doc plan tasks/imdb/config.yaml --gpus 8 [--set key=value ...]   (or tools/plan.py)

Every GPU figure is an estimate (ernie_doc/plan.py; the assumptions: docs/reproduce.md). Reads
no data and allocates no model. A bad config or option prints one `error:` line, exit 2.
"""
import argparse
import sys
import zlib  # noqa: F401  before paddle (2.6.2 import-order bug, see ernie_doc/__init__)

from ernie_doc.cli.finetune import config_path
from ernie_doc.plan import UTILISATION, describe_plan, make_plan, parse_bytes


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                epilog="The run's settings are run-config keys, as for "
                                       "`ernie-doc finetune` (--help-config lists them).")
    p.add_argument("config", help="a task or pretraining config.yaml, or a task's "
                                       "name (imdb, imdb:large: ernie-doc finetune --list-tasks)")
    p.add_argument("--gpus", type=int, default=1, help="data-parallel devices (default 1); "
                                                       "batch_size is per device")
    p.add_argument("--set", dest="overrides", nargs="+", action="extend", default=[],
                   metavar="KEY=VALUE", help="override config keys, as for finetune")
    p.add_argument("--device", default="v100", type=str.lower,
                   help="v100 (default: 32 GiB, fp32 15.7 and fp16 125 TFLOP/s) or a100 (80 GiB); "
                        "any case")
    p.add_argument("--device-memory", metavar="SIZE", help="memory per device, e.g. 16GiB "
                                                           "(default: the device's)")
    p.add_argument("--peak-tflops", type=float, metavar="X",
                   help="the device's peak matmul rate at the run's precision instead")
    p.add_argument("--utilisation", "--utilization", type=float, nargs=2,
                   metavar=("LOW", "HIGH"), help="shares of the peak reached (default 0.3 0.5)")
    p.add_argument("--train-segments", type=float, metavar="N",
                   help="segment rows of one pass over the train split (default: counted "
                        "from the paper's dataset statistics of the task)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p.parse_args(argv)


def main(argv=None) -> int:
    """Print the plan → 0; a ConfigError (bad config, key or option) is raised for the
    caller's one `error:` line."""
    args = parse_args(argv)
    from ernie_doc.run_config import load_config
    cfg = load_config(config_path(args.config), args.overrides)
    memory = None if args.device_memory is None else parse_bytes(args.device_memory)
    plan = make_plan(cfg, gpus=args.gpus, device=args.device, device_memory=memory,
                     train_segments=args.train_segments,
                     utilisation=tuple(args.utilisation or UTILISATION),
                     peak_tflops=args.peak_tflops)
    print(describe_plan(plan))
    return 0


def command(argv=None) -> int:
    return main(argv)


if __name__ == "__main__":
    from ernie_doc.cli import run_command
    sys.exit(run_command(command))
