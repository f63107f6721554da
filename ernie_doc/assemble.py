"""A config or a saved run → the task kind, tokenizer and model that read its documents: the
one place that assembles them, for training, evaluation and prediction.

    resolve_inputs(cfg)          released names / URLs → local paths (ernie_doc.hub)
    choose_tokenizer(run, docs)  the tokenizer: given, released, the checkpoint's, or trained
    build_model(run, special)    the task's ERNIE-Doc head, the memory estimate checked first
    setup_reading(run, special)  the kind's segmenter set up for the model
    saved_run(directory, ...)    a saved model folder (task.json) → all of the above
    read_as_trained(cfg, folder, record)  eval_only of such a folder: the reading settings it
                                 was trained with (trained_reading), but those the user set"""
import contextlib
import copy
import dataclasses
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import paddle

from ernie_doc.config import ErnieDocConfig
from ernie_doc.errors import ConfigError, DataError, UntrainedHead
from ernie_doc.kinds import build_task, kind_class
from ernie_doc.kinds.base import load_reader
from ernie_doc.kinds.folders import missing_key
from ernie_doc.precision import AmpSettings, amp_settings
from ernie_doc.run_config import (DEFAULTS, READING_KEYS, TrainConfig, batch_rows,
                                  config_from_values, is_reading_key, resolved_doc_prediction,
                                  with_values)
from ernie_doc.utils import clip, flush_denormals, set_device

logger = logging.getLogger("ernie_doc.train")   # a run's log (training.runlog sets it up)


@dataclass
class Assembly:
    """A run's task, tokenizer and model, built and checked. `special`: cls / sep / pad ids;
    `eval_rows`: rows read without gradients (None: the batch size); `resume`: --resume."""
    cfg: TrainConfig             # released names and URLs resolved to local paths
    task: Any                    # kinds.base.Task
    tokenizer: Any = None        # a tokenization class's, or the language model's Vocabulary
    special: Dict[str, int] = field(default_factory=dict)
    model: Optional[Any] = None  # a paddle.nn.Layer, or an exported model behind its call
    device: str = "cpu"
    amp: AmpSettings = AmpSettings()   # the run's autocast (fp32: off)
    eval_rows: Optional[int] = None
    resume: bool = False

    @property
    def out(self) -> str:
        return self.cfg.output_dir


def resolve_inputs(cfg: TrainConfig) -> TrainConfig:
    """`cfg` with `init_checkpoint`, `tokenizer` and a URL / archive `model` resolved to local
    paths (ernie_doc.hub.resolve); a released name as `model` stays a config preset."""
    from ernie_doc.errors import HubError
    from ernie_doc.hub import is_url, resolve
    from ernie_doc.hub.archive import is_archive

    # `~/x` means the home's x, as in a shell: expanded once, here, so that the checks of
    # OUTPUT_DIR and every write into it see the same directory
    resolved: Dict[str, Any] = {"output_dir": os.path.expanduser(cfg.output_dir)}
    try:
        if cfg.init_checkpoint:
            resolved["init_checkpoint"] = resolve(cfg.init_checkpoint, "model",
                                                  cfg.model_source)
        if cfg.tokenizer and cfg.tokenizer != "train":
            resolved["tokenizer"] = resolve(cfg.tokenizer, "tokenizer")
        if is_url(cfg.model) or (os.path.isfile(cfg.model) and is_archive(cfg.model)):
            resolved["model"] = resolve(cfg.model, "model")
    except HubError as e:
        raise ConfigError(f"{cfg.source}: {e}") from None
    return dataclasses.replace(cfg, **resolved)


def reading_stride(cfg: TrainConfig, config: ErnieDocConfig) -> int:
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


