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

import numpy as np
import paddle

from ernie_doc import distributed as dist
from ernie_doc import peers
from ernie_doc.assemble import (Assembly, SavedReader, build_model, check_memory, choose_tokenizer,
                                read_as_trained, resolve_inputs, setup_reading)
from ernie_doc.config import RUN_CONFIG_FILE, model_folders
from ernie_doc.data.segment import reading_passes
from ernie_doc.data.splits import DocumentSplit, Split
from ernie_doc.errors import ConfigError, DataError
from ernie_doc.kinds import TASK_FILE, build_task, kind_class
from ernie_doc.kinds.base import Task, label_notes
from ernie_doc.precision import AmpSettings, amp_settings, gpu_capability
from ernie_doc.run_config import TrainConfig, batch_rows, with_values
from ernie_doc.training import outdir
from ernie_doc.training import state as ckpt
from ernie_doc.training.runlog import logger, setup_logging
from ernie_doc.utils import flush_denormals

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
    fine_tuned, notes = fine_tuned_record(cfg), []
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
        from ernie_doc.utils import set_paddle_threads
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
            e.output_dir = cfg.output_dir
        raise


def check_evaluated_tokenizer(cfg: TrainConfig) -> None:
    """eval_only trains no tokenizer: a new one's ids are not the ones the model learned (a
    fine-tuned folder's `tokenizer: train` already reads with its own: read_as_trained)."""
    if cfg.eval_only and cfg.tokenizer == "train" and not kind_class(cfg.kind).builds_model:
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
    from ernie_doc.errors import PipelineError
    from ernie_doc.predict.inputs import read_task_record
    try:
        return folder, read_task_record(folder)
    except PipelineError as e:
        raise ConfigError(f"{cfg.source}: init_checkpoint: {e}") from None


def trained_labels(cfg: TrainConfig, fine_tuned: Optional[Tuple[str, dict]]
                   ) -> Optional[SavedReader]:
    """eval_only of a fine-tuned folder of this kind: the reader that gives its task.json's
    labels (the order of the model's outputs) and reads the data with the task's reader; else
    None (build_task's own reader)."""
    if fine_tuned is None:
        return None
    folder, record = fine_tuned
    if record["kind"] != cfg.kind or kind_class(cfg.kind).builds_model:
        return None
    from ernie_doc.kinds.base import load_reader
    return SavedReader(record["labels"], cfg.task, load_reader(cfg.task), folder)


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
    spm_dir = None
    if task.builds_model:   # the language model: its own model and token streams
        check_memory(run, *task.memory_plan())
        paddle.seed(cfg.seed)   # the same initial weights on every rank
        run.model = task.build_model()
        run.train, run.evaluated = task.build_splits(rank, world)
        run.summary = task.describe(device, world)
    else:
        spm_dir = prepare_documents(run)
    run.summary += notes
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
    return [math.ceil(train.num_steps(e) / cfg.grad_accum_steps) for e in range(cfg.epochs)]


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


