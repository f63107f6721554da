"""An ERNIE-Doc head's run (DocumentTask's read_inputs, build_model, build_splits, load_saved):
the tokenizer (choose_tokenizer), the head (build_head, its memory estimate first: check_memory,
which the language model's build_model calls too), the reading set up for it (setup_reading)
and the documents as splits (document_splits). `run`: an assemble.Assembly."""
import contextlib
import logging
import math
import os
import shutil
import tempfile
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import paddle

from ernie_doc import resources
from ernie_doc.checkpoint import io
from ernie_doc.config import ErnieDocConfig
from ernie_doc.data.segment import reading_passes
from ernie_doc.data.splits import DocumentSplit, Split
from ernie_doc.errors import ConfigError, DataError, HubError, SegmenterError, UntrainedHead
from ernie_doc.hub import is_released, resolve
from ernie_doc.kinds.folders import missing_key
from ernie_doc.tokenization import load_tokenizer
from ernie_doc.tokenization.spm import train
from ernie_doc.utils import clip

logger = logging.getLogger("ernie_doc.train")   # a run's log (training.runlog sets it up)
MemoryPlan = Tuple[Callable[[int], paddle.nn.Layer], int, int, int, int, int]


def reading_stride(cfg: Any, config: ErnieDocConfig) -> int:
    """How far apart a document's windows start: `stride`, default the model's memory_len
    (official); ConfigError when max_seq_len exceeds the model's positions or that is 0.
    `ernie-doc plan` checks a config by it too."""
    if cfg.max_seq_len > config.max_position_embeddings:
        raise ConfigError(f"{cfg.source}: max_seq_len {cfg.max_seq_len} exceeds the model's "
                          f"max_position_embeddings {config.max_position_embeddings}")
    stride = cfg.stride or config.memory_len
    if not stride:
        raise ConfigError(f"{cfg.source}: stride: the model's memory_len is 0, so the "
                          "default window advance (stride = memory_len) is 0; give stride")
    return stride


def setup_reading(run: Any) -> int:
    """Set the task's segmenter up for the model (window max_seq_len, `stride` default the
    memory_len), checking batch sizes hold whole examples → the stride."""
    cfg, task, config = run.cfg, run.task, run.model.config
    stride = reading_stride(cfg, config)
    try:
        task.setup(run.special, cfg.max_seq_len, stride, run.tokenizer)
    except ValueError as e:   # the segmenter's limits (no room for tokens ...) name no key
        if isinstance(e, (ConfigError, DataError)) and not isinstance(e, SegmenterError):
            raise   # the kind's own error names the run's config already
        raise ConfigError(f"{cfg.source}: max_seq_len {cfg.max_seq_len}: {e}") from None
    group = task.group_size
    for key in ("batch_size", "eval_batch_size"):
        if cfg.batch_unit == "rows" and getattr(cfg, key) and getattr(cfg, key) % group:
            raise ConfigError(f"{cfg.source}: {key} {getattr(cfg, key)} must be a multiple of "
                              f"{group} (rows per example of task kind {cfg.kind!r}; "
                              f"batch_unit: rows)")
    return getattr(task.segmenter, "stride", stride)   # a segmenter may fix its own


