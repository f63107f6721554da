"""A config → a prepared run: the task, tokenizer, model, splits and a summary, every input
checked before OUTPUT_DIR is written; then OUTPUT_DIR itself.

    prepare(cfg): resolve released names → eval_only of a fine-tuned folder: its reading
      settings (assemble.read_as_trained) → build_task → check data, device, OUTPUT_DIR (locked)
      → read splits, tokenizer, model (memory estimate first), reading passes → --resume:
      check the checkpoint → create OUTPUT_DIR, run_config.yaml → PreparedRun for the trainer."""
import contextlib
import math
import os
import shutil
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import paddle

from ernie_doc import distributed as dist
from ernie_doc import peers
from ernie_doc.assemble import Assembly, read_as_trained, resolve_inputs
from ernie_doc.config import RUN_CONFIG_FILE, model_folders
from ernie_doc.data.splits import Split
from ernie_doc.errors import ConfigError, PipelineError
from ernie_doc.kinds import TASK_FILE, build_task, kind_class
from ernie_doc.kinds.base import Task, load_reader
from ernie_doc.precision import AmpSettings, amp_settings, gpu_capability
from ernie_doc.predict.model_folder import read_task_record
from ernie_doc.run_config import TrainConfig, dump_yaml, load_yaml, with_values
from ernie_doc.training import outdir
from ernie_doc.training import state as ckpt
from ernie_doc.training.runlog import check_run_logs, logger, setup_logging
from ernie_doc.utils import flush_denormals, set_paddle_threads

RUN_CONFIG = RUN_CONFIG_FILE


@dataclass
class PreparedRun(Assembly):
    """What a run needs, built and checked. `model`: the network (what is saved); `wrapped`:
    what the loop calls (`model` in paddle's DataParallel when there are several ranks)."""
    given: Optional[TrainConfig] = None   # the config as written (run_config.yaml keeps it)
    wrapped: Optional[paddle.nn.Layer] = None
    train: Optional[Split] = None   # None with eval_only
    evaluated: Dict[str, Split] = field(default_factory=dict)   # eval and test splits by name
    total_steps: Optional[int] = None   # optimizer steps of the whole run (None: eval_only)
    resumed: Optional[tuple] = None   # (path, trainer state, arrays, optimizer state)
    extends: Optional[int] = None   # --resume of a finished run: its total_steps then
    rank: int = 0
    world: int = 1
    summary: List[str] = field(default_factory=list)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def prepare(cfg: TrainConfig, resume: bool = False) -> PreparedRun:
    """Build and check everything a run needs, then create OUTPUT_DIR. ConfigError / DataError
    / CheckpointError naming the key or file, before anything is written."""
    if resume and cfg.eval_only:
        raise ConfigError(f"{cfg.source}: eval_only: nothing to resume")
    given, cfg = cfg, resolve_inputs(cfg)
    fine_tuned = fine_tuned_record(cfg)
    notes: List[str] = []
    if fine_tuned is not None:   # run_config.yaml records how this evaluation reads
        reading, notes = read_as_trained(cfg, *fine_tuned)
        given, cfg = with_values(given, reading), with_values(cfg, reading)
    check_evaluated_tokenizer(cfg)
    task = build_task(cfg, trained_labels(cfg, fine_tuned))
    reported = tuple(task.metric_names) + ("loss",)
    if cfg.main_metric is not None and cfg.main_metric not in reported:
        raise ConfigError(f"{cfg.source}: main_metric {cfg.main_metric!r}: kind "
                          f"{cfg.kind!r} reports {', '.join(reported)}")
    rank, world = dist.rank(), dist.world_size()
    if task.streaming:   # before any collective call: bad data fails on every rank
        task.check_data(world)
    device = dist.init(cfg.device, peers.joining(cfg.peer_join_timeout))
    try:
        amp = amp_settings(cfg.amp, device, gpu_capability() if device == "gpu" else None,
                           compiled=bool(cfg.compile))
    except ValueError as e:
        raise ConfigError(f"{cfg.source}: amp: {e}") from None
    if amp.in_program and world > 1:   # compiled_or_none trains dygraph with several ranks
        raise ConfigError(f"{cfg.source}: amp: bf16 on CPU runs in the compiled step, which "
                          f"does not run with {world} data-parallel ranks yet")
    if cfg.threads:
        set_paddle_threads(cfg.threads, f"{cfg.source}: threads", ConfigError)
    # before any compute: a saturating loss's denormal gradients slow a CPU step several-fold
    flush_denormals(cfg.flush_denormals)
    check: Dict[str, Any] = dict(inputs=input_paths(cfg), resume=resume, marker=RUN_CONFIG,
                                 overwrite=cfg.overwrite_output_dir, source=cfg.source)
    # one run at a time in OUTPUT_DIR: the main process locks it (training.outdir) before
    # looking into it, or, when it does not exist yet, once it is checked (then again)
    locked, created = rank == 0 and os.path.isdir(cfg.output_dir), False
    try:
        if locked:
            outdir.lock_output_dir(cfg.output_dir)
        outdir.check_output_dir(cfg.output_dir, **check)
        if rank == 0 and not locked:
            created = outdir.lock_output_dir(cfg.output_dir)
            if not created:   # made by another process since it was checked
                outdir.check_output_dir(cfg.output_dir, **check)
    except BaseException:
        if rank == 0:
            _abandon(cfg.output_dir, created)
        raise
    try:
        return _prepare_locked(task.cfg, given, task, resume, rank, world, device, amp, notes)
    except BaseException as e:
        if rank == 0:
            _abandon(cfg.output_dir, created)
        # a signal from here on (training.trainer.Interrupted) may find run_config.yaml
        # written: its message reads OUTPUT_DIR (checked, so this run's or the one resumed)
        if isinstance(e, KeyboardInterrupt) and getattr(e, "output_dir", False) is None:
            setattr(e, "output_dir", cfg.output_dir)   # an attribute of ours on paddle's
        raise


