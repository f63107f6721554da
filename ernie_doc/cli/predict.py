"""Predict documents with a fine-tuned model: one JSON line per document, written as it goes.

    ernie-doc predict output/imdb --input reviews/ --output preds.jsonl
    ernie-doc predict output/cmrc2018/best --input questions.jsonl --output answers.jsonl
    ernie-doc predict MODEL --input big.jsonl --output preds.jsonl --resume   # after a stop
    ernie-doc predict output/imdb --format task --input data/imdb/test.txt --output -
    ernie-doc predict SAVED_DIR --task imdb --input reviews/ --output preds.jsonl

Each document is read exactly as evaluation reads it (ernie_doc.predict.pipeline); one that cannot
be predicted gets a record with an `error` field. `<output>.meta.json` records the model's
fingerprint, so --resume continues only a file written for this model, and --output is checked
and locked as ernie_doc.outputs says (never an input, never the model folder).
"""
import argparse
import contextlib
import io
import itertools
import json
import os
import shlex
import sys
import time
import zlib  # noqa: F401  before paddle (2.6.2 import-order bug, see ernie_doc/__init__)
from typing import Any, Callable, Iterable, List, Optional, Tuple

from ernie_doc.cli import report_run, with_notes_on_stdout
from ernie_doc.errors import NothingPredicted, PipelineError
from ernie_doc.outputs import InputSet, OutputFolder, check_appendable, check_output, check_stream
from ernie_doc.predict import records
from ernie_doc.predict.documents import (ENGINES, INPUT_FORMATS, ON_ERROR, STDIO, count_inputs,
                                         no_documents, read_inputs)
from ernie_doc.predict.model_folder import model_directory, task_record
from ernie_doc.predict.records import provenance_path, record_line
from ernie_doc.utils import clip, progress_bar, regular_file_problem, set_paddle_threads

# paddle is imported only once the arguments are read: --help and a bad argument answer at
# once (the paddle import takes seconds); its ccache warning is silenced in ernie_doc
TASK_FORMAT = "task"   # --format task: the model's own task reader reads --input
ALLOW_EMPTY = " (--allow-empty writes an empty --output instead)"


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_arguments(p, "predictions, one JSON object per line; - for standard output")
    p.add_argument("--answer-model", help="HotpotQA: the answer-stage model; MODEL is then the "
                                          "evidence-stage model, whose selection it reads")
    p.add_argument("--engine", choices=ENGINES, default="auto",
                   help="dygraph, or inference (an export under paddle.inference); default: "
                        "inference for an exported model, else dygraph")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32",
                   help="engine inference: bf16 on a CPU with AVX512-BF16 / AMX, fp16 / bf16 "
                        "on GPU")
    args = p.parse_args(argv)
    check_args(p, args)
    return args


