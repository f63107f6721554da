"""What differs between fine-tuning tasks, behind one interface the trainer drives.

A task = a reader (tasks/<name>/reader.py: `labels`, `read`) + a kind, named in its config
(`kind: span`) and looked up in the closed registry of ernie_doc.kinds: the built-in kinds, and
those the task folders register (`hotpotqa`, `keyphrase`); a config never names code to import.
The kind says how a document becomes segments with targets, which head to build, the loss over
the rows that train, what each predicted row contributes, and how a document's rows become a
prediction and metrics."""
import contextlib
import dataclasses
import importlib
import zlib
from types import ModuleType
from typing import (Any, Callable, Collection, ContextManager, Dict, Iterator, List, Mapping,
                    Optional, Sequence, Tuple)

import numpy as np
import paddle

from ernie_doc.checkpoint import io
from ernie_doc.config import known_keys
from ernie_doc.data.document import Document
from ernie_doc.data.segment import step_members
from ernie_doc.data.splits import Split
from ernie_doc.errors import ConfigError, DataError, NotSet
from ernie_doc.kinds import document
from ernie_doc.kinds.document import MemoryPlan
from ernie_doc.kinds.folders import missing_key, task_hint, task_names, task_package
from ernie_doc.precision import AmpSettings, amp_settings
from ernie_doc.run_keys import TrainConfig
from ernie_doc.utils import clip

Config = TrainConfig   # what a task kind is built from: a run's config, checked


def truncate_tokens(tokens: Any, limit: int) -> Any:
    """The first `limit` tokens of a tokenized text: a list or array, an object with
    `truncate(limit)`, or a dataclass of per-token arrays (every field cut alike)."""
    if hasattr(tokens, "truncate"):
        return tokens.truncate(limit)
    if dataclasses.is_dataclass(type(tokens)):
        n = len(tokens)
        return dataclasses.replace(tokens, **{
            f.name: getattr(tokens, f.name)[:limit] for f in dataclasses.fields(tokens)
            if len(getattr(tokens, f.name)) == n})
    return tokens[:limit]


class Cuts:
    """Documents cut short by `max_doc_tokens`: how many, and the tokens dropped."""

    def __init__(self):
        self.docs, self.tokens = set(), 0

    def add(self, doc_id: str, dropped: int) -> None:
        self.docs.add(doc_id)
        self.tokens += dropped

    def __len__(self):
        return len(self.docs)

    def describe(self, limit: int) -> str:
        return (f"{len(self.docs)} documents longer than max_doc_tokens {limit} were cut to "
                f"it ({self.tokens:,} tokens not read)")


def sample_examples(docs: Sequence, limit: int, seed: int, split: str) -> list:
    """`limit` of `docs` drawn at random from (seed, split), kept in order (a reader's first N
    are often one class); stratified by label when all have one (stratified_counts)."""
    docs = list(docs)
    if limit >= len(docs):
        return docs
    rng = np.random.default_rng([seed, zlib.crc32(split.encode("utf-8"))])
    # documents of kinds without labels (spans, corpora) have no `label` at all
    if any(getattr(doc, "label", None) is None for doc in docs):
        keep = rng.choice(len(docs), size=limit, replace=False)
    else:
        by_label: Dict[str, List[int]] = {}
        for i, doc in enumerate(docs):
            by_label.setdefault(str(doc.label), []).append(i)
        labels = sorted(by_label)
        counts = stratified_counts([len(by_label[label]) for label in labels], limit, rng)
        keep = np.concatenate([rng.choice(by_label[label], size=n, replace=False)
                               for label, n in zip(labels, counts)])
    return [docs[i] for i in sorted(int(i) for i in keep)]


def stratified_counts(sizes: Sequence[int], limit: int, rng: np.random.Generator
                      ) -> List[int]:
    """How many of each class (`sizes`) a sample of `limit` keeps: one of each when limit
    allows, the rest in proportion (largest remainders); ties broken by `rng`."""
    n = len(sizes)
    if limit < n:
        counts = [0] * n
        for k in rng.choice(n, size=limit, replace=False):
            counts[int(k)] = 1
        return counts
    left = [size - 1 for size in sizes]
    rest, total = limit - n, sum(left)
    shares = [rest * m / total if total else 0.0 for m in left]
    counts = [1 + int(share) for share in shares]
    tie = rng.random(n)
    order = sorted(range(n), key=lambda k: (int(shares[k]) - shares[k], tie[k]))
    for k in order:
        if sum(counts) >= limit:
            break
        if counts[k] < sizes[k]:
            counts[k] += 1
    return counts


