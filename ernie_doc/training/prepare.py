"""A config → a prepared run: the task, tokenizer, model, splits and a summary, every input
checked before OUTPUT_DIR is written; then OUTPUT_DIR itself.

    prepare(cfg): resolve released names (hub) → build_task → check data, device, OUTPUT_DIR
      (locked for the run) → read splits, choose or train the tokenizer, build the model
      (memory estimate first), cut documents into reading passes → --resume: check the
      checkpoint → create OUTPUT_DIR, write run_config.yaml → PreparedRun for the trainer.

Nothing here trains; the trainer receives the objects and never asks what kind of task
it runs.
"""
import contextlib
import copy
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np
import paddle

from ernie_doc.config import ErnieDocConfig
from ernie_doc.data.segment import reading_passes
from ernie_doc.errors import ConfigError, DataError, UntrainedHead
from ernie_doc.training import distributed as dist
from ernie_doc.training import outdir
from ernie_doc.training import state as ckpt
from ernie_doc.training.amp import AmpSettings, amp_settings, gpu_capability
from ernie_doc.training.run_config import TrainConfig, missing_key
from ernie_doc.training.runlog import logger, setup_logging
from ernie_doc.training.splits import DocumentSplit, Split
from ernie_doc.training.tasks import Task, build_task, label_notes
from ernie_doc.utils import flush_denormals

RUN_CONFIG = "run_config.yaml"


@dataclass
class PreparedRun:
    """What a run needs, built and checked. `model` is the network itself (what is saved);
    `wrapped` is what the loop calls: `model` inside paddle's DataParallel when there are
    several ranks, else `model` itself."""
    cfg: TrainConfig             # released names and URLs resolved to local paths
    given: TrainConfig           # the config as written (run_config.yaml keeps it)
    task: Task
    model: Optional[paddle.nn.Layer] = None
    wrapped: Optional[paddle.nn.Layer] = None
    train: Optional[Split] = None   # None with eval_only
    evaluated: Dict[str, Split] = field(default_factory=dict)   # eval and test splits by name
    total_steps: Optional[int] = None   # optimizer steps of the whole run (None: eval_only)
    resume: bool = False
    resumed: Optional[tuple] = None   # (path, trainer state, arrays, optimizer state)
    extends: Optional[int] = None   # --resume of a finished run: its total_steps then
    tokenizer: object = None
    special: Dict[str, int] = field(default_factory=dict)   # cls / sep / pad ids (documents)
    device: str = "cpu"
    amp: AmpSettings = AmpSettings()   # the run's autocast (fp32: off)
    rank: int = 0
    world: int = 1
    summary: List[str] = field(default_factory=list)
    # rows read at once without gradients (predict's batch size): what the memory estimate
    # counts for eval_only; None: eval_batch_size, else batch_size
    eval_rows: Optional[int] = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def out(self) -> str:
        return self.cfg.output_dir


def prepare(cfg: TrainConfig, resume: bool = False) -> PreparedRun:
    """Build and check everything a run needs, then create OUTPUT_DIR (see the module doc).
    Raises ConfigError / DataError / CheckpointError naming the key or file at fault, before
    anything is written."""
    if resume and cfg.eval_only:
        raise ConfigError(f"{cfg.source}: eval_only: nothing to resume")
    given, cfg = cfg, resolve_inputs(cfg)
    task = build_task(cfg)
    reported = tuple(task.metric_names) + ("loss",)
    if cfg.main_metric is not None and cfg.main_metric not in reported:
        raise ConfigError(f"{cfg.source}: main_metric {cfg.main_metric!r}: kind "
                          f"{cfg.kind!r} reports {', '.join(reported)}")
    rank, world = dist.rank(), dist.world_size()
    if task.streaming:   # before any collective call: bad data fails on every rank
        task.check_data(world)
    device = dist.init(cfg.device)
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
    check = dict(inputs=input_paths(cfg), resume=resume, marker=RUN_CONFIG,
                 overwrite=bool(cfg.get("overwrite_output_dir")), source=cfg.source)
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
        return _prepare_locked(cfg, given, task, resume, rank, world, device, amp)
    except BaseException as e:
        if rank == 0:
            _abandon(cfg.output_dir, created)
        # a signal from here on (training.trainer.Interrupted) may find run_config.yaml
        # written: its message reads OUTPUT_DIR (checked, so this run's or the one resumed)
        if isinstance(e, KeyboardInterrupt) and getattr(e, "output_dir", False) is None:
            e.output_dir = cfg.output_dir
        raise


