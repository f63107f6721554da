#!/usr/bin/env python
"""Does our pretraining help real tasks? Scratch vs MLM vs MLM + segment reordering, fine-tuned
on IMDB and Hyperpartisan, several seeds each: one command from the datasets to the table.

    python tools/transfer_experiment.py --data DATA --output-dir OUT [--jobs 2]

DATA holds `imdb/imdb_test_sample5k.tsv` and `hyperpartisan/` (with `hp-splits.json`), and
optionally `wikitext103/wiki.{valid,test}.tokens`. Steps, each skipped when its output is
complete (so a stopped run continues where it stopped; a run cut short resumes from its last
checkpoint):

1. corpus: the unlabelled **training** text of both tasks (task-adaptive pretraining): the IMDB
   reviews of the README's 80/20 split's train part, the Hyperpartisan train articles, plus the
   WikiText-103 articles when present. A document whose id or text is in a dev or test split,
   or that shares half its word 8-grams (or half a dev/test document's) with one, is left out,
   and that is asserted on the written corpus (`check_corpus`). 5 % of the corpus
   documents (by hash) are held out for the pretraining evaluation.
2. tokenizer: SentencePiece (unigram, `--vocab-size`) trained on the corpus, used by every run.
3. pretraining: configs/pretrain/transfer.yaml twice, MLM only (one chunk, so nothing is
   reordered, and reorder weight 0) and MLM + reordering (the paper's objective).
4. fine-tuning: each task from scratch (the same architecture, new weights), from the MLM
   checkpoint and from the MLM + reordering one, with the same settings, for each seed.
5. why: IMDB again from only WHY_REVIEWS train reviews, each start at the WHY_RATES learning
   rates (3e-4, the fine-tuning's, and 1e-4) whatever --finetune-set gives, for each IMDB seed
   (OUT/why/): does a pretrained start help when labels are few, and was its rate too large?
6. OUT/transfer_results.{json,md}: dev (and Hyperpartisan test) metrics, every seed, mean ± sd,
   the few-labels table, and per task the kept model of the best starting point's best seed (a
   directory `ernie-doc predict` runs on); OUT/transfer_curves.png: pretraining and
   fine-tuning curves.

Runs go through tools/ablation.py (--jobs N runs at once, one CPU thread each). What the steps
were made from may not change under them: a corpus that would differ from the one the tokenizer
and the runs read, or a tokenizer of another --vocab-size, is one error line (a new
--output-dir starts afresh); a fine-tuning run older than the pretrained model it starts from
(a pretraining run again, after its config file was edited) runs again. --pretrain-set /
--finetune-set are checked before any step, and may not set what the experiment fixes (FIXED:
the data, the splits, the tokenizer, the starts).
"""
import argparse
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# a run's JSON-lines logs, read as the trainer reads them back (none yet: []; a cut-short last
# line of a run still writing is dropped)
from ernie_doc.training.runlog import read_jsonl  # noqa: E402

WIKITEXT = ("wiki.valid.tokens", "wiki.test.tokens")
HELD_OUT_SHARE = 0.05
# a corpus document sharing this part of its own or of a dev/test document's word 8-grams
# (of the shorter one's) is that document again
NEAR_DUPLICATE = 0.5
STARTS = ("scratch", "mlm", "mlm_sro")
PRETRAIN = {  # start → the pretraining run's overrides
    "mlm": ["task_options.max_chunks=1", "task_options.reorder_weight=0"],
    "mlm_sro": [],
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="the datasets folder (imdb/, hyperpartisan/)")
    p.add_argument("--output-dir", required=True)
    p.add_argument("--jobs", type=int, default=2, help="runs at once, one thread each")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--imdb-seeds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--hyp-seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--pretrain-set", nargs="+", default=[], metavar="KEY=VALUE",
                   help="overrides for both pretraining runs")
    p.add_argument("--finetune-set", nargs="+", default=[], metavar="KEY=VALUE",
                   help="overrides for every fine-tuning run")
    steps = ["corpus", "tokenizer", "pretrain", "finetune", "why", "table"]
    p.add_argument("--steps", nargs="+", default=steps, choices=steps,
                   help="why: IMDB from few labels at two learning rates (needs imdb in "
                        "--tasks)")
    return p.parse_args(argv)


# -- 1. the corpus ------------------------------------------------------------------------------
def fingerprint(text: str) -> str:
    """A document's text up to whitespace and case, hashed: the same review or article under
    another id (IMDB holds duplicate reviews) is still the same document."""
    return hashlib.sha1(" ".join(text.lower().split()).encode("utf-8")).hexdigest()


