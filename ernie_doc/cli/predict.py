"""Predict documents with a fine-tuned model: one JSON line per document, written as it goes.

    ernie-doc predict output/imdb --input reviews/ --output preds.jsonl
    ernie-doc predict output/cmrc2018/best --input questions.jsonl --output answers.jsonl
    ernie-doc predict MODEL --input big.jsonl --output preds.jsonl --resume   # after a stop

MODEL is a fine-tuning run's OUTPUT_DIR (its best/, else final/) or such a directory itself.
--input: a .txt file (one document), a directory of .txt files (one document each), a TSV file
with a header row (columns are the task's fields: `text` for classification; `context`,
`question` for span QA ...; `id` names the document), or JSON lines with those fields
(`choices` as a list for multiple choice). Each document is read exactly as evaluation reads
it (ernie_doc.pipeline). A document that cannot be predicted (empty, not UTF-8, a missing
field) gets a line with an `error` field, or with --on-error fail stops the run with one
line naming it. The last line of --output is a complete record at every moment but the one
being written; --resume drops a line cut short and skips the documents already there.
"""
import argparse
import json
import os
import sys
import time
import zlib  # noqa: F401  before paddle (2.6.2 import-order bug, see ernie_doc/__init__)
from typing import List, Optional


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    from ernie_doc.pipeline import ENGINES, INPUT_FORMATS, ON_ERROR
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="a fine-tuning run's OUTPUT_DIR, or its best/ or final/")
    p.add_argument("--input", required=True, help="a .txt file, a directory of .txt files, a "
                                                  ".tsv file with a header row, or .jsonl")
    p.add_argument("--output", required=True, help="predictions, one JSON object per line")
    p.add_argument("--answer-model", help="HotpotQA: the answer-stage model; MODEL is then the "
                                          "evidence-stage model, whose selection it reads")
    p.add_argument("--format", choices=INPUT_FORMATS, default="auto",
                   help="input format (default: from the path)")
    p.add_argument("--batch-size", type=int, help="rows read at once (default: the run's "
                                                  "eval_batch_size, else batch_size)")
    p.add_argument("--engine", choices=ENGINES, default="auto",
                   help="dygraph, or inference (an export under paddle.inference); default: "
                        "inference for an exported model, else dygraph")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32",
                   help="engine inference: bf16 on a CPU with AVX512-BF16 / AMX, fp16 / bf16 "
                        "on GPU")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--on-error", choices=ON_ERROR, default="record",
                   help="record: a line with an error field for a bad document (default); "
                        "fail: stop with one error line")
    p.add_argument("--resume", action="store_true",
                   help="continue --output: skip the documents already in it")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    p.add_argument("--threads", type=int, default=0,
                   help="CPU math threads (0: paddle's default; engine inference: 1)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    args = p.parse_args(argv)
    if args.batch_size is not None and args.batch_size < 1:
        p.error(f"--batch-size must be a positive integer, got {args.batch_size}")
    if args.threads < 0:
        p.error(f"--threads must be >= 0, got {args.threads}")
    if args.resume and args.overwrite:
        p.error("--resume and --overwrite exclude each other")
    return args


def check_paths(args: argparse.Namespace) -> None:
    """Input and output checked before the model is loaded (PipelineError: one line)."""
    from ernie_doc.pipeline import PipelineError
    from ernie_doc.utils import regular_file_problem
    if not os.path.exists(args.input):
        raise PipelineError(f"--input {args.input}: no such file or directory")
    if not os.path.isdir(args.input):
        problem = regular_file_problem(args.input, "--input")
        if problem:
            raise PipelineError(problem)
    output = args.output
    if os.path.isdir(output):
        raise PipelineError(f"--output {output}: is a directory; give a file name")
    if os.path.abspath(output) == os.path.abspath(args.input):
        raise PipelineError(f"--output {output}: is the input")
    exists = os.path.exists(output)
    if exists and not (args.resume or args.overwrite):
        raise PipelineError(f"--output {output}: exists; --resume continues it, --overwrite "
                            f"replaces it")
    if args.resume and not exists:
        raise PipelineError(f"--resume: {output} does not exist yet")
    parent = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(parent):
        raise PipelineError(f"--output {output}: directory {parent} does not exist")


def run(args: argparse.Namespace) -> dict:
    """Predict --input into --output → the run's summary (also printed as JSON)."""
    from tqdm import tqdm

    from ernie_doc.pipeline import completed_ids, count_inputs, pipeline, read_inputs, to_jsonable
    from ernie_doc.utils import set_paddle_threads
    check_paths(args)
    if args.threads:
        set_paddle_threads(args.threads)
    pipe = pipeline(args.model, args.answer_model, args.batch_size, args.on_error, args.device,
                    args.engine, args.precision, args.threads or 1)
    done = completed_ids(args.output) if args.resume else []
    total = count_inputs(args.input, args.format)
    counts = {"documents": 0, "errors": 0, "skipped": len(done)}
    start = time.perf_counter()
    bar = tqdm(total=None if total is None else max(0, total - len(done)), unit="doc",
               desc="predict", disable=args.no_progress, dynamic_ncols=True, mininterval=1.0)
    # append: what an earlier (resumed) run wrote stays; each line is flushed when complete
    with open(args.output, "a" if args.resume else "w", encoding="utf-8") as out:
        for record in pipe.stream(read_inputs(args.input, args.format), skip=done):
            out.write(json.dumps(to_jsonable(record), ensure_ascii=False) + "\n")
            out.flush()
            counts["errors" if "error" in record else "documents"] += 1
            bar.update(1)
    bar.close()
    seconds = time.perf_counter() - start
    summary = dict(counts, model=args.model, task=pipe.cfg.task, kind=pipe.cfg.kind,
                   output=args.output, seconds=round(seconds, 2),
                   documents_per_sec=round(counts["documents"] / max(seconds, 1e-9), 2))
    print(json.dumps(summary))
    return summary


def main(argv: Optional[List[str]] = None) -> int:
    """Exit 2 with one `error:` line for a bad model directory, input or document (--on-error
    fail) and for an output that cannot be written; --debug shows the traceback."""
    args = parse_args(argv)
    from ernie_doc.checkpoint.errors import CheckpointError
    from ernie_doc.config import ConfigError
    from ernie_doc.data import DataError
    from ernie_doc.pipeline import PipelineError
    from ernie_doc.tokenization import TokenizerError
    from ernie_doc.utils import exit_on_user_error, write_error_types
    expected = (PipelineError, ConfigError, DataError, CheckpointError, TokenizerError)
    try:
        run(args)
        return 0
    except expected + write_error_types() as e:
        exit_on_user_error(e, expected, args.debug, args.output, what="--output",
                           target_is_dir=False)
        raise


def command(argv: Optional[List[str]] = None) -> int:
    from ernie_doc.cli import with_notes_on_stdout
    return with_notes_on_stdout(main, argv)


if __name__ == "__main__":
    sys.exit(command())
