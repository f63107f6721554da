"""Predictions on your own documents: a fine-tuned model, documents of any length in, one
prediction per document out.

    from ernie_doc.predict.pipeline import Pipeline
    pipe = Pipeline.from_pretrained("output/imdb")        # a run directory, its best/ or final/
    pipe(["a long review ...", "another ..."])            # → [{"doc_id", "pred", "probs", ...}]

A document is read exactly as evaluation reads it (`eval_only`), streamed in bounded memory.
A saved model needs its `task.json` besides its weights and tokenizer files. Details:
docs/design-notes.md, "Prediction"."""
import os
from collections import defaultdict
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, DefaultDict, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import paddle

from ernie_doc.assemble import Assembly, saved_run
from ernie_doc.data.collate import TensorStage, collate
from ernie_doc.data.document import Document
from ernie_doc.data.schedule import RowScheduler
from ernie_doc.data.segment import reading_passes, step_members
from ernie_doc.data.splits import RowOutputs, collect_row_outputs
from ernie_doc.errors import (ConfigError, DataError, EngineError, ExportError, NotSet,
                              PipelineError, PredictorInputError, UntrainedHead)
from ernie_doc.explain.explainer import Explainer
from ernie_doc.kinds import TASK_FILE, builtin_kinds, kind_class, kind_names, saved_kind
from ernie_doc.kinds.base import DocumentTask, load_reader
from ernie_doc.kinds.folders import task_config
from ernie_doc.precision import AmpSettings
# re-exported: `from ernie_doc.predict.pipeline import read_inputs` is the documented door
from ernie_doc.predict.documents import (ENGINES, DocumentStream, InputProblem,  # noqa: F401
                                         check_batch_size, read_inputs, to_document)
from ernie_doc.predict.engine import Predictor, machine_settings
from ernie_doc.predict.export import META_SUFFIX
from ernie_doc.predict.lm import LMPipeline
from ernie_doc.predict.model_folder import model_directory, task_record
from ernie_doc.resources import release_free_memory
from ernie_doc.run_config import batch_rows
from ernie_doc.utils import clip, regular_file_problem, threads_problem

DEVICES = ("cpu", "gpu")
# a document of this many segments (about 130k tokens at stride 126) gives the heap's free
# pages back once it is tokenized and cut (resources.release_free_memory)
LONG_DOCUMENT_SEGMENTS = 1024


def check_device(device: str) -> str:
    """`device` when this host and paddle build can run it (inference_settings decides); else
    PipelineError naming what is missing."""
    if device not in DEVICES:
        raise PipelineError(f"device must be one of {DEVICES}, got {device!r}")
    try:
        machine_settings(device)
    except EngineError as e:
        raise PipelineError(str(e)) from None
    return device


def reads_token_ids(task) -> bool:
    """Whether documents of `task` may be given as token ids: its kind cuts them with
    DocumentTask's document_segments (span, choice, keyphrase, HotpotQA read none)."""
    return getattr(type(task), "document_segments", None) is DocumentTask.document_segments


def is_export(directory: str) -> bool:
    """Whether `directory` holds a model exported for paddle.inference (a *.meta.json)."""
    return any(name.endswith(META_SUFFIX) for name in os.listdir(directory))


class ExportedModel:
    """An exported model (engine.Predictor) behind a dygraph head's call → its outputs and new
    memories as tensors, so the task's forward and row_outputs run unchanged."""

    def __init__(self, predictor):
        self.predictor = predictor
        self.config = predictor.config
        self.fixed_rows = predictor.batch_size   # None: the export takes any batch

    def eval(self) -> "ExportedModel":
        return self

    def __call__(self, input_ids, memories=None, token_type_ids=None, attention_mask=None,
                 reset_memory=None, memory_mask=None, **head_inputs):
        def host(t):
            return None if t is None else t.numpy()
        if not self.predictor.has_memory:   # recurrence none: the export takes no memory
            memories = reset_memory = memory_mask = None
        try:
            outputs = self.predictor.run(host(input_ids), host(attention_mask),
                                         host(token_type_ids), host(memories),
                                         host(reset_memory), host(memory_mask),
                                         **{k: host(v) for k, v in head_inputs.items()})
        except (ExportError, PredictorInputError) as e:
            # the documents were checked: what the export refuses now is the export's own
            # sizes (its sidecar edited so the program no longer matches it)
            raise PipelineError(str(e)) from None
        fields = {k: paddle.to_tensor(v) for k, v in outputs.items()}
        fields.setdefault("memories", None)
        fields.setdefault("memory_mask", None)
        return SimpleNamespace(**fields)


