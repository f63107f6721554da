"""Measure how far back models look: for document models, the influence of the segment d
segments back on the last segment's prediction (occlusion |Δ| and gradient norm, by distance);
for language models, the loss as a function of the memory allowed at test time.

--output DIR receives context.json (every curve), context.md (one table) and context.png (the
curves). Runs named `<variant>-s<seed>` are also summarised per variant (mean, min–max over
seeds). Usage, definitions and costs: docs/explain.md, "How far back a model looks"."""
import argparse
import json
import os
import re
import sys
from typing import Any, Dict, List, Optional, Tuple

from ernie_doc.cli import report_run, with_notes_on_stdout
from ernie_doc.cli.explain import output_directory
from ernie_doc.cli.predict import TASK_FORMAT, check_input
from ernie_doc.errors import PipelineError
from ernie_doc.explain.render import new_figure, save_figure
from ernie_doc.kinds import saved_kind
from ernie_doc.outputs import InputSet
from ernie_doc.outputs import check_output as check_file
from ernie_doc.predict.documents import INPUT_FORMATS, read_inputs
from ernie_doc.predict.model_folder import model_directory, task_record
from ernie_doc.utils import atomic_path, progress_bar, set_paddle_threads

FILES = ("context.json", "context.md", "context.png")


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", help="fine-tuning runs (OUTPUT_DIR or best/), all "
                                             "document models or all language models")
    p.add_argument("--output", required=True, help="a directory (created if missing)")
    p.add_argument("--input", help="documents (as predict reads them), or a language model's "
                                   "evaluation text (a WikiText-style tokens file)")
    p.add_argument("--format", choices=INPUT_FORMATS + (TASK_FORMAT,), default="auto",
                   help="task: each model's own task reader reads --input (default: the "
                        "run's data_dir) as --split")
    p.add_argument("--split", choices=("train", "dev", "test"), default="dev",
                   help="--format task: the split (default dev)")
    p.add_argument("--documents", type=int, default=64,
                   help="documents of two segments or more measured per model (default 64)")
    p.add_argument("--mem-lens", help="language models: memory lengths, comma-separated "
                                      "(default 0, 32, 64, ... up to 4× the run's)")
    p.add_argument("--max-tokens", type=int, help="language models: evaluate the first N "
                                                  "tokens of --input (default: all)")
    p.add_argument("--batch-size", type=int, help="rows read at once")
    p.add_argument("--threads", type=int, default=0, help="CPU math threads (0: paddle's)")
    p.add_argument("--overwrite", action="store_true", help="replace the files of --output")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    args = p.parse_args(argv)
    if args.input is None and args.format != TASK_FORMAT:
        p.error("--input is required (except with --format task: each run's data)")
    for key in ("documents", "max_tokens", "batch_size"):
        value = getattr(args, key)
        if value is not None and value < 1:
            p.error(f"--{key.replace('_', '-')} must be a positive integer, got {value}")
    if args.threads < 0:
        p.error(f"--threads must be >= 0, got {args.threads}")
    return args


def variant_of(name: str) -> str:
    """A run's variant: its name without a `-s<seed>` suffix."""
    return re.sub(r"-s\d+$", "", name)


def run_name(path: str) -> str:
    """A run folder's name for the tables: its folder (best/ and final/ name their run)."""
    path = os.path.normpath(path)
    base = os.path.basename(path)
    return os.path.basename(os.path.dirname(path)) if base in ("best", "final") else base


def model_documents(args: argparse.Namespace, model: str) -> List[Any]:
    """The documents a document model is measured on: --input, or its own task's split."""
    from ernie_doc.predict.pipeline import task_documents
    if args.format == TASK_FORMAT:
        return task_documents(task_record(model_directory(model)), args.input, args.split)
    check_input(args.input, PipelineError)
    return list(read_inputs(args.input, args.format))


