"""Explain predictions: which segments and words of each document drove the model's decision.

    ernie-doc explain output/imdb --input reviews/ --output why/ [--method gradient]

--output DIR receives `explanations.jsonl` (one JSON line per document) and, per document, a
PNG of the segment scores and an HTML page of the text coloured by attribution. The documents,
error records, --resume and the output checks are predict's. Methods and costs: docs/explain.md."""
import argparse
import os
import re
import sys
from typing import Any, List, Optional

from ernie_doc.cli import report_run, with_notes_on_stdout
from ernie_doc.cli.predict import check_args, common_arguments, interrupted_line
from ernie_doc.cli.predict import run as predict_run
from ernie_doc.errors import PipelineError
from ernie_doc.explain.render import figure_names, render_html, render_png
from ernie_doc.kinds import saved_kind
from ernie_doc.predict.model_folder import model_directory, task_record

RECORDS = "explanations.jsonl"
LEAN = ("token_scores", "texts")   # kept out of the JSON line: the page shows them


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    from ernie_doc.explain.attribution import METHODS, REPLACEMENTS
    from ernie_doc.explain.explainer import MAX_SEGMENTS, TOP_TOKENS
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_arguments(p, f"a directory: {RECORDS} and each document's PNG and HTML page "
                        f"(created if missing; its parent must exist)")
    p.add_argument("--method", choices=METHODS, default="occlusion",
                   help="occlusion (exact: one extra read per segment), gradient (one "
                        "forward + backward through the memories) or integrated_gradients "
                        "(--steps of them)")
    p.add_argument("--target", help="what to explain: a label (classification, pair "
                                    "matching), a choice's index or text, an answer's text "
                                    "(span QA); default: the prediction. A language model: "
                                    "the token span T0:T1 whose log-probability is explained "
                                    "(token indices, words and <eos>; default: each "
                                    "document's last eval_tgt_len tokens)")
    p.add_argument("--replace", choices=REPLACEMENTS, default=None,
                   help="the token a segment's tokens become (occlusion), and the gradients' "
                        "baseline (default pad; a language model always uses <unk>)")
    p.add_argument("--steps", type=int, default=16,
                   help="integrated gradients: points along the path (default 16)")
    p.add_argument("--max-segments", type=int, default=MAX_SEGMENTS,
                   help=f"occlusion: a document of more segments is an error record "
                        f"(default {MAX_SEGMENTS})")
    p.add_argument("--top-tokens", type=int, default=TOP_TOKENS,
                   help=f"tokens listed in each JSON line (default {TOP_TOKENS})")
    p.add_argument("--no-png", action="store_true", help="write no PNG")
    p.add_argument("--no-html", action="store_true", help="write no HTML page")
    args = p.parse_args(argv)
    args.answer_model, args.engine, args.precision = None, "dygraph", "fp32"
    if args.output == "-":
        p.error("--output is a directory (explain writes a PNG and a page per document)")
    for key in ("steps", "max_segments"):
        if getattr(args, key) < 1:
            p.error(f"--{key.replace('_', '-')} must be a positive integer, got "
                    f"{getattr(args, key)}")
    if args.top_tokens < 0:
        p.error(f"--top-tokens must be >= 0, got {args.top_tokens}")
    check_args(p, args)
    return args


def explainer(args: argparse.Namespace) -> Any:
    """The explainer the arguments ask for: LMExplainer on a language model's LMPipeline,
    else Explainer on the model's Pipeline."""
    directory = model_directory(args.model, args.task)
    if saved_kind(task_record(directory, args.task)["kind"]).scores_tokens:
        return lm_explainer(args, directory)
    from ernie_doc.explain.explainer import Explainer
    from ernie_doc.predict.pipeline import Pipeline
    pipe = Pipeline.from_pretrained(args.model, args.batch_size, args.on_error, args.device,
                                    "dygraph", "fp32", args.threads or 1, task=args.task)
    return Explainer(pipe, args.method, args.target, args.replace or "pad", args.steps,
                     args.max_segments, args.top_tokens, progress=not args.no_progress)