def _abandon(output_dir: str, created: bool) -> None:
    """A run refused or failed before it started: its lock goes, and so does OUTPUT_DIR if
    this run created it and it is still empty."""
    outdir.release_output_dir(output_dir)
    if created:
        with contextlib.suppress(OSError):
            os.rmdir(output_dir)


def _prepare_locked(cfg: TrainConfig, given: TrainConfig, task: Task, resume: bool,
                    rank: int, world: int, device: str, amp: AmpSettings) -> PreparedRun:
    """prepare, once OUTPUT_DIR is checked (and locked by the main process)."""
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


def count_steps(cfg: TrainConfig, train: Split) -> int:
    """Optimizer steps of the run: max_steps for a stream, else every epoch's micro-steps
    over grad_accum_steps (an epoch's last partial step counts), capped by max_steps."""
    if train.endless:
        return cfg.max_steps
    total = sum(math.ceil(train.num_steps(e) / cfg.grad_accum_steps)
                for e in range(cfg.epochs))
    return min(total, cfg.max_steps) if cfg.max_steps else total


# -- inputs -------------------------------------------------------------------------------------
def resolve_inputs(cfg: TrainConfig) -> TrainConfig:
    """`cfg` with `init_checkpoint`, `tokenizer` and a URL or archive `model` replaced by
    local paths (ernie_doc.hub.resolve: a released name or URL is fetched into the cache
    once, by one process of a distributed job, and verified). A released name as `model`
    stays a config preset: it names an architecture, not weights."""
    from ernie_doc.errors import HubError
    from ernie_doc.hub import is_url, resolve
    from ernie_doc.hub.archive import is_archive
    resolved = copy.copy(cfg)
    # `~/x` means the home's x, as in a shell: expanded once, here, so that the checks of
    # OUTPUT_DIR and every write into it see the same directory
    if isinstance(cfg.output_dir, str):
        resolved["output_dir"] = os.path.expanduser(cfg.output_dir)
    try:
        if cfg.init_checkpoint:
            resolved["init_checkpoint"] = resolve(cfg.init_checkpoint, "model",
                                                  cfg.model_source)
        if cfg.tokenizer and cfg.tokenizer != "train":
            resolved["tokenizer"] = resolve(cfg.tokenizer, "tokenizer")
        if isinstance(cfg.model, str) and (is_url(cfg.model) or (
                os.path.isfile(cfg.model) and is_archive(cfg.model))):
            resolved["model"] = resolve(cfg.model, "model")
    except HubError as e:
        raise ConfigError(f"{cfg.source}: {e}") from None
    return resolved


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
    eval_rows = cfg.eval_batch_size or cfg.batch_size
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
        rows = cfg.batch_size if name == "train" else eval_rows
        if name == "train" and not cfg.eval_only:
            run.train = document_split(name, split_docs, passes, cfg.batch_size, cfg.shuffle)
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


def setup_reading(run: PreparedRun, special: Dict[str, int]) -> int:
    """Set the task's segmenter up for the model (window T = max_seq_len, advance `stride`,
    default the model's memory_len) and check the batch sizes hold whole examples → the
    stride. Training, evaluation and predict (ernie_doc.pipeline) read documents alike."""
    cfg, task, config = run.cfg, run.task, run.model.config
    if cfg.max_seq_len > config.max_position_embeddings:
        raise ConfigError(f"{cfg.source}: max_seq_len {cfg.max_seq_len} exceeds the model's "
                          f"max_position_embeddings {config.max_position_embeddings}")
    stride = cfg.stride or config.memory_len
    if not stride:
        raise ConfigError(f"{cfg.source}: stride: the model's memory_len is 0, so the "
                          "default window advance (stride = memory_len) is 0; give stride")
    try:
        task.setup(special, cfg.max_seq_len, stride, run.tokenizer)
    except ValueError as e:   # the segmenter's limits (no room for tokens ...)
        if isinstance(e, (ConfigError, DataError)):
            raise
        raise ConfigError(f"{cfg.source}: max_seq_len {cfg.max_seq_len}: {e}") from None
    group = task.group_size
    for key in ("batch_size", "eval_batch_size"):
        if cfg[key] and cfg[key] % group:
            raise ConfigError(f"{cfg.source}: {key} {cfg[key]} must be a multiple of "
                              f"{group} (rows per example of task kind {cfg.kind!r})")
    return getattr(task.segmenter, "stride", stride)   # a segmenter may fix its own