def measure_document_models(args: argparse.Namespace) -> Dict[str, Any]:
    """{run name: measure_documents' result} for every model."""
    from ernie_doc.explain.context import measure_documents
    from ernie_doc.explain.explainer import Explainer
    from ernie_doc.predict.pipeline import Pipeline
    found = {}
    for model in args.models:
        name = run_name(model)
        if name in found:
            raise PipelineError(f"{model}: two models named {name!r}: give runs of distinct "
                                f"names")
        pipe = Pipeline.from_pretrained(model, args.batch_size, threads=args.threads or 1)
        bar = progress_bar(total=args.documents, unit="doc", desc=f"context {name}",
                           requested=not args.no_progress)
        found[name] = dict(measure_documents(Explainer(pipe), model_documents(args, model),
                                             args.documents, bar), model=model,
                           recurrence=pipe.model.ernie_doc.config.recurrence,
                           retro_feed=bool(pipe.cfg.retro_feed))
        bar.close()
        if not found[name]["documents"]:
            raise PipelineError(f"{model}: no document of two segments or more to measure "
                                f"({found[name]['skipped']} skipped)")
    return found


def document_table(found: Dict[str, Any]) -> str:
    """The Markdown table of document models: per run, then per variant over its seeds."""
    lines = ["| run | recurrence | retro feed | documents | reach, occlusion | reach, gradient "
             "| \\|Δ\\| at d = 1, 2, 3 (÷ d = 0) |", "|---|---|---|---|---|---|---|"]
    for name, r in found.items():
        lines.append(f"| {name} | {r['recurrence']} | {'yes' if r['retro_feed'] else 'no'} | "
                     f"{r['documents']} | {reach_text(r['occlusion']['reach'])} | "
                     f"{reach_text(r['gradient']['reach'])} | "
                     f"{relative_text(r['occlusion']['mean'])} |")
    variants: Dict[str, List[Any]] = {}
    for name, r in found.items():
        variants.setdefault(variant_of(name), []).append(r)
    if any(len(v) > 1 for v in variants.values()):
        lines += ["", "| variant | seeds | reach, occlusion: mean (min–max) | reach, gradient: "
                      "mean (min–max) |", "|---|---|---|---|"]
        for variant, runs in variants.items():
            cells = []
            for method in ("occlusion", "gradient"):
                d = [r[method]["reach"]["distance"] for r in runs]
                more = "≥" if any(r[method]["reach"]["beyond"] for r in runs) else ""
                cells.append(f"{more}{sum(d) / len(d):.2f} ({min(d)}–{max(d)})")
            lines.append(f"| {variant} | {len(runs)} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines) + "\n"


def reach_text(reach: Dict[str, Any]) -> str:
    return ("≥ " if reach["beyond"] else "") + str(reach["distance"])


def relative_text(curve: List[float]) -> str:
    if not curve or curve[0] <= 0:
        return "–"
    return ", ".join(f"{v / curve[0]:.3f}" for v in curve[1:4]) or "–"


def plot_document_curves(found: Dict[str, Any]) -> Any:
    """context.png: occlusion |Δ| and gradient norm by distance, each run's curve divided by
    its value at d = 0, one colour per variant (log scale)."""
    fig = new_figure(10, 4)
    colours: Dict[str, str] = {}
    for i, method in enumerate(("occlusion", "gradient")):
        ax = fig.add_subplot(1, 2, i + 1)
        for name, r in found.items():
            curve = r[method]["mean"]
            if not curve or curve[0] <= 0:
                continue
            variant = variant_of(name)
            colour = colours.setdefault(variant, f"C{len(colours) % 10}")
            ax.plot(range(len(curve)), [max(v / curve[0], 1e-6) for v in curve], marker="o",
                    color=colour, label=variant if name == next(
                        n for n in found if variant_of(n) == variant) else None)
        ax.axhline(0.01, color="grey", linestyle=":", linewidth=1)
        ax.set_yscale("log")
        ax.set_xlabel("segments back from the last (d)")
        ax.set_ylabel("÷ influence at d = 0")
        ax.set_title("occlusion |Δ|" if method == "occlusion" else "gradient norm")
        ax.legend(fontsize=8)
    return fig


def measure_lm_models(args: argparse.Namespace) -> Dict[str, Any]:
    """measure_language_models for the language models of the arguments."""
    from ernie_doc.predict.lm_context import measure_language_models
    if args.input is None:
        raise PipelineError("language models: give --input, the evaluation text (a "
                            "WikiText-style tokens file)")
    check_input(args.input, PipelineError)
    if args.input.endswith((".jsonl", ".json", ".tsv")) or os.path.isdir(args.input):
        raise PipelineError(f"--input {args.input}: a language model reads a tokens file "
                            f"(WikiText-style text, one paragraph per line), not documents")
    mem_lens = None
    if args.mem_lens:
        try:
            mem_lens = [int(x) for x in args.mem_lens.split(",")]
        except ValueError:
            raise PipelineError(f"--mem-lens {args.mem_lens!r}: expected comma-separated "
                                f"integers such as 0,32,64") from None
    names = {}
    for model in args.models:
        if run_name(model) in names:
            raise PipelineError(f"{model}: two models named {run_name(model)!r}: give runs of "
                                f"distinct names")
        names[run_name(model)] = model
    return measure_language_models(names, args.input, mem_lens, args.max_tokens,
                                   args.batch_size, progress=not args.no_progress)


def check_output(args: argparse.Namespace) -> bool:
    """--output's directory, made if missing (its parent must exist) → whether this run made
    it. PipelineError (one line) when it is in a model folder or an input folder, or holds
    the files already without --overwrite."""
    inputs = InputSet([model_directory(m) for m in args.models] +
                      ([args.input] if args.input else []))
    present = [f for f in FILES if os.path.lexists(os.path.join(args.output, f))]
    if present and not args.overwrite:
        raise PipelineError(f"--output {args.output}: holds {', '.join(present)} already "
                            f"(--overwrite replaces them)")
    for name in FILES:   # the rule of every output file: never an input, nor in a model
        check_file(os.path.join(args.output, name), inputs, exists_ok=True,
                   error=PipelineError)
    return output_directory(args.output)


def measure(args: argparse.Namespace) -> Tuple[Dict[str, Any], Any]:
    """Measure every model → (what context.json holds, the figure)."""
    from ernie_doc.predict.lm_context import plot_memory_curves
    kinds = {saved_kind(task_record(model_directory(m))["kind"]).scores_tokens
             for m in args.models}
    if len(kinds) > 1:
        raise PipelineError("give document models or language models, not both")
    if kinds == {True}:
        result = measure_lm_models(args)
        return result, plot_memory_curves(result)
    found = measure_document_models(args)
    result = {"kind": "document", "runs": found, "table": document_table(found)}
    return result, plot_document_curves(found)


def run(args: argparse.Namespace) -> Dict[str, Any]:
    """Measure every model and write --output's three files, all or none → what context.json
    holds. The files are written once every measurement is done."""
    new_figure(1, 1)   # no matplotlib: one line now, not after the measuring
    made = check_output(args)
    try:
        if args.threads:
            set_paddle_threads(args.threads, "--threads", PipelineError)
        result, figure = measure(args)
        paths = [os.path.join(args.output, name) for name in FILES]
        with atomic_path(paths[0]) as js, atomic_path(paths[1]) as md, \
                atomic_path(paths[2]) as png:   # renamed together, at the end
            with open(js, "w", encoding="utf-8") as f:
                f.write(json.dumps(result, indent=1) + "\n")
            with open(md, "w", encoding="utf-8") as f:
                f.write(result["table"])
            save_figure(figure, png)
    finally:
        if made and not os.listdir(args.output):   # ours, and nothing was written in it
            os.rmdir(args.output)
    print(result["table"])
    return result


def main(argv: Optional[List[str]] = None) -> int:
    """Exit 2 with one `error:` line for a bad model, input or output; Ctrl-C: one line and
    130, nothing written; --debug: the traceback."""
    args = parse_args(argv)
    return report_run(lambda: run(args), args,
                      lambda: "interrupted: nothing written; run the same command again",
                      target_is_dir=True)


def command(argv: Optional[List[str]] = None) -> int:
    return with_notes_on_stdout(main, argv)


if __name__ == "__main__":
    sys.exit(command())