# -- document tasks -----------------------------------------------------------------------------
def prepare_documents(run: PreparedRun) -> Optional[str]:
    """A document task's tokenizer, ERNIE-Doc model and splits into `run` (its summary
    too) → the directory of a freshly trained SentencePiece model, or None."""
    cfg, task = run.cfg, run.task
    names = []
    train = [] if task.streaming or cfg.eval_only else ["train"]
    for split in train + list(cfg.eval_splits) + list(cfg.test_splits):
        if split not in names:
            names.append(split)
    docs = {split: task.read(split) for split in names}
    run.tokenizer, special, spm_dir = choose_tokenizer(
        run, docs.get("train", docs[names[0]] if cfg.eval_only else None))
    run.special = special
    run.model = build_model(run, special)
    config = run.model.config
    stride = setup_reading(run, special)
    group = task.group_size
    train_rows, eval_rows = batch_rows(cfg, group), batch_rows(cfg, group, evaluation=True)
    notes, splits = [], []

    def document_split(name, split_docs, passes, rows, shuffle):
        return DocumentSplit(name, split_docs, passes, group, rows, cfg.max_seq_len,
                             special["pad"], run.rank, run.world, cfg.seed, shuffle)

    for name, split_docs in docs.items():
        passes = []   # per document: its reading passes (skim, then retrospective) as steps
        task.take_cuts()   # count this split's cut documents alone
        for i, doc in enumerate(split_docs):
            try:
                steps = task.document_segments(doc, i, run.tokenizer)
            except DataError as e:
                raise DataError(f"split {name!r}: {e}") from None
            passes.append(reading_passes(steps, cfg.retro_feed, cfg.train_skim))
        rows = train_rows if name == "train" else eval_rows
        if name == "train" and not cfg.eval_only:
            run.train = document_split(name, split_docs, passes, train_rows, cfg.shuffle)
        if name in cfg.eval_splits or name in cfg.test_splits:   # evaluation reads in order
            run.evaluated[name] = document_split(name, split_docs, passes, eval_rows, False)
        splits.append(run.evaluated[name] if name in run.evaluated else run.train)
        notes += label_notes(name, split_docs, len(task.labels))
        notes += length_notes(splits[-1], rows // group, run.world, task.take_cuts(),
                              cfg.max_doc_tokens)
    if task.streaming and not cfg.eval_only:
        run.train = task.train_stream(run.rank, run.world, cfg.batch_size, cfg.max_seq_len,
                                      special["pad"], cfg.seed)
        splits.append(run.train)
    labels = f"{len(task.labels)} labels; " if task.labels else ""
    reads = ("no training" if cfg.eval_only else "streamed" if task.streaming else
             f"{sum(run.train.lengths)} training segment reads per epoch")
    run.summary = [f"task {cfg.task} ({cfg.kind}): {labels}"
                   + ", ".join(s.describe() for s in splits),
                   f"model: L={config.num_hidden_layers} H={config.hidden_size} "
                   f"vocab={config.vocab_size} T={cfg.max_seq_len} M={config.memory_len} "
                   f"stride={stride} recurrence={config.recurrence} "
                   f"retro_feed={cfg.retro_feed} on {run.device} x{run.world}; {reads}"] + notes
    return spm_dir


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


LONG_DOCUMENT_READS = 100   # below this, one long document is no concern


def length_notes(split: DocumentSplit, slots: int, world: int, cuts, max_doc_tokens) \
        -> List[str]:
    """Log lines on a split's longest documents (they bound an epoch's steps from below) and
    on the documents max_doc_tokens cut short."""
    lengths = np.asarray(split.lengths)
    if not len(lengths):
        return []
    order = np.argsort(-lengths, kind="stable")[:3]
    top = ", ".join(f"{split.docs[i].doc_id} {lengths[i]:,}" for i in order)
    notes = [f"{split.name}: longest documents (segment reads): {top}; median "
             f"{int(np.median(lengths)):,}"]
    shared = math.ceil(lengths.sum() / max(1, slots * world))   # if rows balanced
    longest = int(lengths.max())
    if longest > 2 * shared and longest >= LONG_DOCUMENT_READS:
        notes.append(f"WARNING {split.name}: document {split.docs[order[0]].doc_id} alone "
                     f"takes {longest:,} segment reads, so an epoch needs at least "
                     f"{longest:,} steps (its rows would need {shared:,}); max_doc_tokens "
                     "caps a document's length")
    if len(cuts):
        notes.append(f"{split.name}: {cuts.describe(max_doc_tokens)}")
    return notes


# -- resume and OUTPUT_DIR ----------------------------------------------------------------------
def read_resume_state(run: PreparedRun) -> tuple:
    """--resume: the latest checkpoint checked (weights restored) and logs checked, before any
    write → (path, trainer state, this rank's arrays, optimizer state)."""
    from ernie_doc.training.runlog import check_run_logs
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
    from ernie_doc.run_config import load_yaml
    cfg, step = run.cfg, state["step"]
    saved = load_yaml(os.path.join(run.out, RUN_CONFIG))
    changed = [k for k in LIMITS if k in saved and saved[k] != getattr(cfg, k)]
    if changed and run.total_steps > step:
        return state["total_steps"]
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
        from ernie_doc.run_config import dump_yaml, load_yaml
        assert run.given is not None   # prepare() keeps it
        if not run.resume:
            outdir.write_text(run.out, RUN_CONFIG, dump_yaml(run.given.as_dict()))
        elif run.extends is not None:
            values = load_yaml(os.path.join(run.out, RUN_CONFIG))
            values.update({k: getattr(run.given, k) for k in LIMITS})
            outdir.write_text(run.out, RUN_CONFIG, dump_yaml(values))
        outdir.claim(run.out, "train.log")   # setup_logging opens it next
    dist.barrier()