@contextlib.contextmanager
def data_dir_required(cfg: Config) -> Iterator[None]:
    """Around a reader call: a reader that needed data_dir and got "" (NotSet) becomes the
    config's one-line missing-key error naming the task."""
    try:
        yield
    except NotSet:
        raise missing_key(cfg.source, cfg.task, "data_dir",
                          f"the {cfg.task} task reads its data from a directory (which "
                          f"files: the Tasks table of README.md)") from None


def load_reader(task: Any) -> ModuleType:
    """tasks/<task>/reader.py as a module; `task` must be one of task_names (a name from a
    config or task.json is never imported otherwise)."""
    package = task_package()
    if not isinstance(task, str) or task not in task_names():
        raise DataError(f"task {clip(repr(task), 80)}: no tasks/{clip(task, 80)}/reader.py"
                        f"{task_hint(task)}")
    try:
        module = importlib.import_module(f"{package}.{task}.reader")
    except ModuleNotFoundError as e:
        if e.name in (f"{package}.{task}", f"{package}.{task}.reader", package):
            raise DataError(f"task {task!r}: no tasks/{task}/reader.py") from None
        raise
    if not callable(getattr(module, "read", None)):
        raise DataError(f"{module.__file__}: the reader must define read()")
    return module


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

    def labels(self, data_dir: str, options: Dict[str, Any]) -> List[str]:
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

    def read(self, data_dir: str, split: str, options: Dict[str, Any]) -> list:
        if self.documents is None:
            raise DataError("a saved model's task reads its documents from the predict input")
        return self.documents.read(data_dir, split, options)