def check_evaluated_tokenizer(cfg: TrainConfig) -> None:
    """eval_only trains no tokenizer: a new one's ids are not the ones the model learned (a
    fine-tuned folder's `tokenizer: train` already reads with its own: read_as_trained)."""
    if cfg.eval_only and cfg.tokenizer == "train" and kind_class(cfg.kind).uses_tokenizer:
        raise ConfigError(f"{cfg.source}: tokenizer \"train\" with eval_only would train a new "
                          f"tokenizer, whose ids are not the ones {cfg.init_checkpoint} learned; "
                          f"give the tokenizer it was trained with (tokenizer=\"\": the "
                          f"checkpoint's own, or a directory)")


def fine_tuned_record(cfg: TrainConfig) -> Optional[Tuple[str, dict]]:
    """eval_only of a fine-tuned model (init_checkpoint a folder holding task.json, or a
    weights file in one: fine_tuned_folder) → (that folder, its task.json checked); else
    None."""
    folder = fine_tuned_folder(cfg.init_checkpoint) if cfg.eval_only else None
    if folder is None:
        return None
    try:
        return folder, read_task_record(folder)
    except PipelineError as e:
        raise ConfigError(f"{cfg.source}: init_checkpoint: {e}") from None


def trained_labels(cfg: TrainConfig, fine_tuned: Optional[Tuple[str, dict]]) -> Any:
    """eval_only of a fine-tuned folder of this kind: the kind's saved_reader, which gives its
    task.json's labels (the order of the model's outputs) and reads the data with the task's
    reader; else None (build_task's own reader)."""
    if fine_tuned is None or fine_tuned[1]["kind"] != cfg.kind:
        return None
    folder, record = fine_tuned
    return kind_class(cfg.kind).saved_reader(record, cfg.task, load_reader(cfg.task), folder)


def fine_tuned_folder(path: str) -> Optional[str]:
    """The folder with task.json that checkpoint `path` belongs to, as its model config is
    found (config.model_folders): a directory itself, a weights file's folder, and above a
    folder named params/ its parent; None when there is none."""
    if not os.path.exists(path):
        return None
    return next((f for f in model_folders(path) if os.path.isfile(os.path.join(f, TASK_FILE))),
                None)