def task_record(run: PreparedRun) -> dict:
    """What a saved model needs besides its weights and tokenizer to read new documents as
    this run did (ernie_doc.pipeline): the config as written and the label names. Saved as
    task.json in best/ and final/."""
    config = dict(run.given)
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
    """Log lines on a split's longest documents (segment reads, both passes), so that one
    huge document (a 5 MB line) is seen up front: a row reads one document at a time, so
    the longest document alone sets a lower bound on an epoch's steps. Also the documents
    that max_doc_tokens cut short."""
    lengths = np.asarray(split.lengths)
    if not len(lengths):
        return []
    order = np.argsort(-lengths, kind="stable")[:3]
    longest = ", ".join(f"{split.docs[i].doc_id} {lengths[i]:,}" for i in order)
    notes = [f"{split.name}: longest documents (segment reads): {longest}; median "
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


def choose_tokenizer(run: PreparedRun, train_docs) -> Tuple[object, Dict[str, int],
                                                            Optional[str]]:
    """→ (tokenizer or None, {cls, sep, pad} ids, dir of a freshly trained SPM or None)."""
    cfg, task = run.cfg, run.task
    vocabulary = task.id_vocabulary()
    if train_docs is not None and all(d.ids is not None for d in train_docs) \
            and vocabulary is not None:   # pre-tokenized: the reader's own ids
        if cfg.tokenizer:
            raise ConfigError(f"{cfg.source}: tokenizer: task {cfg.task} reads token ids, "
                              f"not text; it uses no tokenizer (got {cfg.tokenizer!r})")
        return None, vocabulary[0], None
    from ernie_doc.errors import HubError
    from ernie_doc.hub import is_released, resolve
    from ernie_doc.tokenization import load_tokenizer
    spm_dir = None
    if cfg.tokenizer == "train":
        spm_dir = train_spm(run, train_docs)
        source = os.path.join(spm_dir or os.path.join(run.out, "tokenizer"), "spm.model")
    else:
        source = cfg.tokenizer or cfg.init_checkpoint
        if not source and is_released(cfg.model):   # the released model's tokenizer
            try:
                source = resolve(cfg.model, "tokenizer")
            except HubError as e:
                raise ConfigError(f"{cfg.source}: tokenizer (of model {cfg.model}): "
                                  f"{e}") from None
        if not source:
            raise missing_key(cfg, "tokenizer", f"model {cfg.model!r} is not a released "
                              f"model and there is no init_checkpoint to take one from: "
                              f"a tokenizer directory, a released name such as "
                              f"ernie-doc-base-en, or train (SentencePiece on the train "
                              f"split)")
    try:
        tokenizer = load_tokenizer(source)
    except (FileNotFoundError, ValueError) as e:   # TokenizerError, DataError included
        raise ConfigError(f"{cfg.source}: tokenizer: {e}") from None
    special = {"cls": tokenizer.cls_token_id, "sep": tokenizer.sep_token_id,
               "pad": tokenizer.pad_token_id}
    missing = [k for k, v in special.items() if v is None]
    if missing:
        raise ConfigError(f"{cfg.source}: tokenizer {source}: no {missing} token")
    return tokenizer, special, spm_dir


def train_spm(run: PreparedRun, train_docs) -> Optional[str]:
    """SentencePiece on the train split (for from-scratch runs), in a temporary directory
    → that directory, or None when resuming a run that already has one."""
    from ernie_doc.tokenization.spm import train
    cfg, task = run.cfg, run.task
    if run.resume and os.path.isfile(os.path.join(run.out, "tokenizer", "spm.model")):
        return None
    if train_docs is None:   # a streamed corpus: its first documents
        train_docs = task.tokenizer_sample()
    tmp = tempfile.mkdtemp(prefix="ernie-doc-spm-")
    corpus = os.path.join(tmp, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        for doc in train_docs:
            for text in task.tokenizer_texts(doc):
                f.write(" ".join(text.split()) + "\n")
    logger.info(f"training a SentencePiece tokenizer ({cfg.tokenizer_vocab_size} "
                "pieces) on the train split")
    try:
        train(corpus, os.path.join(tmp, "spm"), cfg.tokenizer_vocab_size,
              extra_options={"max_sentence_length": 1 << 20})
    except RuntimeError as e:   # e.g. a vocabulary larger than the corpus allows
        shutil.rmtree(tmp, ignore_errors=True)
        reason = str(e).strip().splitlines()[-1].split("] ")[-1]
        raise ConfigError(f"{cfg.source}: tokenizer_vocab_size "
                          f"{cfg.tokenizer_vocab_size}: SentencePiece training on the "
                          f"train split failed: {reason}") from None
    return tmp


def vocabulary_overrides(run: PreparedRun, special: Dict[str, int]) -> Dict[str, int]:
    """The from-scratch model's vocab_size and pad_token_id: the tokenizer's (or the
    pre-tokenized reader's). model_overrides may ask for a larger table, never a smaller
    one or another padding id."""
    cfg = run.cfg
    vocabulary = run.task.id_vocabulary()
    if run.tokenizer is not None:
        size = len(run.tokenizer)
    elif vocabulary is not None:
        size = vocabulary[1]
    else:
        return {}
    given = cfg.model_overrides
    if "vocab_size" in given:
        if not isinstance(given["vocab_size"], int) or given["vocab_size"] < size:
            raise ConfigError(f"{cfg.source}: model_overrides.vocab_size "
                              f"{given['vocab_size']!r} is smaller than the {size} ids the "
                              "tokenizer produces")
        if given["vocab_size"] > size:
            logger.info(f"model_overrides.vocab_size {given['vocab_size']}: keeping it "
                        f"(the tokenizer needs {size})")
        size = given["vocab_size"]
    if "pad_token_id" in given and given["pad_token_id"] != special["pad"]:
        raise ConfigError(f"{cfg.source}: model_overrides.pad_token_id "
                          f"{given['pad_token_id']!r} is not the tokenizer's [PAD] id "
                          f"{special['pad']}")
    return {"vocab_size": size, "pad_token_id": special["pad"]}


def check_memory(run: PreparedRun, build, layers: int, hidden: int, heads: int, tokens: int,
                 memory_len: int) -> None:
    """Refuse (ConfigError) a run whose estimated memory (ernie_doc.resources) exceeds
    what this device has, before the model is built: `build(n)` makes the model with n
    layers, for resources.parameter_count (under paddle.LazyGuard, which allocates nothing).
    An eval_only run (and predict) counts no gradients and rows of eval_batch_size; a
    training run's evaluations, eval_batch_size rows beside the training state."""
    from ernie_doc import resources
    cfg = run.cfg
    rows = ((run.eval_rows or cfg.eval_batch_size or cfg.batch_size) if cfg.eval_only
            else cfg.batch_size)
    params = resources.parameter_count(build, layers)
    parts = resources.training_parts(params, layers, rows, tokens, memory_len, hidden,
                                     heads, training=not cfg.eval_only)
    resources.check_fits(parts, f"{cfg.source}: {params:,} parameters, batch_size {rows}, "
                                f"{tokens} tokens per row", run.device)
    if not cfg.eval_only and (cfg.eval_batch_size or 0) > rows:
        parts = resources.training_parts(params, layers, cfg.eval_batch_size, tokens,
                                         memory_len, hidden, heads, training=False)
        parts["gradients + Adam moments"] = 3 * parts["weights"]   # kept while evaluating
        resources.check_fits(parts, f"{cfg.source}: {params:,} parameters, eval_batch_size "
                                    f"{cfg.eval_batch_size}, {tokens} tokens per row",
                             run.device)


def check_head_memory(run: PreparedRun, config: ErnieDocConfig) -> None:
    """check_memory for the task's ERNIE-Doc head over `config` (its encoder's layers)."""
    head, task = run.task.head_class, run.task
    memory = 0 if config.recurrence == "none" else config.memory_len
    check_memory(run, lambda n: head(config.replace(num_hidden_layers=n), **task.model_kwargs()),
                 config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
                 run.cfg.max_seq_len, memory)


def checkpoint_config(cfg: TrainConfig, overrides) -> Optional[ErnieDocConfig]:
    """init_checkpoint's model config with `overrides`, read from its config file alone
    (no tensor is loaded), or None when it has none (from_pretrained then says so)."""
    from ernie_doc.checkpoint import io
    _, _, path = io.detect_format(cfg.init_checkpoint)
    if path is None:
        return None
    values, _ = io.read_config_file(path)
    return ErnieDocConfig.from_dict(values, source=path).replace(**overrides)


@contextlib.contextmanager
def _loader_line_held(held: bool):
    """While loading a checkpoint: the loader's "loaded N tensors" line dropped when `held`
    (the run log reports it instead)."""
    import logging
    if not held:
        yield
        return

    def drop(record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.INFO and
                    record.getMessage().startswith("loaded "))
    loader = logging.getLogger("ernie_doc.checkpoint")
    loader.addFilter(drop)
    try:
        yield
    finally:
        loader.removeFilter(drop)


def build_model(run: PreparedRun, special: Dict[str, int]) -> paddle.nn.Layer:
    """The task's ERNIE-Doc head: from init_checkpoint, or new from the `model` preset or
    config with the tokenizer's vocabulary; the memory estimate is checked first."""
    cfg, task = run.cfg, run.task
    head = task.head_class
    overrides = dict(task.model_config_overrides())
    overrides.update(cfg.model_overrides)
    try:
        if cfg.init_checkpoint:
            config = checkpoint_config(cfg, overrides)
        else:
            overrides.update(vocabulary_overrides(run, special))
            config = ErnieDocConfig.from_any(cfg.model, **overrides)
    except ConfigError as e:   # name the keys the bad value can come from
        keys = "init_checkpoint" if cfg.init_checkpoint else f"model {cfg.model!r}"
        raise ConfigError(f"{cfg.source}: {keys} with model_overrides: {e}") from None
    if config is not None:
        check_head_memory(run, config)
    paddle.seed(cfg.seed)   # the same initial weights on every rank
    if cfg.init_checkpoint:
        # the loader logs the report's first line ("loaded N tensors ...", logger
        # ernie_doc.checkpoint); a run's own log (setup_logging: console and train.log) logs
        # the whole report, so the loader's copy is held back then (a tool's notes handler
        # would print it a second time); without a run log the loader's line is the one
        with _loader_line_held(bool(logger.handlers)):
            model = head.from_pretrained(cfg.init_checkpoint, **task.model_kwargs(),
                                         allow_partial=cfg.allow_partial_checkpoint,
                                         **overrides)
        lines = model.load_report.summary().splitlines()
        for line in lines if logger.handlers else lines[1:]:
            logger.info(line)
        missing, other = model.load_report.missing, model.load_report.other_head
        if cfg.eval_only and (missing or other):   # a fresh head's predictions are noise
            raise UntrainedHead(f"{cfg.source}: eval_only: {cfg.init_checkpoint} lacks "
                                f"{len(missing)} tensors of {head.__name__} ("
                                f"{', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}"
                                "): there is no trained model to evaluate",
                                str(cfg.init_checkpoint), head.__name__, list(missing), other)
    else:
        model = head(config, **task.model_kwargs())
    vocab = model.config.vocab_size
    if run.tokenizer is not None and len(run.tokenizer) > vocab:
        raise ConfigError(f"tokenizer has {len(run.tokenizer)} tokens but the model's "
                          f"vocabulary has {vocab}")
    model.ernie_doc.recompute = cfg.recompute
    return model


# -- resume and OUTPUT_DIR ----------------------------------------------------------------------
def read_resume_state(run: PreparedRun) -> tuple:
    """--resume: the latest checkpoint read and checked against the model (its weights
    restored) and the run's logs checked, before the run writes anything → (path,
    trainer state, this rank's arrays, optimizer state)."""
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
    """--resume of a run that finished (trainer state at its last step): allowed only when
    --set raised max_steps or epochs (run_config.yaml holds the values it ran with) so that
    it has steps left; else ConfigError naming the keys → its total_steps then."""
    from ernie_doc.training.run_config import load_yaml
    cfg, step = run.cfg, state["step"]
    saved = load_yaml(os.path.join(run.out, RUN_CONFIG))
    changed = [k for k in LIMITS if k in saved and saved[k] != cfg[k]]
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
    """OUTPUT_DIR with its manifest (training.outdir: every entry listed before it is
    created), run_config.yaml and a freshly trained tokenizer; with overwrite_output_dir, the
    entries a previous run's manifest lists go first (nothing else). A resumed run that
    raised max_steps or epochs records them in run_config.yaml."""
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
        from ernie_doc.training.run_config import dump_yaml, load_yaml
        if not run.resume:
            outdir.write_text(run.out, RUN_CONFIG, dump_yaml(dict(run.given)))
        elif run.extends is not None:
            values = load_yaml(os.path.join(run.out, RUN_CONFIG))
            values.update({k: run.given[k] for k in LIMITS})
            outdir.write_text(run.out, RUN_CONFIG, dump_yaml(values))
        outdir.claim(run.out, "train.log")   # setup_logging opens it next
    dist.barrier()