class Task:
    """What the trainer asks of every task kind. The "carry": the dict of tensors a row stream
    carries between segments (memories [L, B, M, H] ...). `options`: see `option_defaults`."""
    main_metric: Optional[str] = None
    metric_names: Tuple[str, ...] = ()   # what evaluation reports (the trainer adds "loss"):
                                         # main_metric's choices, checked before anything runs
    option_defaults: Dict[str, Any] = {}
    # facts the config checks and the commands read through kinds.kind_class(name)
    streaming = False      # the train split is a stream run for max_steps, not epochs
    group_size = 1         # batch rows one example takes (batch_unit: examples counts these)
    task_reader = True     # reads tasks/<task>/reader.py (False: a corpus in data_dir itself)
    uses_tokenizer = True  # reads text through a tokenizer (False: its own vocabulary)
    scores_tokens = False  # predicts each token's likelihood (predict.lm), not documents
    refused: Dict[str, str] = {}   # run-config keys the kind refuses when set → why
    pipeline_tasks: Tuple[str, ...] = ()   # Hugging Face pipeline tasks it does (predict)
    # the batch axis of each carry tensor: ERNIE-Doc's memories [L, B, M, H], memory_mask [B, M]
    carry_axes: Dict[str, int] = {"memories": 1, "memory_mask": 0}

    def __init__(self, cfg: Config, reader: Any):
        self.cfg, self.reader = cfg, reader
        unknown = set(cfg.task_options) - set(self.option_defaults)
        if unknown:
            raise ConfigError(f"{cfg.source}: task_options: unknown {sorted(unknown)} for kind "
                              f"{cfg.kind!r} (known: {sorted(self.option_defaults)})")
        self.options = dict(self.option_defaults, **cfg.task_options)

    def option_error(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.cfg.source}: task_options.{key}: {message}")

    def check_options(self, positive: Sequence[str] = (),
                      choices: Optional[Dict[str, Collection]] = None) -> None:
        """task_options checks: `positive` keys must be positive integers, `choices` maps a
        key to its allowed values."""
        for key in positive:
            value = self.options[key]
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise self.option_error(key, f"must be a positive integer, got {value!r}")
        for key, allowed in (choices or {}).items():
            if self.options[key] not in allowed:
                raise self.option_error(key, f"{self.options[key]!r} is not one of "
                                             f"{list(allowed)}")

    def check_data(self, world: int) -> object:
        """Before any collective call, on every rank alike: data that cannot be read raises
        here (a streamed corpus is checked whole → what the kind found; document splits are read
        in prepare)."""

    # -- one micro-step ---------------------------------------------------------------------
    def init_carry(self, model: paddle.nn.Layer, rows: int) -> Dict[str, Any]:
        """The memory state a training stream of `rows` rows starts from."""
        raise NotImplementedError

    def forward(self, model: paddle.nn.Layer, batch: Dict[str, Any], carry: Dict[str, Any]
                ) -> Tuple[Any, Dict[str, Any]]:
        """The model on one batch of tensors with the rows' memory state → (outputs, the new
        memory state). `carry` is {} at the start of an evaluation."""
        raise NotImplementedError

    def carry_rows(self, carry: Dict[str, Any], rows: Sequence[int]) -> Dict[str, Any]:
        """The carry of batch rows `rows` alone, in that order (each tensor gathered on its
        carry_axes axis; None stays None)."""
        index = paddle.to_tensor(np.asarray(rows, dtype=np.int64))
        return {k: None if v is None else paddle.gather(v, index, axis=self.carry_axes[k])
                for k, v in carry.items()}

    def train_weight(self, batch: Dict[str, np.ndarray]) -> np.ndarray:
        """numpy [B]: 1 for the rows of a batch that train."""
        raise NotImplementedError

    def loss(self, out: Any, batch: Dict[str, Any], weight: paddle.Tensor) -> paddle.Tensor:
        """Mean loss over the rows with weight 1 (weight: float tensor [B])."""
        raise NotImplementedError

    def train_loss(self, out: Any, batch: Dict[str, Any], weight: paddle.Tensor
                   ) -> Tuple[paddle.Tensor, Dict[str, Tuple[float, float]]]:
        """→ (the loss a training micro-step backpropagates, {name: (sum, count)} scalars the
        trainer sums over micro-steps and ranks). Called on every rank at every micro-step."""
        return self.loss(out, batch, weight), {}

    def combine_metrics(self, means: Dict[str, float]) -> Dict[str, float]:
        """The logged training scalars from the step means of `train_loss`'s scalars."""
        return means

    def batch_tokens(self, batch: Dict[str, np.ndarray]) -> int:
        """Tokens a batch reads (the throughput numbers count these)."""
        raise NotImplementedError

    # -- results ----------------------------------------------------------------------------
    def better(self, metric: str, value: float, best: float) -> bool:
        """Whether `value` of `metric` beats `best` (the best checkpoint's)."""
        return value > best

    def model_files(self, atomic_entry: Callable[[str, str], ContextManager[str]]) -> List[str]:
        """Files saved beside exported models when there is no tokenizer; `atomic_entry`
        (output_dir, entry) gives the temporary path to write."""
        return []

    def text_segment_layout(self) -> Optional[str]:
        """The layout of this kind's segment when a tokenizer call can build it from a
        document's one text ("cls_last" / "cls_first": a saved model's tokenizer then lays
        it out), else None (the kind packs several fields its own way)."""
        return None

    # -- the run: training.prepare calls these in order, assemble.saved_run load_saved (`run`:
    # an assemble.Assembly, which they fill) -----------------------------------------------------
    def read_inputs(self, run: Any) -> Optional[str]:
        """Read the training data and choose run.tokenizer, run.special → the directory of a
        freshly trained SentencePiece model, or None."""
        raise NotImplementedError

    def memory_plan(self, config: Any = None) -> MemoryPlan:
        """(builder: n → the model with n layers, layers, hidden, heads, tokens per row, memory
        length) of the model over `config`, for memory estimates; None: the kind's own, for a
        kind that holds one (the language model; a document kind is given its encoder's)."""
        raise NotImplementedError

    def build_model(self, run: Any) -> paddle.nn.Layer:
        """The model to train or evaluate, its memory estimate checked first."""
        raise NotImplementedError

    def build_splits(self, run: Any) -> Tuple[Optional[Split], Dict[str, Split]]:
        """→ (the train split, None with eval_only; {name: split} of eval and test splits)."""
        raise NotImplementedError

    def describe(self, run: Any) -> List[str]:
        """The run's summary lines, once build_splits ran."""
        raise NotImplementedError

    def load_saved(self, run: Any, directory: str,
                   load_model: Optional[Callable[[Any], Any]] = None) -> None:
        """A saved folder's tokenizer, model (`load_model(run)`: an exported one) and reading
        into `run`, the memory estimate for run.eval_rows checked first."""
        raise NotImplementedError

    # -- a saved folder of the kind, before its config is read: the ERNIE-Doc model's ------------
    @classmethod
    def model_config_keys(cls) -> Tuple[str, List[str]]:
        """(the model config's class name, the keys model_overrides may set)."""
        return "ErnieDocConfig", sorted(known_keys())

    @classmethod
    def saved_model_config(cls, folder: str) -> Dict[str, Any]:
        """The model config a saved folder holds, as a mapping."""
        path = io.detect_format(folder)[2]
        return dict(io.read_config_file(path)[0]) if path else {}

    @classmethod
    def saved_settings(cls, values: Dict[str, Any], config: Mapping[str, Any]) -> None:
        """assemble.trained_reading's `values` completed for the kind (`config`: the run's)."""
        values["tokenizer"] = ""   # the folder's own

    @classmethod
    def saved_reader(cls, record: Mapping[str, Any], task: str, documents: Any = None,
                     folder: str = "") -> Any:
        """The reader of a saved folder (task.json `record`) over `documents`, the data's task
        reader (None: predict's input holds the documents)."""
        return SavedReader(record["labels"], task, documents, folder)