def _abandon(output_dir: str, created: bool) -> None:
    """A run refused or failed before it started: its lock goes, and so does OUTPUT_DIR if
    this run created it and it is still empty."""
    outdir.release_output_dir(output_dir)
    if created:
        with contextlib.suppress(OSError):
            os.rmdir(output_dir)


def _prepare_locked(cfg: TrainConfig, given: TrainConfig, task: Task, resume: bool,
                    rank: int, world: int, device: str, amp: AmpSettings,
                    notes: List[str]) -> PreparedRun:
    """prepare, once OUTPUT_DIR is checked (and locked by the main process); `notes`: lines
    for the run's log after its summary."""
    setup_logging(None, rank == 0)   # console now; the file once OUTPUT_DIR exists
    run = PreparedRun(cfg=cfg, given=given, task=task, resume=resume, device=device,
                      rank=rank, world=world, amp=amp)   # model and splits: built below
    spm_dir = task.read_inputs(run)
    run.model = task.build_model(run)
    run.train, run.evaluated = task.build_splits(run)
    run.summary = task.describe(run) + notes
    run.wrapped = dist.wrap(run.model)
    if run.train is not None:
        run.total_steps = count_steps(cfg, run.train)
    if resume:
        run.resumed = read_resume_state(run)
    create_output_dir(run, spm_dir)
    if spm_dir:
        shutil.rmtree(spm_dir, ignore_errors=True)   # loaded; a copy is in OUTPUT_DIR
    setup_logging(run.out, run.is_main)
    for line in run.summary:
        logger.info(line)
    return run


def epoch_steps(cfg: TrainConfig, train: Split) -> List[int]:
    """Optimizer steps of each epoch: its micro-steps over grad_accum_steps (an epoch's last
    partial step counts)."""
    steps = []
    for epoch in range(cfg.epochs):
        micro = train.num_steps(epoch)
        assert micro is not None, "an endless split has no epochs (its callers ask first)"
        steps.append(math.ceil(micro / cfg.grad_accum_steps))
    return steps


def count_steps(cfg: TrainConfig, train: Split) -> int:
    """Optimizer steps of the run: max_steps for a stream, else every epoch's steps, capped by
    max_steps."""
    if train.endless:
        return cfg.max_steps
    total = sum(epoch_steps(cfg, train))
    return min(total, cfg.max_steps) if cfg.max_steps else total


def training_plan(cfg: TrainConfig, train: Split, total_steps: int) -> str:
    """What the run will do, for its log: "3 epochs, 60 optimizer steps", or when max_steps
    stops it inside an earlier epoch "1 of 15 epochs (max_steps), 60 optimizer steps"."""
    if train.endless:
        return f"{total_steps} optimizer steps"
    per_epoch, done, epochs = epoch_steps(cfg, train), 0, 0
    while done < total_steps and epochs < len(per_epoch):
        done, epochs = done + per_epoch[epochs], epochs + 1
    run = f"{cfg.epochs}" if epochs == cfg.epochs else f"{epochs} of {cfg.epochs}"
    limit = " (max_steps)" if total_steps < sum(per_epoch) else ""
    return f"{run} epochs{limit}, {total_steps} optimizer steps"