def reader_options(task: str) -> dict:
    """The task's reader options as its fine-tuning runs get them (its config file with the
    experiment's overrides; --finetune-set may not change them): the splits the corpus is
    checked against are the runs' splits."""
    from ernie_doc.run_config import load_config
    config, _, own = TASKS[task]
    return dict(load_config(os.path.join(ROOT, config), own).reader)


def task_documents(data: str) -> Dict[str, Dict[str, list]]:
    """{task: {split: [Document]}} as the fine-tuning runs read them."""
    from tasks.hyp import reader as hyp
    from tasks.imdb import reader as imdb
    imdb_dir, hyp_dir = os.path.join(data, "imdb"), os.path.join(data, "hyperpartisan")
    imdb_options, hyp_options = reader_options("imdb"), reader_options("hyp")
    return {"imdb": {s: imdb.read(imdb_dir, s, imdb_options) for s in ("train", "dev")},
            "hyp": {s: hyp.read(hyp_dir, s, hyp_options) for s in ("train", "dev", "test")}}


class HeldOut:
    """Every dev and test document: its ("task", doc_id), its text's fingerprint and its word
    8-grams, so a document can be told apart from all of them by id, by text and by near-
    duplicate text (IMDB holds the same review with another rating line, Hyperpartisan the same
    article with another site's boilerplate)."""

    def __init__(self, splits: Dict[str, Dict[str, list]]):
        self.ids, self.texts, self.grams, self.sizes = set(), set(), {}, {}
        for task, by_split in splits.items():
            for split, docs in by_split.items():
                if split == "train":
                    continue
                for d in docs:
                    self.ids.add((task, d.doc_id))
                    self.texts.add(fingerprint(d.text))
                    grams = shingles(d.text)
                    self.sizes[f"{task}/{d.doc_id}"] = len(grams)
                    for g in grams:
                        self.grams.setdefault(g, []).append(f"{task}/{d.doc_id}")

    def near(self, text: str) -> Optional[Tuple[str, float]]:
        """The dev/test document ("task/id") sharing the largest part of the smaller one's
        8-grams with `text`, and that part, when it is at least NEAR_DUPLICATE; else None."""
        grams = shingles(text)
        shared: Dict[str, int] = {}
        for g in grams:
            for doc in set(self.grams.get(g, ())):
                shared[doc] = shared.get(doc, 0) + 1
        best = max(((n / min(len(grams), self.sizes[doc]), doc) for doc, n in shared.items()),
                   default=None)
        return (best[1], best[0]) if best and best[0] >= NEAR_DUPLICATE else None

    def why(self, source: str, doc_id: str, text: str) -> Optional[Tuple[str, str]]:
        """Why this document must stay out of the corpus → (the reason, the dev/test document
        it nearly duplicates, or ""), or None."""
        if (source, doc_id) in self.ids:
            return "id in a dev/test split", ""
        if fingerprint(text) in self.texts:
            return "text in a dev/test split", ""
        near = self.near(text)
        return ("near-duplicate of a dev/test text", f"{near[0]}, {near[1]:.2f} of 8-grams") \
            if near else None


def shingles(text: str, n: int = 8) -> set:
    """The text's word n-grams, lower-cased, punctuation dropped."""
    words = re.findall(r"\w+", text.lower())
    return {" ".join(words[i:i + n]) for i in range(len(words) - n + 1)}


def corpus_records(data: str, splits: Dict[str, Dict[str, list]],
                   held: "HeldOut") -> Tuple[List[dict], dict]:
    """The corpus documents ({"id", "source", "text"}) and what was left out, by source."""
    from ernie_doc.pretraining.corpus import iter_documents
    records, left_out, seen = [], {}, set()
    candidates = [(task, d.doc_id, d.text) for task, by_split in splits.items()
                  for d in by_split["train"]]
    wiki = [os.path.join(data, "wikitext103", f) for f in WIKITEXT]
    if all(os.path.isfile(f) for f in wiki):
        candidates += [("wikitext103", d.doc_id, d.text)
                       for d in iter_documents(wiki, split="wikitext")]
    for source, doc_id, text in candidates:
        key = fingerprint(text)
        why = held.why(source, doc_id, text) or (("duplicate text", "") if key in seen else None)
        if why:   # the manifest groups by reason: the near-duplicate's match by the id
            reason, match = why
            entry = f"{doc_id} ({match})" if match else doc_id
            left_out.setdefault(source, {}).setdefault(reason, []).append(entry)
            continue
        seen.add(key)
        records.append({"id": f"{source}/{doc_id}", "source": source, "text": text})
    return records, left_out