def lm_explainer(args: argparse.Namespace, directory: str) -> Any:
    """LMExplainer for the language model in `directory` (--target: the span T0:T1)."""
    from ernie_doc.explain.lm import LMExplainer, parse_span
    from ernie_doc.predict.lm import LMPipeline
    if args.replace is not None:
        raise PipelineError(f"--replace {args.replace}: a language model's segments become "
                            f"<unk> (it has no [PAD] or [MASK]); leave --replace out")
    span = None if args.target is None else parse_span(args.target)
    pipe = LMPipeline.from_pretrained(directory, args.batch_size, args.on_error, args.device)
    return LMExplainer(pipe, args.method, span, args.steps, args.top_tokens,
                       progress=not args.no_progress, max_segments=args.max_segments)


def figure_writer(args: argparse.Namespace, directory: str):
    """record → the record to write: a document's PNG and HTML page written first (each
    atomically), named in its "files"; the long per-token fields left out."""
    def finish(record: dict) -> dict:
        if "error" in record:
            return record
        png, page = figure_names(record["index"], record["doc_id"])
        files = {}
        if not args.no_png:
            render_png(record, os.path.join(directory, png))
            files["png"] = png
        if not args.no_html:
            render_html(record, os.path.join(directory, page))
            files["html"] = page
        lean = {k: v for k, v in record.items() if k not in LEAN}
        return dict(lean, files=files)
    return finish


def output_directory(path: str) -> bool:
    """Make --output's directory (its parent must exist) → whether this run created it;
    PipelineError (one line) for a path that is no directory."""
    if os.path.isdir(path):
        return False
    if os.path.lexists(path):
        raise PipelineError(f"--output {path}: exists and is not a directory (explain "
                            f"writes a directory)")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise PipelineError(f"--output {path}: directory {parent} does not exist")
    os.mkdir(path)
    return True


def foreign_figures(directory: str) -> List[str]:
    """The files of `directory` named like explain's figures (render.figure_names)."""
    if not os.path.isdir(directory):
        return []
    return sorted(n for n in os.listdir(directory) if re.fullmatch(r"\d{5,}-.*\.(png|html)", n))


def run(args: argparse.Namespace, progress: Optional[dict] = None) -> dict:
    """Explain --input into --output (see the module docstring) → the run's summary. A new
    run (neither --resume nor --overwrite) never replaces a file named like a figure."""
    directory = args.output
    found = [] if args.resume or args.overwrite else foreign_figures(directory)
    if found:
        raise PipelineError(f"--output {directory}: holds {found[0]}"
                            f"{f' and {len(found) - 1} more' if len(found) > 1 else ''} "
                            f"named like this command's figures; give a new directory "
                            f"(--overwrite replaces them)")
    created = output_directory(directory)
    records = argparse.Namespace(**vars(args))
    records.output = os.path.join(directory, RECORDS)
    try:
        settings = {k: getattr(args, k) for k in ("method", "target", "replace", "steps")}
        if args.method != "integrated_gradients":
            settings["steps"] = None   # the others take no steps
        if args.replace == "pad":
            settings["replace"] = None   # the default, given or not
        return predict_run(records, progress, explainer, figure_writer(args, directory),
                           desc="explain", origin={"written_by": "ernie-doc explain",
                                                   "settings": settings})
    finally:
        if created and not os.listdir(directory):   # ours, and nothing was written in it
            os.rmdir(directory)


def main(argv: Optional[List[str]] = None) -> int:
    """Exit statuses as predict's: 2 with one `error:` line for bad model, input, document
    (--on-error fail) or output; 1 when every document is an error record; Ctrl-C: 130."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    progress: dict = {}
    return report_run(lambda: run(args, progress), args,
                      lambda: interrupted_line(argv, args.output, progress, "explain"),
                      target_is_dir=True)


def command(argv: Optional[List[str]] = None) -> int:
    """The command line (the loaders' notes go to stdout with the summary)."""
    return with_notes_on_stdout(main, argv)


if __name__ == "__main__":
    sys.exit(command())