def common_arguments(p: argparse.ArgumentParser, output_help: str) -> None:
    """The options predict shares with explain: the model, the documents, --output, the
    error and resume rules, threads, progress and --debug."""
    p.add_argument("model", help="a fine-tuning run's OUTPUT_DIR, or its best/ or final/, or "
                                 "a save_pretrained directory with --task")
    p.add_argument("--input", help="a .txt file, a directory of .txt files, a .tsv file with a "
                                   "header row, .jsonl, or - (standard input, JSON lines "
                                   "unless --format says otherwise); --format task: the "
                                   "task's data directory or one of its files (default: the "
                                   "run's data_dir)")
    p.add_argument("--output", required=True, help=output_help)
    p.add_argument("--format", choices=INPUT_FORMATS + (TASK_FORMAT,), default="auto",
                   help="input format (default: from the path); task: read --input with the "
                        "task's own reader, as fine-tuning read it")
    p.add_argument("--split", choices=("train", "dev", "test"),
                   help="--format task: the split to read (default: the first split the run "
                        "evaluated, else dev)")
    p.add_argument("--task", help="the task of a save_pretrained directory (no task.json), "
                                  "e.g. imdb")
    p.add_argument("--batch-size", type=int, help="rows read at once (default: the run's "
                                                  "eval_batch_size, else batch_size)")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--on-error", choices=ON_ERROR, default="record",
                   help="record: a line with an error field for a bad document (default); "
                        "fail: stop with one error line")
    p.add_argument("--resume", action="store_true",
                   help="continue --output: skip the documents already in it")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    p.add_argument("--allow-empty", action="store_true", help="an input without documents (an "
                   "empty file or folder, a header-only TSV): write an empty --output, exit 0")
    p.add_argument("--threads", type=int, default=0,
                   help="CPU math threads (0: paddle's default; engine inference: 1)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (ERNIE_DOC_PROGRESS=0: no bar in any command)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The checks of common_arguments' options that argparse cannot make (p.error: exit 2)."""
    if args.input is None and args.format != TASK_FORMAT:
        p.error("--input is required (except with --format task: the run's data)")
    if args.format == TASK_FORMAT and args.input == STDIO:
        p.error("--format task reads the task's data files, not standard input")
    if args.split and args.format != TASK_FORMAT:
        p.error("--split goes with --format task")
    if args.output == STDIO and (args.resume or args.overwrite):
        p.error("--resume and --overwrite need a file --output, not standard output")
    if args.batch_size is not None and args.batch_size < 1:
        p.error(f"--batch-size must be a positive integer, got {args.batch_size}")
    if args.threads < 0:
        p.error(f"--threads must be >= 0, got {args.threads}")
    if args.resume and args.overwrite:
        p.error("--resume and --overwrite exclude each other")


def check_input(path: str, error: type) -> None:
    """--input must be a directory or a regular file (a FIFO or a device is refused without
    being opened): error(one line) otherwise."""
    if path == STDIO:
        return
    if not os.path.exists(path):
        raise error(f"--input {path}: no such file or directory")
    if not os.path.isdir(path):
        problem = regular_file_problem(path, "--input")
        if problem:
            raise error(problem)


def model_directories(args: argparse.Namespace) -> List[str]:
    """The model folder(s) predict reads: MODEL's, and --answer-model's when given."""
    return [model_directory(args.model, args.task)] + \
        ([model_directory(args.answer_model, args.task)] if args.answer_model else [])


def input_paths(args: argparse.Namespace) -> List[str]:
    """The files predict reads documents from (standard input aside): --input, else with
    --format task the run's data_dir."""
    if args.input is not None:
        return [] if args.input == STDIO else [args.input]
    data_dir = task_record(model_directories(args)[0], args.task)["config"].get("data_dir")
    return [data_dir] if data_dir else []


def check_paths(args: argparse.Namespace):
    """Input and output checked before the model loads (PipelineError, one line) → (InputSet,
    file id of an existing --output or None), by ernie_doc.outputs' rule."""
    for path in input_paths(args):
        check_input(path, PipelineError)
    inputs = InputSet(input_paths(args) + model_directories(args))
    if args.output == STDIO:   # standard output: no file to lock or resume; not an input
        try:   # None: closed when Python started (`>&-`), which check_stream says
            stdout = -1 if sys.stdout is None else sys.stdout.fileno()
        except (AttributeError, OSError, ValueError):   # a stream with no file (a notebook)
            return inputs, False
        check_stream(stdout, inputs, error=PipelineError)
        if args.input == STDIO:   # `--input - < f --output - >> f`
            check_stream(stdout, InputSet(["/dev/stdin"]), error=PipelineError)
        return inputs, False
    output = args.output
    options = dict(inputs=inputs, exists_ok=args.resume or args.overwrite, error=PipelineError,
                   hint="--resume continues it, --overwrite replaces it")
    exists = check_output(output, what="--output", **options)
    record = dict(options)
    if not exists:   # a record left without its predictions file (removed by hand)
        record["hint"] = "its predictions file is gone: --overwrite starts afresh"
    check_output(provenance_path(output), what="--output's record", **record)
    if args.resume:
        if not exists:
            raise PipelineError(f"--resume: {output} does not exist yet")
        check_appendable(output, error=PipelineError)
    parent = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(parent):
        raise PipelineError(f"--output {output}: directory {parent} does not exist")
    return inputs, exists


def input_documents(args: argparse.Namespace) -> Tuple[Iterable[Any], Optional[int]]:
    """The documents --input holds, and how many (None when unknown): a task's split under
    --format task, else the records of the file. No document at all is a PipelineError (one
    line saying why) unless --allow-empty; standard input's first record is read to know."""
    from ernie_doc.predict.pipeline import task_documents, task_split
    if args.format == TASK_FORMAT:
        record = task_record(model_directories(args)[0], args.task)
        documents = task_documents(record, args.input, args.split)
        where = args.input or record["config"]["data_dir"]
        if not documents and not args.allow_empty:   # the task readers refuse this themselves
            split = f" (split {task_split(record, args.split)})" if os.path.isdir(where) else ""
            raise PipelineError(f"--input {where}: no documents: the {record['task']} reader "
                                f"read none{split}{ALLOW_EMPTY}")
        return documents, len(documents)
    documents = read_inputs(args.input, args.format)
    total = count_inputs(args.input, args.format)
    if total is None:   # standard input: read once, so its first record is held back
        first = next(documents, None)
        total = None if first is not None else 0
        documents = itertools.chain([] if first is None else [first], documents)
    if total == 0 and not args.allow_empty:
        raise PipelineError(no_documents(args.input, args.format) + ALLOW_EMPTY)
    return documents, total


def write_records(records: Iterable[dict], out: Any, counts: dict, progress: dict,
                  bar: Any, finish: Optional[Callable[[dict], dict]] = None) -> None:
    """Write each record as a line of `out`, flushed when complete (after a stop, --resume
    continues from it), counting documents and errors in `counts`, records in `progress` (and
    its first error record as "first_error"). `finish`: a record → the record to write (what
    goes beside it is written first)."""
    for record in records:
        if finish is not None:
            record = finish(record)
        out.write(record_line(record))   # UTF-8; never fails on a record
        out.flush()
        counts["errors" if "error" in record else "documents"] += 1
        if "error" in record:
            progress.setdefault("first_error", record)
        progress["records"] += 1
        bar.update(1)


def nothing_predicted(summary: dict, predicted_before: int,
                      first_error: Optional[dict]) -> Optional[str]:
    """The line for a run whose output holds error records alone (every document of this run
    an error, and none of the records --resume kept a prediction), or None. A run with one
    prediction or more, or no document at all (--allow-empty), did its job."""
    errors = summary["errors"] + summary["skipped"]
    if summary["documents"] or predicted_before or not errors:
        return None
    where = "standard output" if summary["output"] == STDIO else summary["output"]
    first = "" if first_error is None else \
        f" (the first, document {first_error['doc_id']!r}: {clip(first_error['error'], 300)})"
    return f"no document could be predicted: {where} holds {errors} error " \
           f"record{'s' * (errors != 1)} and no prediction{first}"


def report(args: argparse.Namespace, pipe: Any, counts: dict, seconds: float,
           predicted_before: int, first_error: Optional[dict]) -> dict:
    """Print the run's summary (JSON; on stderr when the records take standard output) →
    it. NothingPredicted (exit 1) when no document could be predicted."""
    summary = dict(counts, model=args.model, task=pipe.cfg.task, kind=pipe.cfg.kind,
                   output=args.output, seconds=round(seconds, 2),
                   documents_per_sec=round(counts["documents"] / max(seconds, 1e-9), 2))
    print(json.dumps(summary), file=sys.stderr if args.output == STDIO else sys.stdout)
    problem = nothing_predicted(summary, predicted_before, first_error)
    if problem:
        raise NothingPredicted(problem)
    return summary


def predict_pipeline(args: argparse.Namespace) -> Any:
    """The pipeline predict's arguments name."""
    from ernie_doc.predict.pipeline import pipeline
    return pipeline(args.model, args.answer_model, args.batch_size, args.on_error,
                    args.device, args.engine, args.precision, args.threads or 1,
                    task=args.task)


def run(args: argparse.Namespace, progress: Optional[dict] = None,
        build: Callable[[argparse.Namespace], Any] = predict_pipeline,
        finish: Optional[Callable[[dict], dict]] = None, desc: str = "predict",
        origin: Optional[dict] = None) -> dict:
    """Predict --input into --output → the run's summary (also printed as JSON); when every
    record is an error, NothingPredicted after the summary (`report`). `progress` (a dict,
    filled as the run goes): "created", whether --output holds this run's records, and
    "records", how many it holds: what Ctrl-C reports (`interrupted_line`). `build`: the
    arguments → the pipeline whose `stream` gives the records (`ernie-doc explain` passes its
    explainer); `finish`: see write_records; `desc`: the progress bar's; `origin`: what the
    sidecar records beside the model's fingerprint (explain: its name and settings), which
    --resume must find again.

    --output is written through its folder, opened once (ernie_doc.outputs.OutputFolder),
    and locked for the run; --resume reads the checked file's records before the model loads;
    otherwise the sidecar and a new file are complete before they replace the old output.
    --output -: the records alone go to standard output (summary, notes, progress: stderr)."""
    import ernie_doc.predict.pipeline  # noqa: F401  (paddle first: its absence is the line)
    progress = {} if progress is None else progress
    progress.update(created=False, records=0)
    inputs, checked = check_paths(args)
    origin = dict(records.provenance(*model_directories(args)), **(origin or {}))
    to_stdout, stdout = args.output == STDIO, sys.stdout
    with contextlib.ExitStack() as stack:
        folder = None
        if to_stdout:   # whatever else prints (notes, the summary) goes to stderr
            stack.enter_context(contextlib.redirect_stdout(sys.stderr))
        else:
            folder = stack.enter_context(OutputFolder(args.output, inputs, error=PipelineError,
                                                      writer="another ernie-doc predict"))
        documents, total = input_documents(args)   # refused before the model and --resume
        done, predicted_before = [], 0
        if args.resume:
            folder.open_append(checked)
            done, predicted_before = records.completed_records(args.output, origin, folder)
            progress.update(created=True, records=len(done))
        if args.threads:
            set_paddle_threads(args.threads, "--threads", PipelineError)
        pipe = build(args)
        counts = {"documents": 0, "errors": 0, "skipped": len(done)}
        start = time.perf_counter()
        bar = progress_bar(total=None if total is None else max(0, total - len(done)),
                           unit="doc", desc=desc, requested=not args.no_progress,
                           dynamic_ncols=True, mininterval=1.0)
        if folder is not None and not args.resume:
            folder.create({os.path.basename(records.provenance_path(args.output)):
                           records.provenance_bytes(origin)}, replace=args.overwrite)
        progress["created"] = True
        out = records_writer(stdout if to_stdout else folder.file)
        write_records(pipe.stream(documents, skip=done), out, counts, progress, bar, finish)
        if out is not stdout:
            out.detach()   # the file (or standard output) stays open for its owner
    bar.close()
    return report(args, pipe, counts, time.perf_counter() - start, predicted_before,
                  progress.get("first_error"))


def records_writer(target):
    """A text stream writing UTF-8 lines to `target` (a binary file, or a text stream: its
    byte buffer when it has one, so records are UTF-8 whatever the locale)."""
    if isinstance(target, io.TextIOBase):
        buffer = getattr(target, "buffer", None)
        if buffer is None:
            return target
        target.flush()
        target = buffer
    return io.TextIOWrapper(target, encoding="utf-8", newline="\n", write_through=True)


def interrupted_line(argv: List[str], output: str, progress: dict,
                     command: str = "predict") -> str:
    """The one line Ctrl-C prints: how many documents --output holds and the command that
    continues it (`argv`: predict's arguments, with --resume instead of --overwrite)."""
    records = progress.get("records", 0)
    if not (records if output == STDIO else progress.get("created")):
        return "interrupted before anything was written: run the same command again"
    line = f"interrupted after {records} documents"
    if output == STDIO:
        return line
    again = [a for a in argv if a not in ("--resume", "--overwrite")] + ["--resume"]
    return f"{line}: resume with ernie-doc {command} {shlex.join(again)}"


def main(argv: Optional[List[str]] = None) -> int:
    """Exit 2 with one `error:` line for bad model, input, document (--on-error fail) or output;
    exit 1 with one line when every document is an error record (the output keeps them);
    Ctrl-C: one line and 130 (the file holds complete records and its sidecar). --debug
    shows the traceback."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    progress: dict = {}
    return report_run(lambda: run(args, progress), args,
                      lambda: interrupted_line(argv, args.output, progress))


def command(argv: Optional[List[str]] = None) -> int:
    """The command line: the loaders' notes go to stdout with the summary, or to stderr with
    it when the records take standard output (--output -)."""
    return with_notes_on_stdout(main, argv)


if __name__ == "__main__":
    sys.exit(command())