# -- inputs -------------------------------------------------------------------------------------
def input_paths(cfg: TrainConfig) -> List[str]:
    """Paths this run reads (OUTPUT_DIR may not be, contain or lie inside any of them)."""
    def strings(value):
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            for v in value.values():
                yield from strings(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                yield from strings(v)
    # data_dir is a list of paths for a pretraining corpus
    paths = [cfg.init_checkpoint, cfg.model] + list(strings(cfg.data_dir))
    if cfg.tokenizer != "train":
        paths.append(cfg.tokenizer)
    paths.extend(strings(cfg.reader))   # reader.file, reader.files.{split}, cache_dir ...
    return [p for p in paths if isinstance(p, str) and p and os.path.exists(p)]


# -- task.json, resume and OUTPUT_DIR -----------------------------------------------------------
def task_record(run: PreparedRun) -> dict:
    """task.json of best/ and final/: the config as written and the label names, for reading
    new documents as this run did."""
    assert run.given is not None   # prepare() keeps it
    config = run.given.as_dict()
    options = getattr(run.task, "options", None)
    if options:
        # every task option as this run resolved it, defaults included: a later release that
        # changes a default (e.g. C3's token types) must not change how this model reads
        config["task_options"] = dict(options)
    return {"format": 1, "task": run.cfg.task, "kind": run.cfg.kind,
            "labels": list(getattr(run.task, "labels", [])), "config": config}


def read_resume_state(run: PreparedRun) -> tuple:
    """--resume: the latest checkpoint checked (weights restored) and logs checked, before any
    write → (path, trainer state, this rank's arrays, optimizer state)."""
    path = ckpt.latest_checkpoint(run.out)
    if path is None:
        raise ConfigError(f"--resume {run.out}: the run saved no checkpoint (it stopped "
                          "before its first), so there is nothing to resume: start it over "
                          "with the command that started it and --set "
                          "overwrite_output_dir=true")
    state, arrays, optimizer_state = ckpt.read_training_state(path, run.model)
    if state["step"] >= state["total_steps"]:   # its last checkpoint is at its last step
        run.extends = check_extension(run, state)
    elif state["total_steps"] != run.total_steps:
        raise ConfigError(f"--resume {run.out}: the data or config changed "
                          f"({state['total_steps']} steps then, {run.total_steps} now)")
    if run.is_main:
        check_run_logs(run.out)
    return path, state, arrays, optimizer_state


LIMITS = ("max_steps", "epochs")   # what --resume may raise to continue a finished run


def check_extension(run: PreparedRun, state: dict) -> int:
    """--resume of a finished run: only when --set raised max_steps or epochs, else
    ConfigError naming the keys → the new total_steps."""
    cfg, step = run.cfg, state["step"]
    saved = load_yaml(os.path.join(run.out, RUN_CONFIG))
    changed = [k for k in LIMITS if k in saved and saved[k] != getattr(cfg, k)]
    if changed and run.total_steps > step:
        return state["total_steps"]
    assert run.train is not None   # a resumed run trains
    if run.train.endless:
        raise ConfigError(f"--resume {run.out}: the run finished at step {step} (max_steps "
                          f"{cfg.max_steps}): raise max_steps to continue (--set "
                          "max_steps=N)")
    limit = f"max_steps {cfg.max_steps}" if cfg.max_steps and run.total_steps == \
        cfg.max_steps else f"epochs {cfg.epochs}"
    raise ConfigError(f"--resume {run.out}: the run finished at step {step} ({limit}): "
                      "raise max_steps or epochs to continue (--set max_steps=N or epochs=N)")


def create_output_dir(run: PreparedRun, spm_dir: Optional[str]) -> None:
    """OUTPUT_DIR with its manifest, run_config.yaml and a freshly trained tokenizer; with
    overwrite_output_dir, the previous run's listed entries go first (nothing else)."""
    if run.is_main:
        if not run.resume:
            removed = outdir.clear_previous_run(run.out)
            if removed:
                logger.info(f"overwrite_output_dir: removed the previous run in {run.out} "
                            f"({', '.join(removed)})")
        outdir.open_run(run.out)
        if spm_dir:
            outdir.claim(run.out, "tokenizer")
            os.makedirs(os.path.join(run.out, "tokenizer"), exist_ok=True)
            dst = os.path.join(run.out, "tokenizer", "spm.model")
            shutil.copy2(os.path.join(spm_dir, "spm.model"), dst)
            run.tokenizer.source_files = [dst]
        assert run.given is not None   # prepare() keeps it
        if not run.resume:
            outdir.write_text(run.out, RUN_CONFIG, dump_yaml(run.given.as_dict()))
        elif run.extends is not None:
            values = load_yaml(os.path.join(run.out, RUN_CONFIG))
            values.update({k: getattr(run.given, k) for k in LIMITS})
            outdir.write_text(run.out, RUN_CONFIG, dump_yaml(values))
        outdir.claim(run.out, "train.log")   # setup_logging opens it next
    dist.barrier()