def is_held_out_for_eval(record: dict) -> bool:
    digest = hashlib.sha1(("eval:" + record["id"]).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0 ** 64 < HELD_OUT_SHARE


def check_corpus(paths: Sequence[str], held: HeldOut) -> int:
    """Read the written corpus files back: a document of a dev or test split in them, by id, by
    text or by near-duplicate text, is a ValueError → the number of documents checked."""
    n = 0
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                record = json.loads(line)
                source, _, doc_id = record["id"].partition("/")
                why = held.why(source, doc_id, record["text"])
                if why:
                    reason = f"{why[0]}: {why[1]}" if why[1] else why[0]
                    raise ValueError(f"{path}: {record['id']} is a dev or test document "
                                     f"({reason})")
                n += 1
    return n


def build_corpus(data: str, out: str) -> dict:
    """OUT/corpus/{train,heldout}.jsonl, tokenizer.txt (the same text, a line per ~100 words,
    for SentencePiece) and manifest.json (counts, what was left out and why)."""
    from ernie_doc.utils import atomic_write_text
    splits = task_documents(data)
    held = HeldOut(splits)
    records, left_out = corpus_records(data, splits, held)
    folder = os.path.join(out, "corpus")
    os.makedirs(folder, exist_ok=True)
    parts = {"train": [r for r in records if not is_held_out_for_eval(r)],
             "heldout": [r for r in records if is_held_out_for_eval(r)]}
    files = {f"{name}.jsonl": "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in part)
             for name, part in parts.items()}
    lines = []
    for r in parts["train"]:   # sentencepiece skips lines over 4,192 bytes
        words = r["text"].split()
        lines += [" ".join(words[i:i + 100]) for i in range(0, len(words), 100)]
    files["tokenizer.txt"] = "\n".join(lines) + "\n"
    keep_or_write(out, files)
    checked = check_corpus([os.path.join(folder, f"{n}.jsonl") for n in parts], held)
    manifest = {
        "documents": {n: len(p) for n, p in parts.items()},
        "words": {n: sum(len(r["text"].split()) for r in p) for n, p in parts.items()},
        "by_source": {s: sum(r["source"] == s for r in records)
                      for s in sorted({r["source"] for r in records})},
        "left_out": {s: {why: sorted(v) for why, v in reasons.items()}
                     for s, reasons in left_out.items()},
        "checked_against_dev_and_test": checked,
        "task_splits": {t: {s: len(d) for s, d in by.items()} for t, by in splits.items()},
    }
    atomic_write_text(os.path.join(folder, "manifest.json"), json.dumps(manifest, indent=1))
    return manifest


def keep_or_write(out: str, files: Dict[str, str]) -> None:
    """Write OUT/corpus/<name> for each {name: text}; a file that holds that text already is
    left as it is. Once the tokenizer or a pretraining run exists, a corpus that would change
    (other data under --data, other code) is a DataError: what they were made from must not
    change under them (their runs would be skipped as finished)."""
    from ernie_doc.errors import DataError
    from ernie_doc.utils import atomic_write_text
    folder = os.path.join(out, "corpus")
    users = [d for d in ("tokenizer", "pretrain") if os.path.exists(os.path.join(out, d))]
    for name, text in files.items():
        path = os.path.join(folder, name)
        try:
            with open(path, encoding="utf-8") as f:
                if f.read() == text:
                    continue
        except (OSError, ValueError):   # none yet, or unreadable: written anew
            pass
        if users and os.path.exists(path):
            raise DataError(f"{path}: the corpus built from --data now differs from this one, "
                            f"which {out}/{{{','.join(users)}}} were made from; give a new "
                            f"--output-dir (or delete those)")
        atomic_write_text(path, text)


# -- 2. the tokenizer, 3. pretraining, 4. fine-tuning: runs --------------------------------------
def run(cmd: List[str]) -> None:
    """Run a step's command from the caller's directory (where --output-dir and --data are
    meant); a failure ends the experiment with its exit status (the step's own error line is
    already on the screen)."""
    print("$ " + " ".join(cmd), flush=True)
    code = subprocess.call(cmd)
    if code:
        sys.exit(code)


def train_tokenizer(out: str, vocab_size: int) -> None:
    target = os.path.join(out, "tokenizer")
    model = os.path.join(target, "spm.model")
    if os.path.isfile(model):   # trained before: with this vocabulary size?
        import sentencepiece

        from ernie_doc.errors import ConfigError
        size = sentencepiece.SentencePieceProcessor(model_file=model).get_piece_size()
        if size != vocab_size:
            raise ConfigError(f"{model}: has {size} pieces, not --vocab-size {vocab_size}; "
                              f"pass --vocab-size {size}, or give a new --output-dir (the "
                              f"runs in it read this tokenizer)")
        return
    run([sys.executable, os.path.join(ROOT, "tools", "train_tokenizer.py"), "--input",
         os.path.join(out, "corpus", "tokenizer.txt"), "--output-dir", target,
         "--vocab-size", str(vocab_size)])


def ablation(config: str, out: str, jobs: int, common: List[str],
             variants: Dict[str, List[str]]) -> None:
    """tools/ablation.py: every variant of `config` in out/<variant>, finished ones skipped."""
    cmd = [sys.executable, os.path.join(ROOT, "tools", "ablation.py"), os.path.join(ROOT, config),
           "--output-dir", out, "--jobs", str(jobs), "--skip-done", "--progress-seconds", "300"]
    for name, overrides in variants.items():
        cmd += ["--variant", name] + overrides
    run(cmd + ["--set"] + common if common else cmd)


PRETRAIN_CONFIG = "configs/pretrain/transfer.yaml"


def pretrain_common(args: argparse.Namespace) -> List[str]:
    """Both pretraining runs' overrides: the corpus, the tokenizer, then --pretrain-set."""
    corpus = os.path.join(args.output_dir, "corpus")
    return [f"data_dir={os.path.join(corpus, 'train.jsonl')}",
            f"reader.eval_corpus={os.path.join(corpus, 'heldout.jsonl')}",
            f"tokenizer={os.path.join(args.output_dir, 'tokenizer')}"] + args.pretrain_set


def pretrain(args: argparse.Namespace) -> None:
    ablation(PRETRAIN_CONFIG, os.path.join(args.output_dir, "pretrain"), args.jobs,
             pretrain_common(args), PRETRAIN)


# Every fine-tuning run, whatever its start: the same settings (the model's shape, dropout and
# memory come from the pretraining's final/config.json, for scratch too).
FINETUNE_COMMON = ["max_seq_len=128", "batch_size=16", "learning_rate=3e-4",
                   "warmup_proportion=0.1", "weight_decay=0.01", "layer_decay=1.0",
                   "retro_feed=true", "threads=1", "logging_steps=50",
                   "save_steps=100"]   # a killed run resumes (tools/ablation.py --skip-done)
TASKS = {  # task → (config, data folder, its own settings)
    "imdb": ("tasks/imdb/config.yaml", "imdb",
             ["reader.file=imdb_test_sample5k.tsv", "reader.dev_ratio=0.2", "epochs=1"]),
    "hyp": ("tasks/hyp/config.yaml", "hyperpartisan", ["epochs=2"]),
}


def pretrained_final(out: str, start: str) -> str:
    """OUT/pretrain/<run>/final, the model a start comes from: its own pretraining, or for
    scratch the MLM + reordering one (only its config: the same architecture)."""
    return os.path.join(out, "pretrain", "mlm_sro" if start == "scratch" else start, "final")


def run_name(start: str, seed: int, rate: Optional[str] = None) -> str:
    """A fine-tuning run's folder: <start>-s<seed>, or <start>-lr<rate>-s<seed> for the why
    runs; forget_stale reads the start back as the part before the first "-"."""
    return f"{start}-lr{rate}-s{seed}" if rate else f"{start}-s{seed}"


def start_overrides(out: str, start: str) -> List[str]:
    """Scratch takes the pretrained model's config (its architecture) and new weights; the
    others its weights (init_checkpoint: every encoder tensor, the pretraining heads dropped)."""
    final = pretrained_final(out, start)
    return [f"model={final}"] if start == "scratch" else [f"init_checkpoint={final}"]


def finetune_common(args: argparse.Namespace, task: str) -> List[str]:
    """Every fine-tuning run's overrides for `task`: its data, the tokenizer, the shared
    settings, the task's own, then --finetune-set."""
    _, folder, own = TASKS[task]
    return ([f"data_dir={os.path.join(args.data, folder)}",
             f"tokenizer={os.path.join(args.output_dir, 'tokenizer')}"]
            + FINETUNE_COMMON + own + args.finetune_set)


def forget_stale(out: str, folder: str, names: Sequence[str]) -> List[str]:
    """Remove the done and started files of each fine-tuning run OUT/<folder>/<name> begun
    before the pretrained model it starts from (the first part of its name) was written (a
    pretraining that ran again since: same command, another model), so it runs again from the
    start → the runs forgotten."""
    forgotten = []
    for name in names:
        final = os.path.join(pretrained_final(out, name.split("-", 1)[0]), "config.json")
        for record in (f"{name}.done.json", f"{name}.started.json"):
            path = os.path.join(out, folder, record)
            try:
                stale = os.path.getmtime(path) < os.path.getmtime(final)
            except OSError:   # not run, or no pretrained model (the run then says so)
                continue
            if stale:
                os.remove(path)
                if name not in forgotten:
                    forgotten.append(name)
                    print(f"[{name}] its pretrained model is newer: run again", flush=True)
    return forgotten


def task_seeds(args: argparse.Namespace) -> Dict[str, List[int]]:
    """{task: its seeds} of the tasks this run covers."""
    return {t: {"imdb": args.imdb_seeds, "hyp": args.hyp_seeds}[t] for t in args.tasks}


def finetune(args: argparse.Namespace) -> None:
    seeds = task_seeds(args)
    for task in args.tasks:
        variants = {run_name(start, seed): start_overrides(args.output_dir, start)
                    + [f"seed={seed}"] for seed in seeds[task] for start in STARTS}
        forget_stale(args.output_dir, task, list(variants))
        ablation(TASKS[task][0], os.path.join(args.output_dir, task), args.jobs,
                 finetune_common(args, task), variants)


# -- 5. why: few labels, two learning rates -------------------------------------------------------
# Why a pretrained start did not beat scratch on IMDB (docs/results.md): the same fine-tuning
# from few labels, where a pretrained representation should matter most, at FINETUNE_COMMON's
# learning rate and at a third of it (the pretrained starts' unstable seeds suggest too large a
# step).
WHY_REVIEWS = 300           # IMDB train reviews, drawn by seed (stratified by label)
WHY_EPOCHS = 2
WHY_RATES = ("3e-4", "1e-4")


def why_folder() -> str:
    return os.path.join("why", f"imdb-{WHY_REVIEWS}")


def why_common(args: argparse.Namespace) -> List[str]:
    """The few-labels runs' overrides: IMDB's, then fewer reviews, and one evaluation at the end
    (it costs as much as a fifth of the training; --finetune-set eval_steps=N adds more)."""
    return finetune_common(args, "imdb") + [f"max_examples.train={WHY_REVIEWS}",
                                            f"epochs={WHY_EPOCHS}", "eval_every_epoch=false"]


def why_variants(args: argparse.Namespace) -> Dict[str, List[str]]:
    """{<start>-lr<rate>-s<seed>: overrides} for every start, rate and IMDB seed."""
    return {run_name(start, seed, rate): start_overrides(args.output_dir, start)
            + [f"learning_rate={rate}", f"seed={seed}"]
            for seed in args.imdb_seeds for rate in WHY_RATES for start in STARTS}


def why(args: argparse.Namespace) -> None:
    variants = why_variants(args)
    forget_stale(args.output_dir, why_folder(), list(variants))
    ablation(TASKS["imdb"][0], os.path.join(args.output_dir, why_folder()), args.jobs,
             why_common(args), variants)


# What the experiment sets itself: --pretrain-set / --finetune-set may not change it (the
# corpus is checked against the splits of the task configs' readers as given here, every start
# reads the same tokenizer, and the starts and seeds are the experiment's).
FIXED = {"--pretrain-set": ("data_dir", "reader.eval_corpus", "tokenizer", "output_dir"),
         "--finetune-set": ("data_dir", "reader", "tokenizer", "output_dir", "model",
                            "init_checkpoint", "seed")}


def check_overrides(args: argparse.Namespace) -> None:
    """Before any step: an override of what the experiment fixes, or one the run configs
    refuse (unknown key, bad value), is a ConfigError naming it; found now, not hours later
    when the fine-tuning starts."""
    from ernie_doc.errors import ConfigError
    from ernie_doc.run_config import load_config, parse_override
    for flag, given in (("--pretrain-set", args.pretrain_set),
                        ("--finetune-set", args.finetune_set)):
        for override in given:
            key = ".".join(parse_override(override)[0])
            if any(key == k or key.startswith(k + ".") for k in FIXED[flag]):
                raise ConfigError(f"{flag} {override}: {key} is set by the experiment itself")
    for name, overrides in PRETRAIN.items():
        load_config(os.path.join(ROOT, PRETRAIN_CONFIG), pretrain_common(args) + overrides)
    for task in args.tasks:
        load_config(os.path.join(ROOT, TASKS[task][0]), finetune_common(args, task))
    if "why" in args.steps and "imdb" in args.tasks:
        load_config(os.path.join(ROOT, TASKS["imdb"][0]), why_common(args))


# -- 6. the tables and the curves ----------------------------------------------------------------
def read_json(path: str, default=None):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def run_summary(run_dir: str) -> dict:
    """One fine-tuning run: the best dev evaluation (the model kept), the last one, the test
    split's scores of the kept model when there is one, and whether the kept model gave every
    dev document the same label (a constant guess: its score says nothing of what it read)."""
    best = read_json(os.path.join(run_dir, "eval_results.json"), {})
    history = [r for r in read_jsonl(os.path.join(run_dir, "eval_history.jsonl"))
               if r.get("split") == "dev"]
    try:   # written whole when the kept model changes
        with open(os.path.join(run_dir, "predictions_dev.jsonl"), encoding="utf-8") as f:
            labels = {json.loads(line).get("pred") for line in f if line.strip()}
    except (OSError, ValueError):
        labels = set()
    return {"best_dev": best, "last_dev": history[-1] if history else {},
            "test": read_json(os.path.join(run_dir, "test_results.json"), {}),
            "one_label": len(labels) == 1}


ONE_LABEL = "\\* the kept model gave every dev document the same label"


def seed_value(seed: int, value: float, one_label: bool) -> str:
    """A seed's score in the "every seed" cell, starred when the model guessed one label."""
    return f"s{seed} {value:.3f}" + ("\\*" if one_label else "")


def mean_sd(values: Sequence[float]) -> Tuple[float, Optional[float]]:
    """The mean and the sample standard deviation (n - 1); one value has none (None), not 0."""
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else None


def finetune_table(out: str, seeds: Dict[str, List[int]]) -> dict:
    """{task: {start: {"seeds": {seed: summary}, column: [mean, sd]}}} of the finished runs."""
    table = {}
    for task in seeds:
        for start in STARTS:
            runs = {seed: run_summary(os.path.join(out, task, run_name(start, seed)))
                    for seed in seeds[task]}
            runs = {seed: r for seed, r in runs.items() if r["best_dev"]}
            row = {"seeds": runs}
            for column, (part, metric) in COLUMNS[task].items():
                values = [r[part][metric] for r in runs.values() if metric in r[part]]
                if values:
                    row[column] = list(mean_sd(values))
            table.setdefault(task, {})[start] = row
    return table


COLUMNS = {  # task → {column: (which evaluation, metric)}
    "imdb": {"dev accuracy": ("best_dev", "accuracy"), "dev F1": ("best_dev", "f1")},
    "hyp": {"dev F1 (best)": ("best_dev", "f1"), "dev F1 (last)": ("last_dev", "f1"),
            "dev accuracy": ("best_dev", "accuracy"),   # beside a one-label guess's share
            "test F1": ("test", "f1"), "test accuracy": ("test", "accuracy")},
}


def pretrain_summary(out: str) -> dict:
    """Each pretraining run: steps, tokens read, wall time, its last held-out evaluation."""
    rows = {}
    for name in PRETRAIN:
        run_dir = os.path.join(out, "pretrain", name)
        steps = read_jsonl(os.path.join(run_dir, "train_log.jsonl"))
        evals = read_jsonl(os.path.join(run_dir, "eval_history.jsonl"))
        done = read_json(os.path.join(out, "pretrain", f"{name}.done.json"), {})
        step = steps[-1]["step"] if steps else 0
        try:
            with open(os.path.join(run_dir, "run_config.yaml"), encoding="utf-8") as f:
                cfg = yaml.safe_load(f)
        except OSError:   # not run (yet)
            cfg = {"batch_size": 0, "max_seq_len": 0}
        held = evals[-1] if evals else {}
        if (cfg.get("task_options") or {}).get("reorder_weight") == 0:   # an untrained head
            held = {k: v for k, v in held.items() if not k.startswith("reorder")}
        rows[name] = {"steps": step, "positions": step * cfg["batch_size"] * cfg["max_seq_len"],
                      "seconds": done.get("seconds"), "heldout": held}
    return rows


def why_table(out: str, seeds: Sequence[int]) -> dict:
    """{start: {rate: {"seeds": {seed: dev accuracy}, "one_label": [seed whose model gave every
    dev review the same label], "dev accuracy": [mean, sd]}}} of the finished few-labels
    runs."""
    table = {}
    for start in STARTS:
        for rate in WHY_RATES:
            runs = {seed: run_summary(os.path.join(out, why_folder(), run_name(start, seed, rate)))
                    for seed in seeds}
            runs = {seed: r for seed, r in runs.items() if "accuracy" in r["best_dev"]}
            row = {"seeds": {seed: r["best_dev"]["accuracy"] for seed, r in runs.items()},
                   "one_label": [seed for seed, r in runs.items() if r["one_label"]]}
            if row["seeds"]:
                row["dev accuracy"] = list(mean_sd(list(row["seeds"].values())))
            table.setdefault(start, {})[rate] = row
    return table


def cell(value: Optional[Sequence]) -> str:
    """[mean, sd] as a table cell."""
    if value is None:
        return "–"
    return f"{value[0]:.3f} (one seed)" if value[1] is None else f"{value[0]:.3f} ± {value[1]:.3f}"


def why_markdown(table: dict) -> str:
    lines = [f"| IMDB from {WHY_REVIEWS} train reviews, {WHY_EPOCHS} epochs: dev accuracy | "
             + " | ".join(f"lr {rate}, mean ± sd" for rate in WHY_RATES) + " | every seed |",
             "|---|" + "---|" * (len(WHY_RATES) + 1)]
    for start, rates in table.items():
        seeds = "; ".join(f"{rate}: " + ", ".join(seed_value(seed, v, seed in row["one_label"])
                                                  for seed, v in row["seeds"].items())
                          for rate, row in rates.items() if row["seeds"])
        lines.append(f"| {start} | " + " | ".join(cell(row.get("dev accuracy"))
                                                  for row in rates.values())
                     + f" | {seeds or '–'} |")
    if any(row["one_label"] for rates in table.values() for row in rates.values()):
        lines += ["", ONE_LABEL]
    return "\n".join(lines) + "\n"


def markdown(pretraining: dict, table: dict) -> str:
    lines = ["| pretraining | steps | segment positions read | wall time | held-out MLM accuracy "
             "| held-out reorder accuracy |", "|---|---|---|---|---|---|"]
    for name, r in pretraining.items():
        held, wall = r["heldout"], r["seconds"]
        lines.append(f"| {name} | {r['steps']:,} | {r['positions'] / 1e6:.1f} M | "
                     + (f"{wall / 60:.0f} min" if wall else "–") + " | "
                     + " | ".join(f"{held[k]:.3f}" if k in held else "–"
                                  for k in ("mlm_accuracy", "reorder_accuracy")) + " |")
    for task, rows in table.items():
        columns = list(COLUMNS[task])
        lines += ["", f"| {task} | " + " | ".join(f"{c}, mean ± sd" for c in columns)
                  + " | every seed |", "|---|" + "---|" * (len(columns) + 1)]
        for start, row in rows.items():
            cells = [cell(row.get(c)) for c in columns]
            part, metric = COLUMNS[task][columns[0]]
            seeds = ", ".join(seed_value(seed, r[part][metric], r["one_label"])
                              for seed, r in row["seeds"].items() if metric in r[part])
            lines.append(f"| {start} | " + " | ".join(cells) + f" | {seeds or '–'} |")
        if any(r["one_label"] for row in rows.values() for r in row["seeds"].values()):
            lines += ["", ONE_LABEL]
    return "\n".join(lines) + "\n"


def _windows(records: Sequence[dict], key: str, size: int) -> Tuple[List[int], List[float]]:
    """The mean of `key` over consecutive windows of `size` records that have it, at each
    window's last step: a readable curve from per-step values."""
    points = [(r["step"], r[key]) for r in records if key in r]
    chunks = [points[i:i + size] for i in range(0, len(points) - size + 1, size)]
    return ([c[-1][0] for c in chunks], [statistics.mean(v for _, v in c) for c in chunks])


def curves(out: str, seeds: Dict[str, List[int]], pretraining: dict, table: dict,
           path: str) -> None:
    """Top: both pretraining runs (held-out MLM accuracy, the training MLM loss, and the
    held-out reorder accuracy of the run that trains that head: what `pretraining`,
    pretrain_summary's, reports). Bottom: each task's fine-tuning loss against the step for
    every start and seed, and every run's kept dev score by start (from `table`,
    finetune_table's)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for name in PRETRAIN:
        run_dir = os.path.join(out, "pretrain", name)
        evals = read_jsonl(os.path.join(run_dir, "eval_history.jsonl"))
        for ax, key in ((axes[0, 0], "mlm_accuracy"), (axes[0, 2], "reorder_accuracy")):
            if key not in pretraining[name]["heldout"]:
                continue
            ax.plot([r["step"] for r in evals], [r.get(key) for r in evals], marker="o",
                    label=name)
        axes[0, 1].plot(*_windows(read_jsonl(os.path.join(run_dir, "train_log.jsonl")),
                                  "mlm_loss", 100), label=name)
    axes[0, 0].set(title="pretraining: held-out MLM accuracy", xlabel="step")
    axes[0, 1].set(title="pretraining: training MLM loss (mean of 100 steps)", xlabel="step")
    axes[0, 2].set(title="pretraining: held-out reorder accuracy", xlabel="step")
    colors = dict(zip(STARTS, ("tab:gray", "tab:blue", "tab:orange")))
    styles = ("-", "--", ":")
    for ax, task in zip(axes[1], seeds):
        for start in STARTS:
            for i, seed in enumerate(seeds[task]):
                log = read_jsonl(os.path.join(out, task, run_name(start, seed), "train_log.jsonl"))
                ax.plot(*_windows(log, "loss", 50), color=colors[start],
                        linestyle=styles[i % len(styles)], label=f"{start} s{seed}")
        ax.set(title=f"{task}: fine-tuning loss (mean of 50 steps)", xlabel="fine-tuning step")
    ax, ticks, shown = axes[1, 2], [], []
    for t, task in enumerate(seeds):
        part, metric = COLUMNS[task][next(iter(COLUMNS[task]))]
        shown.append(f"{task} dev {metric}")
        for k, start in enumerate(STARTS):
            x = t * (len(STARTS) + 1) + k
            runs = [r for r in table[task][start]["seeds"].values() if metric in r[part]]
            for guess in (False, True):   # hollow: the model gave every dev document one label
                values = [r[part][metric] for r in runs if r["one_label"] == guess]
                ax.scatter([x] * len(values), values, color=colors[start],
                           facecolors="none" if guess else colors[start],
                           label=start if t == 0 and not guess else None)
            ticks.append((x, f"{task}\n{start}"))
    ax.set_xticks([x for x, _ in ticks], [label for _, label in ticks], fontsize=7)
    ax.set(title="kept model, each seed: " + ", ".join(shown)
           + "\n(hollow: one label for every dev document)")
    for ax in axes.flat:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def best_models(out: str, table: dict) -> Dict[str, dict]:
    """Per task, the starting point with the best mean of the first column, and its best seed's
    kept model: OUT/<task>/<start>-s<seed>/best, a directory `ernie-doc predict` runs on
    (weights, config, task.json, tokenizer)."""
    chosen = {}
    for task, rows in table.items():
        column = next(iter(COLUMNS[task]))
        part, metric = COLUMNS[task][column]
        ranked = [(row[column][0], start) for start, row in rows.items() if column in row]
        if not ranked:
            continue
        start = max(ranked)[1]
        seeds = rows[start]["seeds"]
        seed = max(seeds, key=lambda s: seeds[s][part].get(metric, float("-inf")))
        chosen[task] = {"start": start, "seed": seed,
                        "model": os.path.join(out, task, run_name(start, seed), "best")}
    return chosen


def write_table(args: argparse.Namespace) -> str:
    from ernie_doc.utils import atomic_write_text
    seeds = task_seeds(args)
    pretraining, table = pretrain_summary(args.output_dir), finetune_table(args.output_dir, seeds)
    models = best_models(args.output_dir, table)
    few = why_table(args.output_dir, args.imdb_seeds) if "imdb" in args.tasks else {}
    text = markdown(pretraining, table)
    if any(row["seeds"] for rates in few.values() for row in rates.values()):
        text += "\n" + why_markdown(few)
    text += "".join(f"\n{task}: best start {m['start']} (seed {m['seed']}): `ernie-doc predict "
                    f"{m['model']} --input DOCS --output OUT.jsonl`"
                    for task, m in models.items()) + "\n"
    atomic_write_text(os.path.join(args.output_dir, "transfer_results.md"), text)
    atomic_write_text(os.path.join(args.output_dir, "transfer_results.json"), json.dumps(
        {"pretraining": pretraining, "finetuning": table, "few_labels": few, "models": models},
        indent=1, default=str))
    try:
        curves(args.output_dir, seeds, pretraining, table,
               os.path.join(args.output_dir, "transfer_curves.png"))
    except ImportError as e:   # matplotlib is an extra (ernie-doc[plot]); the table is written
        if getattr(e, "name", "") != "matplotlib":
            raise
        text += "\n(transfer_curves.png not drawn: matplotlib is not installed)\n"
    return text


def main(argv=None) -> int:
    args = parse_args(argv)
    check_overrides(args)
    os.makedirs(args.output_dir, exist_ok=True)
    if "corpus" in args.steps:
        manifest = build_corpus(args.data, args.output_dir)
        print(f"corpus: {manifest['documents']} documents, {manifest['words']} words; "
              f"{manifest['checked_against_dev_and_test']} checked: none is a dev or test "
              f"document", flush=True)
    if "tokenizer" in args.steps:
        train_tokenizer(args.output_dir, args.vocab_size)
    if "pretrain" in args.steps:
        pretrain(args)
    if "finetune" in args.steps:
        finetune(args)
    if "why" in args.steps and "imdb" in args.tasks:
        why(args)
    if "table" in args.steps:
        print(write_table(args))
    return 0


if __name__ == "__main__":
    from ernie_doc.cli import run_command  # a data or config error: one line, exit 2
    sys.exit(run_command(main))