def setup_reading(run: Assembly, special: Dict[str, int]) -> int:
    """Set the task's segmenter up for the model (window max_seq_len, `stride` default the
    memory_len), checking batch sizes hold whole examples → the stride."""
    cfg, task, config = run.cfg, run.task, run.model.config
    stride = reading_stride(cfg, config)
    try:
        task.setup(special, cfg.max_seq_len, stride, run.tokenizer)
    except ValueError as e:   # the segmenter's limits (no room for tokens ...)
        if isinstance(e, (ConfigError, DataError)):
            raise
        raise ConfigError(f"{cfg.source}: max_seq_len {cfg.max_seq_len}: {e}") from None
    group = task.group_size
    for key in ("batch_size", "eval_batch_size"):
        size = getattr(cfg, key)
        if cfg.batch_unit == "rows" and size and size % group:
            raise ConfigError(f"{cfg.source}: {key} {size} must be a multiple of "
                              f"{group} (rows per example of task kind {cfg.kind!r}; "
                              f"batch_unit: rows)")
    return getattr(task.segmenter, "stride", stride)   # a segmenter may fix its own


def choose_tokenizer(run: Assembly, train_docs) -> Tuple[object, Dict[str, int],
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
            raise missing_key(cfg.source, cfg.task, "tokenizer",
                              f"model {cfg.model!r} is not a released model and there is no "
                              f"init_checkpoint to take one from: a tokenizer directory, a "
                              f"released name such as ernie-doc-base-en, or train "
                              f"(SentencePiece on the train split)")
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


def train_spm(run: Assembly, train_docs) -> Optional[str]:
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


def vocabulary_overrides(run: Assembly, special: Dict[str, int]) -> Dict[str, int]:
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


def check_memory(run: Assembly, build, layers: int, hidden: int, heads: int, tokens: int,
                 memory_len: int, recompute: bool = False) -> None:
    """Refuse (ConfigError) a run whose estimated memory exceeds the device's, before the model
    is built; `build(n)`: the model with n layers. Eval-only runs count no gradients;
    `recompute`: the training activations are recomputed in backward."""
    from ernie_doc import resources
    cfg, group = run.cfg, run.task.group_size
    if cfg.eval_only and run.eval_rows:   # the batch rows a prediction asked for
        rows, words = run.eval_rows, f"batch_size {run.eval_rows}"
    else:
        key = "eval_batch_size" if cfg.eval_only and cfg.eval_batch_size else "batch_size"
        rows = batch_rows(cfg, group, cfg.eval_only)
        words = _batch_words(key, getattr(cfg, key), rows)
    params = resources.parameter_count(build, layers)
    parts = resources.training_parts(params, layers, rows, tokens, memory_len, hidden,
                                     heads, training=not cfg.eval_only, recompute=recompute)
    resources.check_fits(parts, f"{cfg.source}: {params:,} parameters, {words}, {tokens} "
                                f"tokens per row", run.device)
    eval_rows = batch_rows(cfg, group, evaluation=True)
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


def head_memory_plan(task: Any, config: ErnieDocConfig, tokens: int
                     ) -> Tuple[Callable[[int], paddle.nn.Layer], int, int, int, int, int]:
    """(model builder, layers, hidden, heads, tokens per row, memory length) of `task`'s
    ERNIE-Doc head over `config` with rows of `tokens` tokens, for the memory estimate (as
    LanguageModelTask.memory_plan): the builder makes the head with n encoder layers."""
    head = task.head_class
    memory = 0 if config.recurrence == "none" else config.memory_len
    return (lambda n: head(config.replace(num_hidden_layers=n), **task.model_kwargs()),
            config.num_hidden_layers, config.hidden_size, config.num_attention_heads, tokens,
            memory)


def check_head_memory(run: Assembly, config: ErnieDocConfig) -> None:
    """check_memory for the task's ERNIE-Doc head over `config` (its encoder's layers)."""
    check_memory(run, *head_memory_plan(run.task, config, run.cfg.max_seq_len),
                 recompute=bool(run.cfg.recompute))


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


def reading_record(cfg: TrainConfig, special: Dict[str, int]) -> Dict[str, Any]:
    """The model config values that record how this run reads a segment, saved in its
    config.json: whether twice (the retrospective feed), and the [CLS] id found at
    cls_token_idx (modeling/reading.py checks a plain call against both)."""
    return {"retro_feed": bool(cfg.retro_feed), "cls_token_id": special.get("cls")}


def tokenizer_record(cfg: TrainConfig, task: Any, saved: Dict[str, Any]) -> Dict[str, Any]:
    """A saved run's tokenizer_config.json: the tokenizer's own record (`saved`) with
    max_seq_len as model_max_length and, for a kind whose segment a call can lay out from one
    text (the classifier's), that segment, the run's max_doc_tokens and its stride (how far
    apart a document's segments start: segment_batches cuts them so)."""
    record = {k: v for k, v in saved.items()
              if k not in ("segment_layout", "max_doc_tokens", "segment_stride")}
    record["model_max_length"] = cfg.max_seq_len
    layout = task.text_segment_layout()
    if layout is not None:
        record["segment_layout"] = layout
        if cfg.max_doc_tokens:
            record["max_doc_tokens"] = cfg.max_doc_tokens
        record["segment_stride"] = task.segmenter.stride
    return record


def build_model(run: Assembly, special: Dict[str, int]) -> paddle.nn.Layer:
    """The task's ERNIE-Doc head: from init_checkpoint, or new from the `model` preset or
    config with the tokenizer's vocabulary; the memory estimate is checked first."""
    cfg, task = run.cfg, run.task
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


# -- saved runs ---------------------------------------------------------------------------------
class SavedReader:
    """The reader of a saved model's kind: the labels its task.json lists, in the order of the
    model's outputs (output i means labels[i]), whatever a data directory lists (and a
    pre-tokenized task's `id_vocabulary` when its folder is there). Predict reads no documents
    here (its input holds them); eval_only reads them with the data's task reader
    (`documents`), and a label that reader lists and the model was not trained on is a
    DataError naming it (`model`: the saved folder)."""

    def __init__(self, labels: Sequence[str], task: str, documents: Any = None,
                 model: str = ""):
        self.saved, self.documents, self.model = list(labels), documents, model
        self.id_vocabulary = None
        try:
            self.id_vocabulary = getattr(documents or load_reader(task), "id_vocabulary", None)
        except DataError:   # a task folder that is not installed: a text task reads none
            pass

    def labels(self, data_dir, options) -> List[str]:
        listed = getattr(self.documents, "labels", None)   # a reader's optional function
        unknown = [str(x) for x in listed(data_dir, options) if str(x) not in self.saved] \
            if listed else []
        if unknown:
            more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
            raise DataError(f"{data_dir or 'the data'}: label {clip(repr(unknown[0]), 80)}"
                            f"{more} is not one of the {len(self.saved)} labels {self.model} "
                            f"was trained on (its task.json: "
                            f"{clip(', '.join(self.saved), 120)}): the model has no output "
                            f"for it")
        return self.saved

    def read(self, data_dir, split, options):
        if self.documents is None:
            raise DataError("a saved model's task reads its documents from the predict input")
        return self.documents.read(data_dir, split, options)


class OptionsReader:
    """The reader of a saved self-building kind (the language model): its options only."""

    @staticmethod
    def options(given):
        return dict(given)

    def read(self, data_dir, split, options):
        raise DataError("a saved language model reads its documents from the predict input")


def _builds_model(kind: Any) -> bool:
    try:
        return bool(kind_class(kind).builds_model)
    except ValueError:   # config_from_values names the unknown kind
        return False


def saved_run(directory: str, record: Mapping[str, Any], source: str, device: str = "cpu",
              rows: Optional[int] = None,
              load_model: Optional[Callable[[Assembly], Any]] = None) -> Assembly:
    """A saved model folder → its Assembly, nothing written; the memory estimate (`rows` rows) is
    checked first. ConfigError / DataError / CheckpointError / UntrainedHead."""
    given = dict(record["config"])
    # the run's reader options stay, all of them (trained_reading keeps the reading ones)
    given.update({k: v for k, v in trained_reading(record).items() if k != "reader"})
    given.update(init_checkpoint=directory, data_dir="", output_dir="", eval_only=True,
                 device=device)
    own_model = _builds_model(record["kind"])
    cfg = config_from_values(given, source)
    flush_denormals(cfg.flush_denormals)   # as the run trained (CPU speed), every kind
    place = "gpu" if device == "gpu" else "cpu"
    set_device(place)
    if own_model:
        task = build_task(cfg, OptionsReader())
        rows = rows or batch_rows(cfg, task.group_size, evaluation=True)
        model, vocab = task.load_saved(directory, rows, place)
        return Assembly(cfg=cfg, task=task, tokenizer=vocab, model=model, device=device,
                        eval_rows=rows)
    task = build_task(cfg, SavedReader(record["labels"], cfg.task))
    # a model trained with amp on a GPU predicts with its autocast there; on CPU fp32
    amp = amp_settings(cfg.amp, device) if device == "gpu" else AmpSettings()
    run = Assembly(cfg=cfg, task=task, device=device, amp=amp, eval_rows=rows)
    pretokenized = task.id_vocabulary() is not None
    run.tokenizer, run.special, _ = choose_tokenizer(run, [] if pretokenized else None)
    if load_model is not None:
        run.model = load_model(run)
        check_head_memory(run, run.model.config)   # the rows an export will read
    else:
        run.model = build_model(run, run.special)
    setup_reading(run, run.special)
    return run


# -- a fine-tuned folder's reading ---------------------------------------------------------------
def trained_reading(record: Mapping[str, Any]) -> Dict[str, Any]:
    """How the run that saved a folder (its task.json, `record`) read documents: its values of
    READING_KEYS (the default of one it lacks; of `reader`, the reading options it set), with
    the tokenizer the folder's own; a kind that builds its own model reads the model config
    from the folder alone (its saved lm_config.json holds the run's model_overrides), uses
    no tokenizer, and evaluates in the run's eval_batch_size rows."""
    config = record["config"]
    values = {key: copy.deepcopy(config.get(key, DEFAULTS[key]))
              for key in dict.fromkeys(k.split(".")[0] for k in READING_KEYS)}
    values["doc_prediction"] = resolved_doc_prediction(values)
    reader = values["reader"] if isinstance(values["reader"], dict) else {}
    values["reader"] = {k: v for k, v in reader.items() if is_reading_key(f"reader.{k}")}
    if _builds_model(record["kind"]):
        values["model_overrides"] = {}
        del values["tokenizer"]
        # a language model's evaluation cuts the stream into this many rows (Transformer-XL's
        # protocol): another number reads other context and gives another perplexity
        values["eval_batch_size"] = config.get("eval_batch_size") or config.get(
            "batch_size", DEFAULTS["batch_size"])
    else:
        values["tokenizer"] = ""
    return values


def saved_model_config(folder: str, own_model: bool) -> Dict[str, Any]:
    """The model config a saved folder holds (config.json; a language model's lm_config.json)
    as a mapping; {} when it cannot be read (loading the model then says why)."""
    from ernie_doc.errors import ErnieDocError
    try:
        if own_model:
            import dataclasses

            from ernie_doc.lm.model import load_lm_config
            return dataclasses.asdict(load_lm_config(folder))
        from ernie_doc.checkpoint import io
        path = io.detect_format(folder)[2]
        return dict(io.read_config_file(path)[0]) if path else {}
    except (ErnieDocError, OSError):
        return {}


UNSET = object()   # a reader option not set: the reader's default


def _shown(key: str, value: Any) -> str:
    """A setting's value in a log line, as YAML / JSON write it (null, true, "last")."""
    import json
    if key == "tokenizer" and value == "":
        return "the folder's own"
    if value is UNSET:
        return "not set"
    return clip(json.dumps(value, ensure_ascii=False, default=str), 80)


def read_as_trained(cfg: TrainConfig, folder: str, record: Mapping[str, Any]
                    ) -> Tuple[Dict[str, Any], List[str]]:
    """eval_only of a fine-tuned folder (init_checkpoint, or the folder of its weights file),
    whose task.json is `record`: its reading settings (trained_reading), except those the user
    set (`cfg.user_keys`; a map's entries one by one) → (the values to set, at most three log
    lines: `tokenizer: train` read as the folder's own tokenizer, the config's values
    replaced, the user's that differ from the run's)."""
    from ernie_doc.kinds import TASK_FILE
    trained = trained_reading(record)
    if record["kind"] != cfg.kind:   # another kind's options do not apply
        del trained["task_options"]
    if record["task"] != cfg.task:   # nor another task's reader options
        del trained["reader"]
    model = {}   # what a model_overrides entry the run did not set was trained with
    if cfg.model_overrides:
        model = saved_model_config(folder, _builds_model(record["kind"]))
    values: Dict[str, Any] = {}   # the keys to read as the run did, with its values
    lines = []
    if "tokenizer" in trained and cfg.tokenizer == "train":
        # evaluation trains nothing: a new tokenizer's ids are not the ones the model learned
        # (the training command with eval_only=true added must not score 0.5 in silence)
        lines.append(f'eval_only: tokenizer "train" reads with the tokenizer {folder} was '
                     "trained with (the folder's own); evaluation trains none")
        cfg = with_values(cfg, {"tokenizer": ""})
        values["tokenizer"] = ""
    # user-set or not → [(key, the run's value, cfg's)]
    differ: Dict[bool, list] = {True: [], False: []}
    for key, ran in trained.items():
        if isinstance(ran, dict):   # a map: entry by entry
            values[key] = _map_as_trained(cfg, key, ran, model, differ)
            continue
        mine = _user_set(cfg, key)
        if not mine:
            values[key] = ran
        differ[mine] += [] if getattr(cfg, key) == ran else [(key, ran, getattr(cfg, key))]
    where = f"{folder} was trained (its {TASK_FILE})"
    lines += [f"eval_only: reading as {where}, not as {cfg.source} says: " + ", ".join(
        f"{k} {_shown(k, run)} (config {_shown(k, value)})" for k, run, value in differ[False])
    ] if differ[False] else []
    if differ[True]:
        lines.append(f"eval_only: the values given differ from how {where} and are used: "
                     + ", ".join(f"{k} {_shown(k, value)} (trained with {_shown(k, run)})"
                                 for k, run, value in differ[True]))
    return values, lines


def _map_as_trained(cfg: TrainConfig, key: str, ran: Dict[str, Any], model: Dict[str, Any],
                    differ: Dict[bool, list]) -> Dict[str, Any]:
    """read_as_trained for the map `key` (the run's reading entries `ran`) → its value: the
    config's entries that are not reading ones (reader: where the data is), the run's, and
    the user's; `differ` gets the entries that change. A reader option only the run set is
    listed too (the config leaves the reader's default)."""
    given = getattr(cfg, key)
    reading = [e for e in dict.fromkeys([*ran, *given]) if is_reading_key(f"{key}.{e}")]
    mine = {e: given[e] for e in reading if e in given and _user_set(cfg, f"{key}.{e}")}
    value = {e: v for e, v in given.items() if e not in reading}
    value.update({e: ran[e] for e in reading if e in ran})
    value.update(mine)
    for entry in reading:
        if entry in given and entry not in ran and key == "task_options":
            continue   # a task.json from before the option existed: the config's is read
        if entry in given:
            run = ran.get(entry, model.get(entry) if key == "model_overrides" else
                          UNSET if key == "reader" else None)
            differ[entry in mine] += [] if given[entry] == run else [
                (f"{key}.{entry}", run, given[entry])]
        elif key == "reader":
            differ[False].append((f"{key}.{entry}", ran[entry], UNSET))
    return value


def _user_set(cfg: TrainConfig, key: str) -> bool:
    """Whether the user set `key` (dotted: an entry of a map), itself, a map holding it, or
    an entry inside it."""
    parts = key.split(".")
    return any(".".join(parts[:i]) in cfg.user_keys for i in range(1, len(parts) + 1)) or \
        any(k.startswith(key + ".") for k in cfg.user_keys)
