"""Fine-tune ERNIE-Doc on a task: one trainer for every task.

    ernie-doc finetune tasks/imdb/config.yaml [--set key=value ...]   (or tools/finetune.py)
    ernie-doc finetune imdb --set data_dir=...            (a task name: its packaged config)
    ernie-doc finetune CONFIG --nproc 2 --set ...         (= fleetrun --nproc_per_node 2
                                                           tools/finetune.py CONFIG ...)
    ernie-doc finetune --resume OUTPUT_DIR [--set stop_at_step=0]
    ernie-doc finetune CONFIG --set eval_only=true init_checkpoint=DIR [test_splits=[test]]

Writes OUTPUT_DIR/{run_config.yaml, train.log, train_log.jsonl, eval_history.jsonl,
eval_results.json, predictions_<split>.jsonl, curves.png, vdl/, checkpoints/, best/}, each
listed in OUTPUT_DIR/.ernie-doc-run.json before it is created: overwrite_output_dir removes only
what that manifest lists. A finished run resumes only with max_steps or epochs raised.
Bad input or configuration prints one `error:` line and exits with 2 (--debug: traceback).
"""
import argparse
import os
import signal
import sys
import traceback
import zlib  # noqa: F401  before paddle (2.6.2 import-order bug, see ernie_doc/__init__)

from ernie_doc.cli import (exit_on_user_error, nothing_written_yet, user_error_types,
                           with_notes_on_stdout)
from ernie_doc.errors import ConfigError
from ernie_doc.kinds.folders import named_config, task_hint, task_names, task_variants


def parse_args(argv=None, description=__doc__, config_flag=False):
    p = argparse.ArgumentParser(
        description=description.splitlines()[0],
        epilog="Every setting is a run-config key: in the config file, or --set key=value on "
               "the command line (--set epochs=1 reader.dev_ratio=0.2). --help-config lists "
               "every key with its default and meaning.")
    help_config = ("config.yaml, or a task's name (its own config.yaml; imdb:large its "
                   "config_large.yaml; --list-tasks); "
                   "default with --resume: the run's own run_config.yaml; without either, "
                   "--set must give task=...")
    if config_flag:
        p.add_argument("--config", help=help_config)
    else:
        p.add_argument("config", nargs="?", help=help_config)
    p.add_argument("--set", dest="overrides", nargs="+", action="extend", default=[],
                   metavar="KEY=VALUE", help="override config keys (dotted for reader.* and "
                                             "model_overrides.*)")
    p.add_argument("--resume", metavar="OUTPUT_DIR", help="continue an interrupted run")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.add_argument("--list-tasks", action="store_true", help="list the task folders and their "
                                                         "configs' names, and exit")
    p.add_argument("--help-config", action="store_true",
                   help="list every run-config key (for --set key=value) with its default "
                        "and meaning, and exit")
    args = p.parse_args(argv)
    if not (args.config or args.resume or args.overrides or args.list_tasks
            or args.help_config):
        p.error("give a config file (or --resume OUTPUT_DIR)")
    return args


def config_path(config):
    """A config argument as given, or when it is no file but a task's name, that task's
    packaged config.yaml ("imdb:large": its config_large.yaml; a folder of that name never
    shadows the task). A name that is neither (no such path, no "/" nor ".") is a ConfigError
    naming the nearest task."""
    if config and not os.path.isfile(config):
        path = named_config(config)
        if path is None and not os.path.lexists(config) and not set(config) & {os.sep, "."}:
            raise ConfigError(f"{config}: no such config file, nor a task{task_hint(config)}; "
                              f"ernie-doc finetune --list-tasks lists the tasks")
        return path or config
    return config


def main(argv=None, description=__doc__, config_flag=False, kind=None,
         command="ernie-doc finetune"):
    """kind: the task kind accepted (None: any). Exit 2 (one `error:` line) for bad input or
    output, 1 for a non-finite loss, 130 / 143 for SIGINT / SIGTERM; bugs keep their traceback."""
    args = parse_args(argv, description, config_flag)
    if args.help_config:   # the table only: nothing below (no config, no run) is needed
        from ernie_doc.run_config import help_config
        sys.stdout.write(help_config())
        return 0
    if args.list_tasks:   # the task folders only: no paddle needed
        for name in [n for task in task_names() for n in (task, *task_variants(task))]:
            print(f"{name:<22} {named_config(name)}")
        return 0
    try:   # a file or a task's name, before paddle's import: a misspelt name answers at once
        config = config_path(args.config)
    except user_error_types() as e:
        exit_on_user_error(e, args.debug)
        raise
    with nothing_written_yet():   # paddle's import takes seconds: Ctrl-C is likely here
        from ernie_doc.run_config import load_config
        from ernie_doc.training.trainer import RUN_CONFIG, Interrupted, run
    output_dir = args.resume   # known once the config is read
    try:
        overrides = list(args.overrides)
        if args.resume:
            config = config or os.path.join(args.resume, RUN_CONFIG)
            overrides.append(f"output_dir={args.resume}")
        cfg = load_config(config, overrides)
        output_dir = cfg.output_dir
        if kind and cfg.kind != kind:
            raise ConfigError(f"{cfg.source}: kind: {cfg.kind!r}; this tool runs kind {kind!r}")
        return run(cfg, resume=bool(args.resume))
    except KeyboardInterrupt as e:   # Ctrl-C / SIGTERM: one line saying how to go on
        if not isinstance(e, Interrupted):   # before the run's handlers were installed
            e = Interrupted(signal.SIGINT)
        if args.debug:
            traceback.print_exc()
        line = e.message(command)
        if line:
            print(line, file=sys.stderr)
        sys.exit(e.status)
    except user_error_types() as e:   # exit status 1 for a TrainingError (its exit_status)
        exit_on_user_error(e, args.debug, output_dir or os.curdir)
        raise


def command(argv=None) -> int:
    return with_notes_on_stdout(main, argv)


if __name__ == "__main__":
    sys.exit(command())