def choose_tokenizer(run: Any, train_docs: Optional[Sequence]) -> Tuple[object, Dict[str, int],
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
            raise missing_key(cfg.source, cfg.task, "tokenizer",
                              f"model {cfg.model!r} is not a released model and there is no "
                              f"init_checkpoint to take one from: a tokenizer directory, a "
                              f"released name such as ernie-doc-base-en, or train "
                              f"(SentencePiece on the train split)")
    try:
        tokenizer = load_tokenizer(source)
    except (FileNotFoundError, ValueError) as e:   # TokenizerError, DataError included
        raise ConfigError(f"{cfg.source}: tokenizer: {e}") from None
    special: Dict[str, Any] = {"cls": tokenizer.cls_token_id, "sep": tokenizer.sep_token_id,
                               "pad": tokenizer.pad_token_id}
    missing = [k for k, v in special.items() if v is None]
    if missing:
        raise ConfigError(f"{cfg.source}: tokenizer {source}: no {missing} token")
    return tokenizer, special, spm_dir


def train_spm(run: Any, train_docs: Optional[Sequence]) -> Optional[str]:
    """SentencePiece on the train split (for from-scratch runs), in a temporary directory
    → that directory, or None when resuming a run that already has one."""
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


def vocabulary_overrides(run: Any, special: Dict[str, int]) -> Dict[str, int]:
    """The from-scratch model's vocab_size and pad_token_id (the tokenizer's); model_overrides
    may ask for a larger table, never a smaller one or another padding id."""
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


def check_memory(run: Any, plan: MemoryPlan, recompute: bool = False) -> None:
    """Refuse (ConfigError) a run whose estimated memory exceeds the device's, before the model
    is built; `plan`: the kind's memory_plan. Eval-only runs count no gradients; `recompute`:
    the training activations are recomputed in backward."""
    cfg = run.cfg
    build, layers, hidden, heads, tokens, memory_len = plan
    if cfg.eval_only and run.eval_rows:   # the batch rows a prediction asked for
        rows, words = run.eval_rows, f"batch_size {run.eval_rows}"
    else:
        key = "eval_batch_size" if cfg.eval_only and cfg.eval_batch_size else "batch_size"
        rows = run.batch_rows(cfg.eval_only)
        words = _batch_words(key, getattr(cfg, key), rows)
    params = resources.parameter_count(build, layers)
    parts = resources.training_parts(params, layers, rows, tokens, memory_len, hidden,
                                     heads, training=not cfg.eval_only, recompute=recompute)
    resources.check_fits(parts, f"{cfg.source}: {params:,} parameters, {words}, {tokens} "
                                f"tokens per row", run.device)
    eval_rows = run.batch_rows(evaluation=True)
    if not cfg.eval_only and cfg.eval_batch_size and eval_rows > rows:
        parts = resources.training_parts(params, layers, eval_rows, tokens, memory_len, hidden,
                                         heads, training=False)
        parts["gradients + Adam moments"] = 3 * parts["weights"]   # kept while evaluating
        words = _batch_words("eval_batch_size", cfg.eval_batch_size, eval_rows)
        resources.check_fits(parts, f"{cfg.source}: {params:,} parameters, {words}, {tokens} "
                                    f"tokens per row", run.device)


def _batch_words(key: str, size: int, rows: int) -> str:
    """The batch in a message, e.g. "batch_size 6 (24 rows)": the rows where they differ."""
    return f"{key} {size}" + (f" ({rows} rows)" if rows != size else "")


def head_memory_plan(task: Any, config: ErnieDocConfig, tokens: int) -> MemoryPlan:
    """DocumentTask.memory_plan: `task`'s ERNIE-Doc head over `config` with rows of `tokens`
    tokens; the builder makes the head with n encoder layers."""
    head = task.head_class
    memory = 0 if config.recurrence == "none" else config.memory_len
    return (lambda n: head(config.replace(num_hidden_layers=n), **task.model_kwargs()),
            config.num_hidden_layers, config.hidden_size, config.num_attention_heads, tokens,
            memory)


def check_head_memory(run: Any, config: ErnieDocConfig) -> None:
    """check_memory for the task's ERNIE-Doc head over `config` (its encoder's layers)."""
    check_memory(run, head_memory_plan(run.task, config, run.cfg.max_seq_len),
                 recompute=bool(run.cfg.recompute))


def checkpoint_config(cfg: Any, overrides: Dict[str, Any]) -> Optional[ErnieDocConfig]:
    """init_checkpoint's model config with `overrides`, read from its config file alone
    (no tensor is loaded), or None when it has none (from_pretrained then says so)."""
    _, _, path = io.detect_format(cfg.init_checkpoint)
    if path is None:
        return None
    values, _ = io.read_config_file(path)
    return ErnieDocConfig.from_dict(values, source=path).replace(**overrides)


@contextlib.contextmanager
def _loader_line_held(held: bool):
    """While loading a checkpoint: the loader's "loaded N tensors" line dropped when `held`
    (the run log reports it instead)."""
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


def reading_record(cfg: Any, special: Dict[str, int]) -> Dict[str, Any]:
    """The model config values that record how this run reads a segment, saved in its
    config.json: whether twice (the retrospective feed), and the [CLS] id found at
    cls_token_idx (modeling/reading.py checks a plain call against both)."""
    return {"retro_feed": bool(cfg.retro_feed), "cls_token_id": special.get("cls")}


def build_head(run: Any) -> paddle.nn.Layer:
    """The task's ERNIE-Doc head: from init_checkpoint, or new from the `model` preset or
    config with the tokenizer's vocabulary; the memory estimate is checked first."""
    cfg, task, special = run.cfg, run.task, run.special
    head = task.head_class
    overrides = dict(task.model_config_overrides())
    overrides.update(reading_record(cfg, special))
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
        # a run's own log prints the whole load report: the loader's first line is held back
        # then, so it is not printed twice
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
    ids = task.id_vocabulary()   # a pre-tokenized task's ids: [0, ids[1])
    if ids is not None and ids[1] > vocab:
        raise ConfigError(f"{cfg.source}: task {cfg.task}'s token ids reach {ids[1] - 1} but "
                          f"the model's vocabulary ({cfg.init_checkpoint or cfg.model}) has "
                          f"{vocab}: a model of another vocabulary")
    model.ernie_doc.recompute = cfg.recompute
    return model


def document_splits(run: Any, docs: Dict[str, list]
                    ) -> Tuple[Optional[Split], Dict[str, Split], List[str]]:
    """The task's reading set up for the built model, and the documents `docs` read as
    splits → (the train split or None, {split: evaluated split}, the run's summary lines)."""
    cfg, task, special = run.cfg, run.task, run.special
    config = run.model.config
    stride = setup_reading(run)
    group = task.group_size
    train_rows, eval_rows = run.batch_rows(), run.batch_rows(evaluation=True)
    notes: List[str] = []
    splits: List[Any] = []   # every split read, in order (the summary line lists them)
    train: Any = None
    evaluated: Dict[str, Split] = {}

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
            train = document_split(name, split_docs, passes, train_rows, cfg.shuffle)
        if name in cfg.eval_splits or name in cfg.test_splits:   # evaluation reads in order
            evaluated[name] = document_split(name, split_docs, passes, eval_rows, False)
        splits.append(evaluated[name] if name in evaluated else train)
        notes += label_notes(name, split_docs, len(task.labels))
        notes += length_notes(splits[-1], rows // group, run.world, task.take_cuts(),
                              cfg.max_doc_tokens)
    if task.streaming and not cfg.eval_only:
        train = task.train_stream(run.rank, run.world, cfg.batch_size, cfg.max_seq_len,
                                  special["pad"], cfg.seed)
        splits.append(train)
    labels = f"{len(task.labels)} labels; " if task.labels else ""
    reads = ("no training" if cfg.eval_only else "streamed" if task.streaming else
             f"{sum(train.lengths)} training segment reads per epoch")
    summary = [f"task {cfg.task} ({cfg.kind}): {labels}" + ", ".join(s.describe() for s in splits),
               f"model: L={config.num_hidden_layers} H={config.hidden_size} "
               f"vocab={config.vocab_size} T={cfg.max_seq_len} M={config.memory_len} "
               f"stride={stride} recurrence={config.recurrence} "
               f"retro_feed={cfg.retro_feed} on {run.device} x{run.world}; {reads}"]
    return train, evaluated, summary + notes


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


def label_notes(split: str, docs: Sequence, num_labels: int) -> List[str]:
    """The run summary's lines on a split's labels (documents per label), with a WARNING when a
    task of several labels sees one only (accuracy then says nothing)."""
    counts: Dict[str, int] = {}
    for doc in docs:
        label = getattr(doc, "label", None)   # spans, corpora: no labels
        if label is not None:
            counts[str(label)] = counts.get(str(label), 0) + 1
    if not counts:
        return []
    shown = ", ".join(f"{clip(label, 40)}: {n}" for label, n in sorted(counts.items())[:20])
    more = f" (+{len(counts) - 20} more)" if len(counts) > 20 else ""
    notes = [f"split {split}: {len(docs)} documents; labels {shown}{more}"]
    if len(counts) == 1 and num_labels > 1:
        (label, n), = counts.items()
        notes.append(f"WARNING split {split}: all {n} labelled documents have label "
                     f"{clip(label, 40)!r} of {num_labels} labels: its metrics cannot tell "
                     f"the model from a constant")
    return notes