def exported_model(directory: str, cfg, task, device: str, precision: str,
                   threads: int, tokenizer=None) -> ExportedModel:
    """The export in `directory` under paddle.inference, checked against the task: head class,
    max_seq_len, and a vocabulary holding every id the tokenizer produces."""
    try:
        predictor = Predictor(directory, threads=threads, device=device, precision=precision)
    except (EngineError, ExportError) as e:
        raise PipelineError(str(e)) from None
    wanted, found = task.head_class.__name__, predictor.meta.get("model_class")
    if found != wanted:
        raise PipelineError(f"{directory}: the export holds {found}; task kind {cfg.kind!r} "
                            f"reads the outputs of {wanted} (export with its --head)")
    if predictor.seq_len != cfg.max_seq_len:
        raise PipelineError(f"{directory}: exported with seq_len {predictor.seq_len}, but the "
                            f"model reads segments of max_seq_len {cfg.max_seq_len}: export "
                            f"again with --seq-len {cfg.max_seq_len}")
    vocab = predictor.config.vocab_size
    if tokenizer is not None and len(tokenizer) > vocab:
        raise PipelineError(f"{directory}: the tokenizer has {len(tokenizer)} tokens but the "
                            f"export's vocab_size is {vocab}")
    return ExportedModel(predictor)