class DocumentTask(Task):
    """The document family: reading, label ids, segment passes, an ERNIE-Doc head. `group_size`
    g > 1: an example takes g rows in lockstep (steps: tuples of g Segments)."""
    head_class: Any = None   # the ERNIE-Doc head class of the kind

    def __init__(self, cfg: Config, reader: Any):
        super().__init__(cfg, reader)
        labels = getattr(reader, "labels", None)   # a reader module's optional function
        with data_dir_required(cfg):
            self.labels = [str(x) for x in labels(cfg.data_dir, dict(cfg.reader))] \
                if labels else []
        self.label_ids = {label: i for i, label in enumerate(self.labels)}
        self.segmenter: Any = None   # setup() builds it: (ids, doc_index, ...) → [Segment]
        self.cuts = Cuts()

    # -- documents ----------------------------------------------------------------------------
    def read(self, split: str) -> list:
        with data_dir_required(self.cfg):
            docs = self.reader.read(self.cfg.data_dir, split, dict(self.cfg.reader))
        limit = self.cfg.max_examples.get(split)
        if limit:
            docs = sample_examples(docs, limit, self.cfg.seed, split)
        if not docs:
            raise DataError(f"{self.cfg.data_dir or self.cfg.task}: no examples in split "
                            f"{split!r}")
        seen = set()
        for doc in docs:
            if doc.doc_id in seen:
                raise DataError(f"split {split!r}: duplicate document id {doc.doc_id!r}")
            seen.add(doc.doc_id)
        return docs

    def id_vocabulary(self) -> Optional[Tuple[Dict[str, int], int]]:
        """A pre-tokenized task's (special ids {cls, sep, pad}, vocabulary size) from its
        reader, or None when the task reads text."""
        vocabulary = getattr(self.reader, "id_vocabulary", None)   # optional in a reader
        return None if vocabulary is None else vocabulary(dict(self.cfg.reader))

    def tokenizer_texts(self, doc: Document) -> List[str]:
        """The strings of a document a tokenizer trained on the train split should see."""
        return [doc.text] if doc.text else []

    def tokenizer_sample(self) -> Optional[list]:
        """Documents to train a tokenizer on when there is no train split to read (a streamed
        corpus), else None."""
        return None

    def setup(self, special_ids: Dict[str, int], max_seq_len: int, stride: int,
              tokenizer: Any = None) -> None:
        """special_ids: cls/sep/pad ids of the tokenizer (None for pre-tokenized tasks)."""
        raise NotImplementedError

    def cap(self, tokens: Any, doc: Document) -> Any:
        """A document's tokens cut to `max_doc_tokens` (0 = no limit); cuts are counted in
        `self.cuts`."""
        limit = self.cfg.max_doc_tokens
        if not limit or len(tokens) <= limit:
            return tokens
        self.cuts.add(doc.doc_id, len(tokens) - limit)
        return truncate_tokens(tokens, limit)

    def take_cuts(self) -> Cuts:
        """The documents `cap` cut since the last call; counting starts anew."""
        cuts, self.cuts = self.cuts, Cuts()
        return cuts

    def document_segments(self, doc: Document, doc_index: int, tokenizer: Any) -> list:
        """One reading pass of a document → [Segment] (or [tuple of Segments] for groups).
        Default: tokenize doc.text (or take doc.ids) and cut it with `segments`."""
        ids = doc.ids if doc.ids is not None else encode_ids(tokenizer, doc.text or "")
        if len(ids) == 0:
            raise DataError(f"document {doc.doc_id!r} has no tokens")
        return self.segments(doc, doc_index, self.cap(ids, doc))

    def segments(self, doc: Document, doc_index: int, ids: Any) -> list:
        """One reading pass of a document (token ids `ids`) → [Segment] with targets."""
        raise NotImplementedError

    def train_stream(self, rank: int, world: int, rows: int, seq_len: int, pad_id: int,
                     seed: int) -> Optional[Split]:
        """The train split when it is streamed (`streaming`), else None: it is then built
        from `read("train")` like every other split."""
        return None

    # -- the run: an ERNIE-Doc head (kinds.document) --------------------------------------------
    def read_inputs(self, run: Any) -> Optional[str]:
        cfg = self.cfg
        train = [] if self.streaming or cfg.eval_only else ["train"]
        names = list(dict.fromkeys(train + list(cfg.eval_splits) + list(cfg.test_splits)))
        self.docs = {split: self.read(split) for split in names}
        run.tokenizer, run.special, spm_dir = document.choose_tokenizer(
            run, self.docs.get("train", self.docs[names[0]] if cfg.eval_only else None))
        return spm_dir

    def memory_plan(self, config: Any = None) -> MemoryPlan:
        return document.head_memory_plan(self, config, self.cfg.max_seq_len)

    def build_model(self, run: Any) -> paddle.nn.Layer:
        return document.build_head(run)

    def build_splits(self, run: Any) -> Tuple[Optional[Split], Dict[str, Split]]:
        train, evaluated, self.summary = document.document_splits(run, self.docs)
        return train, evaluated

    def describe(self, run: Any) -> List[str]:
        return self.summary

    def load_saved(self, run: Any, directory: str,
                   load_model: Optional[Callable[[Any], Any]] = None) -> None:
        # a model trained with amp on a GPU predicts with its autocast there; on CPU fp32
        run.amp = amp_settings(self.cfg.amp, run.device) if run.device == "gpu" \
            else AmpSettings()
        pretokenized = self.id_vocabulary() is not None
        run.tokenizer, run.special, _ = document.choose_tokenizer(
            run, [] if pretokenized else None)
        if load_model is not None:
            run.model = load_model(run)
            document.check_head_memory(run, run.model.config)   # the rows an export reads
        else:
            run.model = document.build_head(run)
        document.setup_reading(run)

    def head_flops(self, config: Any, head_params: int, tokens: int) -> Tuple[float, str]:
        """ernie-doc plan: (forward FLOPs of the head on a row of `tokens` tokens over the
        encoder `config`, how they are counted); `head_params`: the head's parameters."""
        return 2.0 * head_params * tokens, ("2 per head parameter and token: exact for a head "
                                            "that reads every token, above it for a [CLS] head")

    # -- the model ----------------------------------------------------------------------------
    def model_kwargs(self) -> Dict[str, Any]:
        """Keyword arguments of the head's constructor (e.g. num_labels)."""
        return {}

    def model_config_overrides(self) -> Dict[str, Any]:
        """ErnieDocConfig values the task's layout fixes (e.g. where [CLS] sits)."""
        return {}

    def model_inputs(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        """Keyword inputs of the head's forward beyond the encoder's, from a batch's tensors
        (through forward, so data parallelism sees every parameter used)."""
        return {}

    # -- one micro-step: an ERNIE-Doc head on collated rows -----------------------------------
    def init_carry(self, model: paddle.nn.Layer, rows: int) -> Dict[str, Any]:
        return {"memories": model.ernie_doc.init_memories(rows), "memory_mask": None}

    def forward(self, model: paddle.nn.Layer, batch: Dict[str, Any], carry: Dict[str, Any]
                ) -> Tuple[Any, Dict[str, Any]]:
        out = model(batch["input_ids"], carry.get("memories"), batch["token_type_ids"],
                    batch["attention_mask"], batch["reset_memory"], carry.get("memory_mask"),
                    **self.model_inputs(batch))
        return out, {"memories": out.memories, "memory_mask": out.memory_mask}

    def train_weight(self, batch: Dict[str, np.ndarray]) -> np.ndarray:
        weight = batch["has_loss"]
        if self.cfg.loss_segments == "last":
            weight = weight & batch["is_last"]
        return weight

    def batch_tokens(self, batch: Dict[str, np.ndarray]) -> int:
        return int(batch["attention_mask"].sum())

    # -- evaluation (data.splits.DocumentEvaluation) -------------------------------------
    def row_outputs(self, out: Any, batch: Optional[Dict[str, Any]] = None) -> Any:
        """What each predicted row contributes: numpy [B, ...] (batch: its tensors); by
        default `row_scores` as numpy."""
        return self.row_scores(out, batch).numpy()

    def row_scores(self, out: Any, batch: Optional[Dict[str, Any]] = None) -> paddle.Tensor:
        """`row_outputs` as a float32 tensor that keeps its graph (an explanation follows its
        gradient): [B / g, ...]."""
        raise NotImplementedError

    # -- explanation (ernie_doc.explain) --------------------------------------------------------
    def explain_target(self, doc: Document, steps: Sequence, rows: List[Tuple[int, Any]],
                       record: Dict[str, Any], target: Optional[str]) -> "ExplainTarget":
        """What `ernie-doc explain` follows in a document: `target` (a label, an answer text
        ...; None: the prediction `record`), scored on the final reading's rows [(segment,
        row_scores row)]; `rows` are the unchanged document's (numpy). DataError for a
        target the document cannot have."""
        raise NotImplementedError(f"kind {type(self).__name__} has no explanation target")

    def field_offsets(self, doc: Document, tokenizer: Any) -> Dict[str, Tuple[str, np.ndarray]]:
        """The texts `Segment.sources` name → (text, character offsets [n, 2] of its tokens,
        the ids `document_segments` cut); a pre-tokenized document's ids become a text of
        the ids, space-separated."""
        if doc.ids is not None and doc.text is None:
            return {"text": ids_text(doc.ids)}
        return {"text": text_offsets(tokenizer, doc.text or "")}

    def evaluate(self, docs: Sequence[Document], rows: Mapping[int, List[Tuple[int, Any]]],
                 passes: Any) -> Tuple[Dict[str, float], List[Dict[str, Any]]]:
        """rows: doc_index → [(seg_index, row_output)] of the predicted pass; passes: each
        document's steps (their `meta`) → (metrics dict, [per-document prediction dict])."""
        raise NotImplementedError

    # -- prediction (ernie-doc predict; every kind's evaluate = predict + gold) --------------
    # The Document fields a prediction reads ("text": `doc.text` or `doc.ids`, else
    # `doc.fields[name]`); never a gold field.
    input_fields: Tuple[str, ...] = ("text",)

    def check_input(self, doc: Document) -> Optional[str]:
        """A document to predict → one line saying what is wrong with its input fields, or
        None when `document_segments` can read it. Gold fields are not looked at."""
        for name in self.input_fields:
            value = input_value(doc, name)
            if value is None:
                return f"missing field {name!r}"
            problem = self.input_problem(name, value)
            if problem:
                return problem
        return None

    def input_problem(self, name: str, value: Any) -> Optional[str]:
        """What is wrong with the present input field `name` (check_input), or None. Default:
        a non-empty string; "text" may also be token ids (a pre-tokenized document)."""
        if name == "text" and not isinstance(value, str):   # doc.ids
            try:
                ok = all(isinstance(i, (int, np.integer)) and not isinstance(i, bool)
                         for i in value)
            except TypeError:
                ok = False
            if not ok:
                return "text must be a string (or ids a list of token ids)"
            return None if len(value) else "empty text"
        return text_problem(name, value)

    def predict(self, docs: Sequence[Document], rows: Mapping[int, List[Tuple[int, Any]]],
                passes: Optional[Sequence[Sequence]]) -> List[Dict[str, Any]]:
        """Documents and their predicted rows (doc index → [(segment, output)]) → one JSON-able
        record per document, in order; no gold is read, each depends on its document only."""
        return [self.predict_document(doc, rows.get(i, []), None if passes is None else passes[i])
                for i, doc in enumerate(docs)]

    def predict_document(self, doc: Document, rows: List[Tuple[int, Any]],
                         steps: Optional[Sequence]) -> Dict[str, Any]:
        """One document's prediction record (see `predict`): rows [(segment index, row
        output)] of its predicted steps, steps its reading passes."""
        raise NotImplementedError(f"kind {type(self).__name__} does not predict documents")


@dataclasses.dataclass
class ExplainTarget:
    """What an explanation follows: `name` (one phrase: "probability of label 'pos'"), `label`
    (the target as a string) and `score`, a document's final-reading rows [(segment index,
    row tensor of row_scores)] → a scalar tensor (differentiable)."""
    name: str
    label: str
    score: Callable[[List[Tuple[int, Any]]], Any]
    # the same rows → a score that does not saturate (a probability's log-odds against the
    # other labels), for gradients near certainty; None: `score` itself
    margin: Optional[Callable[[List[Tuple[int, Any]]], Any]] = None


def log_odds(p: Any, k: int) -> Any:
    """log p[k] − mean over the other labels of log p[j] (p [C] probabilities, C ≥ 2): the
    logit margin, whose gradient does not vanish as p[k] nears 1."""
    logp = paddle.log(paddle.clip(p, min=1e-30))
    others = paddle.concat([logp[:k], logp[k + 1:]])
    return logp[k] - others.mean()


def aggregate_rows(rows: List[Tuple[int, Any]], how: str = "mean") -> Any:
    """aggregate_segments (metrics.classification) on tensors: the mean (official) or the
    last of a document's rows [(segment index, tensor [C])] in segment order → [C]."""
    ordered = [r for _, r in sorted(rows, key=lambda x: x[0])]
    if not ordered:
        raise ValueError("a document has no predicted segment")
    if how == "last":
        return ordered[-1]
    return paddle.stack(ordered).mean(axis=0)


def text_offsets(tokenizer: Any, text: str) -> Tuple[str, np.ndarray]:
    """(text, its tokens' character offsets [n, 2]), the tokens `encode_ids` gives; DataError
    when the tokenizer gives no offsets for them."""
    ids, offsets = tokenizer.encode_with_offsets(text)
    if len(ids) != len(encode_ids(tokenizer, text)):
        raise DataError("the tokenizer's offsets do not match its tokens: the text cannot "
                        "be coloured")
    return text, np.asarray(offsets, dtype=np.int64).reshape(-1, 2)


def ids_text(ids: Sequence[int]) -> Tuple[str, np.ndarray]:
    """A pre-tokenized document as (its ids space-separated, each id's offsets [n, 2])."""
    words = [str(int(i)) for i in ids]
    ends = np.cumsum([len(w) + 1 for w in words]) - 1
    return " ".join(words), np.stack([ends - [len(w) for w in words], ends], axis=1) \
        if words else np.zeros((0, 2), dtype=np.int64)


def encode_ids(tokenizer: Any, text: str) -> Any:
    """A document's ids: the tokenizer's int64 array (encode_array: bounded memory for a long
    text), or what its encode gives (a tokenizer of another kind)."""
    encode_array = getattr(tokenizer, "encode_array", None)   # ours; a test's may lack it
    return encode_array(text) if encode_array is not None else tokenizer.encode(text)


def input_value(doc: Document, name: str) -> Any:
    """The input field `name` of a document (see DocumentTask.input_fields), None if absent."""
    if name == "text":
        return doc.text if doc.text is not None else doc.ids
    return (doc.fields or {}).get(name)


def text_problem(name: str, value: Any) -> Optional[str]:
    """check_input's line for an input field that must be a non-empty string, or None."""
    if not isinstance(value, str):
        return f"{name} must be a string, got {type(value).__name__}"
    if not value.strip():
        return f"empty {name}"
    return None


def without_training(steps: list) -> list:
    """A document without its gold fields (one to predict): none of its rows trains (its
    targets are neutral placeholders, never a label). → the same steps, a list (steps built
    when read, data.segment.LazySteps, take has_loss=False from their segmenter instead)."""
    if not isinstance(steps, list):
        raise TypeError(f"without_training marks a list of steps, got {type(steps).__name__}")
    for step in steps:
        for member in step_members(step):
            member.has_loss = False
    return steps


def with_gold(record: Dict[str, Any], **gold: Any) -> Dict[str, Any]:
    """A prediction record with gold fields added (evaluate's predictions file): they go
    before `segments`, the record's last (bookkeeping) key."""
    out = {k: v for k, v in record.items() if k != "segments"}
    out.update(gold)
    if "segments" in record:
        out["segments"] = record["segments"]
    return out


def masked_mean(values: paddle.Tensor, weight: paddle.Tensor) -> paddle.Tensor:
    """Σ values·weight / max(1, Σ weight): 0 (with zero gradients) when no row trains."""
    return (values * weight).sum() / paddle.clip(weight.sum(), min=1.0)