class Pipeline(DocumentStream):
    """A fine-tuned ERNIE-Doc model with its task kind, ready to predict documents.
    `rows`: batch rows (memory streams) read at once, a multiple of the kind's group size."""

    def __init__(self, run: Assembly, rows: int, on_error: str = "record"):
        self.on_error = self.check_on_error(on_error)
        group = run.task.group_size
        if rows < 1 or rows % group:
            raise PipelineError(f"batch size {rows} must be a positive multiple of {group} "
                                f"(rows per example of task kind {run.cfg.kind!r})")
        assert run.model is not None   # saved_run loaded it
        self.run, self.task, self.model, self.tokenizer = run, run.task, run.model, run.tokenizer
        self.cfg, self.rows, self.group = run.cfg, rows, group
        self.pad_id = run.special["pad"]
        # what documents may give: ids of the model's embedding table (checked before any
        # is read), text only with a tokenizer
        self.vocab_size = self.model.config.vocab_size if reads_token_ids(self.task) else None
        self.reads_text = self.tokenizer is not None
        # the run's autocast (GPU only) for a dygraph model; an export has its own precision
        self.amp = run.amp if isinstance(self.model, paddle.nn.Layer) else AmpSettings()
        # rows left idle at the end are dropped (stream), unless the export's batch is fixed
        self.compact = getattr(self.model, "fixed_rows", None) is None
        self.model.eval()

    @classmethod
    def from_pretrained(cls, path: str, batch_size: Optional[int] = None,
                        on_error: str = "record", device: str = "cpu", engine: str = "auto",
                        precision: str = "fp32", threads: int = 1,
                        task: Optional[str] = None) -> "Pipeline":
        """`path`: a run directory, a saved model with task.json or its export (with `task`,
        a save_pretrained directory). engine: "dygraph", "inference" or "auto"."""
        if engine not in ENGINES:
            raise PipelineError(f"engine must be one of {ENGINES}, got {engine!r}")
        check_batch_size(batch_size)
        problem = threads_problem(threads)   # paddle's OpenMP aborts the process on too many
        if problem:
            raise PipelineError(f"threads: {problem}")
        check_device(device)
        directory = model_directory(path, task)
        exported = is_export(directory)
        if engine == "auto":
            engine = "inference" if exported else "dygraph"
        if engine == "inference" and not exported:
            raise PipelineError(f"{directory}: engine inference needs an exported model "
                                f"(ernie-doc export --config {directory} ...)")
        if engine == "dygraph" and exported and not os.path.isfile(
                os.path.join(directory, "config.json")):
            raise PipelineError(f"{directory}: an exported model runs on engine inference")
        if engine == "dygraph" and precision != "fp32":
            raise PipelineError(f"precision {precision}: the dygraph engine runs fp32; "
                                f"export the model for bf16 (engine inference)")
        record = task_record(directory, task)
        source = os.path.join(directory, TASK_FILE)
        if not os.path.isfile(source):   # save_pretrained's folder: the task's own config
            source = task_config(record["task"]) or source   # task_record checked the task
        # the model, tokenizer and label names come from the directory; nothing is written
        load = None
        if engine == "inference":
            def load(run):
                return exported_model(directory, run.cfg, run.task, device, precision,
                                      threads, run.tokenizer)
        try:
            run = saved_run(directory, record, source, device, batch_size, load)
        except UntrainedHead as e:   # predictions from a newly initialised head: refused
            saved = f"the {e.other_head} head" if e.other_head else \
                f"no trained {e.head} head ({len(e.missing)} tensors missing)"
            raise PipelineError(f"{directory}: holds {saved}, not the one task "
                                f"{record['config']['task']!r} predicts with; give --task the "
                                "task it was fine-tuned for") from None
        except (ConfigError, DataError) as e:
            raise PipelineError(str(e)) from None
        return cls(run, batch_size or batch_rows(run.cfg, run.task.group_size, evaluation=True),
                   on_error)

    # -- documents → predictions -----------------------------------------------------------
    def _passes(self, doc: Document, key: int) -> Sequence:
        """The document's steps: one reading pass cut into segments, read as the run read it
        (skim pass then retrospective pass when retro_feed), each built when read."""
        steps = self.task.document_segments(doc, key, self.tokenizer)
        if len(steps) >= LONG_DOCUMENT_SEGMENTS:   # tokenizing it left free pages resident
            release_free_memory()
        return reading_passes(steps, self.cfg.retro_feed, self.cfg.train_skim)

    def stream(self, documents: Iterable[Any], skip: Iterable[str] = ()) -> Iterator[dict]:
        """Predict documents as they come → records in finishing order, each with its input
        `index`. `skip`: document ids not to predict (resume)."""
        task, g = self.task, self.group
        seen: Dict[str, Tuple[bool, int]] = {}   # record names given so far (admit)
        skip = self.skip_ids(skip)
        source = enumerate(self.items(documents))
        inflight: Dict[int, tuple] = {}     # key → (input index, document, passes)
        # key → its (segment index, row output) pairs
        outputs: DefaultDict[int, RowOutputs] = defaultdict(RowOutputs)
        ready: List[dict] = []              # problems met while filling rows
        keys = iter(range(1 << 62))

        def next_doc():
            for index, item in source:
                doc = self.admit(index, item, skip, seen)
                if not isinstance(doc, Document):   # skipped, or an error record
                    ready.extend([doc] if doc else [])
                    continue
                problem = task.check_input(doc)
                key = next(keys)
                if problem is None:
                    try:
                        passes = self._passes(doc, key)
                    except DataError as e:
                        problem = str(e)
                if problem is not None:
                    ready.append(self.problem(index, doc.doc_id, problem))
                    continue
                inflight[key] = (index, doc, passes)
                return key, len(passes)
            return None

        scheduler, stage = RowScheduler(self.rows // g), TensorStage()
        carry: Dict[str, Any] = {}
        while True:
            step = scheduler.step(next_doc)
            yield from ready
            ready.clear()
            if all(key is None for key, _, _ in step):
                return
            if self.compact:
                step, carry = self._live_rows(scheduler, step, carry)
            segments = [(inflight[key][2][seg] if key is not None else None, reset)
                        for key, seg, reset in step]
            carry = self._read_step(segments, stage, carry, outputs)
            for key, seg, _ in step:
                if key is not None and seg == len(inflight[key][2]) - 1:   # its last step
                    index, doc, passes = inflight.pop(key)
                    record = task.predict([doc], {0: outputs.pop(key, RowOutputs())},
                                          [passes])[0]
                    yield dict(record, index=index)

    def _live_rows(self, scheduler: RowScheduler, step: List[tuple], carry: Dict[str, Any]
                   ) -> Tuple[List[tuple], Dict[str, Any]]:
        """(step, carry) for the rows that read something: a row idle once the documents ran
        out stays idle, so it is dropped for good (its carry with it; groups of g rows
        together) and the model computes the live rows alone. A carry with a tensor the kind
        gives no batch axis for (Task.carry_axes) keeps every row."""
        if not set(carry) <= set(self.task.carry_axes):
            return step, carry
        kept = scheduler.drop_idle()
        if len(kept) == len(step):
            return step, carry
        g = self.group
        return ([step[r] for r in kept],
                self.task.carry_rows(carry, [r * g + j for r in kept for j in range(g)]))

    def _read_step(self, segments: List[Tuple[Any, bool]], stage: TensorStage,
                   carry: Dict[str, Any], outputs: Dict[int, RowOutputs]) -> Dict[str, Any]:
        """One step through the model: per row its step (g Segments; None: idle) and reset →
        the new carry; each predicted row's output appended to outputs[its doc key]."""
        g = self.group
        rows: List[Any] = []   # the step's Segments, None for an idle row
        resets: List[bool] = []
        for members, reset in segments:
            rows.extend([None] * g if members is None else step_members(members))
            resets.extend([reset] * g)
        batch = collate(rows, resets, self.cfg.max_seq_len, self.pad_id)
        tensors = stage(batch)
        # as evaluation reads: under AMP when the run trained with it (dygraph on a GPU)
        with paddle.no_grad(), self.amp.autocast():
            out, carry = self.task.forward(self.model, tensors, carry)
        collect_row_outputs(self.task, batch, tensors, out, g, outputs)
        return carry

    def explain(self, documents: Iterable[Any], **options: Any) -> List[dict]:
        """Explain the prediction of each document → one record per document, in input order
        (ernie_doc.explain.explainer.Explainer: `method`, `target`, `replace`, `steps` ...;
        docs/explain.md)."""
        return Explainer(self, **options)(documents)


class TwoStagePipeline(DocumentStream):
    """HotpotQA's two models in a row (evidence, then answer) as stage-2 training read stage 1;
    records are the answer model's, or stage 1's error record."""

    def __init__(self, evidence: Pipeline, answer: Pipeline):
        stages = (evidence.task.options.get("stage"), answer.task.options.get("stage"))
        if stages != ("evidence", "answer"):
            raise PipelineError(f"two stages need an evidence model then an answer model "
                                f"(HotpotQA task_options.stage), got {stages}")
        self.evidence, self.answer = evidence, answer
        self.run, self.cfg, self.task = answer.run, answer.cfg, answer.task

    def stream(self, documents: Iterable[Any], skip: Iterable[str] = ()) -> Iterator[dict]:
        pending: Dict[int, Document] = {}   # input index → document while in stage 1
        where: Dict[str, int] = {}          # doc_id → input index, for stage 2's records

        def questions():
            for index, item in enumerate(self.items(documents)):
                doc = to_document(index, item)
                if not isinstance(doc, InputProblem):
                    pending[index] = doc
                yield doc

        def with_evidence():
            # stage 1 names every question (DocumentStream.admit); stage 2 reads that name
            for record in self.evidence.stream(questions(), skip):
                doc = pending.pop(record["index"], None)
                where[record["doc_id"]] = record["index"]
                if "error" in record or doc is None:
                    yield InputProblem(record["doc_id"], record.get("error", "no document"))
                    continue
                doc = replace(doc, doc_id=record["doc_id"], fields=dict(doc.fields))
                doc.fields["evidence"] = sorted(int(p["index"]) for p in record["paragraphs"])
                yield doc

        for record in self.answer.stream(with_evidence()):
            record["index"] = where.get(record["doc_id"], record["index"])
            yield record


# reader options that choose a split's part of a data directory: a file given to predict is
# read whole, as one split
_SPLIT_OPTIONS = ("file", "files", "dev_ratio", "test_ratio", "split_seed", "dev_split",
                  "split_file")


def task_split(record: dict, split: Optional[str] = None) -> str:
    """The split `--format task` reads: `split`, else the first the run evaluated
    (eval_splits), else dev."""
    splits = record["config"].get("eval_splits") or ["dev"]
    return split or str(splits[0])


def task_documents(record: dict, path: Optional[str] = None,
                   split: Optional[str] = None) -> List[Document]:
    """Documents read by a saved model's own task reader from `path` (a data directory read as
    `split`, or one file); PipelineError (one line) for what the reader refuses."""
    task, options = record["task"], dict(record["config"].get("reader") or {})
    split = task_split(record, split)
    data_dir = record["config"].get("data_dir") if path is None else path
    try:
        reader = load_reader(task)
        if data_dir and not os.path.isdir(data_dir):
            problem = regular_file_problem(data_dir, "--input")
            if problem:
                raise PipelineError(problem)
            options = {k: v for k, v in options.items() if k not in _SPLIT_OPTIONS}
            if callable(getattr(reader, "read_input", None)):
                return list(reader.read_input(data_dir, options))
            if "files" not in getattr(reader, "OPTIONS", ()):
                raise PipelineError(f"--input {data_dir}: the {task} reader reads a data "
                                    f"directory, not one file: give that directory and "
                                    f"--split")
            options["files"] = {split: os.path.basename(data_dir)}
            data_dir = os.path.dirname(os.path.abspath(data_dir))
        if not data_dir and not getattr(reader, "SYNTHETIC", False):
            raise PipelineError(f"the model's run recorded no data_dir: give --input (the "
                                f"{task} data directory, or a file of it)")
        return list(reader.read(data_dir, split, options))
    except NotSet:
        raise PipelineError(f"the {task} task reads its data from a directory: give --input "
                            f"DIR") from None
    except (DataError, ConfigError) as e:
        raise PipelineError(str(e)) from None


# Hugging Face's pipeline task names (a kind lists those it does: Task.pipeline_tasks)
HF_TASKS = ("text-classification", "sentiment-analysis", "question-answering",
            "multiple-choice", "token-classification")


def pipeline(model_or_task: Optional[str] = None, answer_model: Optional[str] = None,
             batch_size: Optional[int] = None, on_error: str = "record", device: str = "cpu",
             engine: str = "auto", precision: str = "fp32", threads: int = 1,
             task: Optional[str] = None, *, model: Optional[str] = None):
    """The pipeline for a saved model (`pipeline(RUN)`, `pipeline(model=RUN)`, or Hugging
    Face's `pipeline("text-classification", model=RUN)`, the task checked against the model),
    whatever its kind (Pipeline, LMPipeline, or TwoStagePipeline with `answer_model`), each
    with `__call__` and `stream`. `task`: one of our task names, for a save_pretrained folder
    without task.json."""
    if isinstance(task, str) and task in HF_TASKS:   # Hugging Face's keyword form
        model_or_task, model, task = task, model if model is not None else model_or_task, None
    model, hf_task = _model_and_hf_task(model_or_task, model)
    check_device(device)
    directory = model_directory(model, task)
    record = task_record(directory, task)
    if hf_task is not None and hf_task not in saved_kind(record["kind"]).pipeline_tasks:
        doing = [name for name in dict.fromkeys([*builtin_kinds(), *kind_names()])
                 if hf_task in kind_class(name).pipeline_tasks]   # the built-in ones first
        raise PipelineError(f"{directory}: a {record['kind']} model (task {record['task']}), "
                            f"not one for {hf_task!r} ({' or '.join(doing)}); "
                            f"pipeline({model!r}) reads it as what it is")
    if saved_kind(record["kind"]).scores_tokens:
        if answer_model:
            raise PipelineError("answer_model: only with a HotpotQA evidence model")
        if engine == "inference" or precision != "fp32":
            raise PipelineError("the language model predicts on the dygraph engine in fp32")
        return LMPipeline.from_pretrained(directory, batch_size, on_error, device)
    options: Dict[str, Any] = dict(batch_size=batch_size, on_error=on_error, device=device,
                                   engine=engine, precision=precision, threads=threads)
    first = Pipeline.from_pretrained(directory, task=task, **options)
    if not answer_model:
        return first
    return TwoStagePipeline(first, Pipeline.from_pretrained(answer_model, **options))


def _model_and_hf_task(model_or_task: Any, model: Any) -> Tuple[str, Optional[str]]:
    """pipeline()'s first argument and `model=` → (the model folder, Hugging Face's task name
    or None); PipelineError for a call that names no model, or a first argument beside
    model= that is no task."""
    for given in (model_or_task, model):
        if given is not None and not isinstance(given, (str, os.PathLike)):
            raise PipelineError(f"pipeline: expected a model folder (a path) or a task name, "
                                f"got {type(given).__name__}")
    model_or_task = None if model_or_task is None else os.fspath(model_or_task)
    model = None if model is None else os.fspath(model)
    if model is None:
        if model_or_task is None:
            raise PipelineError("pipeline: give the model: pipeline(RUN) or "
                                "pipeline('text-classification', model=RUN)")
        if model_or_task in HF_TASKS and not os.path.isdir(model_or_task):
            raise PipelineError(f"pipeline({model_or_task!r}): give the model too: "
                                f"pipeline({model_or_task!r}, model=RUN) (a fine-tuning run's "
                                f"OUTPUT_DIR); no model is chosen or downloaded for a task")
        return model_or_task, None
    if model_or_task is None:
        return model, None
    if model_or_task not in HF_TASKS:
        raise PipelineError(f"pipeline({clip(repr(model_or_task))}, model=...): the first "
                            f"argument beside model= is a Hugging Face task name, one of "
                            f"{', '.join(HF_TASKS)}; one of our tasks is task=NAME")
    return model, model_or_task
