"""CI's installed-package smoke: run by a fresh venv's python (`python -I`, so neither the
checkout nor this folder is importable) from a scratch directory, after `pip install` of the
wheel. It touches every `ernie-doc` subcommand and the Python entry points end to end on tiny
inputs it writes itself (no network, nothing from the checkout or ../shared), so a module the
wheel leaves out fails here.

    python -I smoke.py no-paddle   # before paddle is installed: the one-line install hint
    python -I smoke.py             # after: help of every subcommand, then fine-tune a tiny
                                   # IMDB classifier, predict, export, predict the export,
                                   # Predictor, pipeline (a single string too), AutoModel
                                   # and model.read against the pipeline, an input without
                                   # documents, convert, run-document, train-tokenizer,
                                   # Ctrl-C and --resume

Each step prints one line with its time; a failure prints the command and its output's tail
and exits 1.
"""
import contextlib
import importlib.util
import io
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import traceback

WORK = os.path.abspath("smoke-work")
# what `ernie-doc --help` lists: the user commands only (the benchmarks run from a checkout)
USER_COMMANDS = ("finetune", "pretrain", "export", "convert", "train-tokenizer", "run-document",
                 "predict", "explain", "context", "download", "plan")
BIN = os.path.dirname(sys.executable)
ERNIE_DOC = os.path.join(BIN, "ernie-doc")
WORDS = ["good", "great", "fine", "bad", "awful", "poor", "the", "movie", "plot", "actor",
         "left", "right", "news", "party", "vote"]
# a 1-layer H=16 model over a 20-token vocabulary, one optimizer step: seconds, not a good model
TINY = ["model=ernie-doc-small",
        "model_overrides={num_hidden_layers: 1, hidden_size: 16, num_attention_heads: 2, "
        "memory_len: 8, max_position_embeddings: 16}",
        "max_seq_len=16", "batch_size=4", "epochs=1", "max_steps=1", "learning_rate=0.001",
        "progress=false", "logging_steps=0", "eval_splits=[test]"]


def fail(message, proc=None):
    print(f"SMOKE FAILED: {message}", flush=True)
    if proc is not None:
        print("--- stdout (tail)\n" + proc.stdout[-3000:] + "\n--- stderr (tail)\n"
              + proc.stderr[-3000:], flush=True)
    sys.exit(1)


def run(*args, expect=0, timeout=300):
    """`ernie-doc ARGS` from WORK → the completed process (its exit status must be `expect`)."""
    proc = subprocess.run([ERNIE_DOC, *args], cwd=WORK, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    if proc.returncode != expect:
        fail(f"ernie-doc {' '.join(args)}: exit {proc.returncode}, expected {expect}", proc)
    return proc


def step(name):
    """Decorator: run the function now, print `ok  NAME  (S s)`."""
    def wrap(fn):
        start = time.time()
        try:
            result = fn()
        except Exception as e:   # an import the wheel cannot satisfy lands here
            traceback.print_exc()
            fail(f"{name}: {type(e).__name__}: {e}")
        print(f"ok  {name}  ({time.time() - start:.1f} s)", flush=True)
        return result
    return wrap


def check(condition, message):
    if not condition:
        fail(message)


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def no_paddle():
    """Wheel and its declared dependencies installed, paddle not: the command says which
    package to install, in one line, exit 2 (paddle is left to the user: CPU or GPU build)."""
    check(shutil.which("ernie-doc", path=BIN) is not None, "no ernie-doc command installed")
    try:
        import paddle  # noqa: F401
        fail("paddle is importable: this step must run before paddle is installed")
    except ImportError:
        pass
    os.makedirs(WORK, exist_ok=True)
    proc = run("--version")
    check(proc.stdout.startswith("ernie-doc "), f"--version printed {proc.stdout!r}")
    proc = run("run-document", expect=2)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    if len(lines) != 1 or "paddlepaddle" not in lines[0]:
        fail("without paddle, `ernie-doc run-document` must print one line naming "
             "paddlepaddle", proc)
    print(f"ok  no paddle: {lines[0]}", flush=True)


def main():
    os.makedirs(WORK, exist_ok=True)
    # not "imdb": a folder of the task's name in the working directory would be read as its
    # config path
    data, vocab, out = (os.path.join(WORK, d) for d in ("imdb-data", "vocab", "run"))

    @step("installed, not the checkout")
    def _():
        import ernie_doc
        site = sysconfig.get_paths()["purelib"]
        check(os.path.abspath(ernie_doc.__file__).startswith(site),
              f"ernie_doc imported from {ernie_doc.__file__}, not {site}")
        # the benchmarks are the checkout's, never the wheel's
        check(importlib.util.find_spec("benchmarks") is None, "the wheel installed benchmarks/")

    @step("help of every subcommand")
    def _():
        from ernie_doc import cli
        usage = run("--help").stdout   # the console script itself
        names = [line.split()[0] for line in usage.split("commands:")[1].splitlines()
                 if line.startswith("  ") and not line.strip().startswith("--")]
        check(sorted(names) == sorted(USER_COMMANDS), f"--help listed {names}, expected "
              f"{list(USER_COMMANDS)} (the benchmarks are checkout-only)")
        for name in names:   # in this process: the same dispatch, paddle imported once
            text = io.StringIO()
            try:
                with contextlib.redirect_stdout(text):
                    status = cli.main([name, "--help"])
            except SystemExit as e:   # argparse's --help
                status = e.code
            check(status in (0, None) and text.getvalue().startswith("usage: ernie-doc " + name),
                  f"ernie-doc {name} --help: exit {status}, printed {text.getvalue()[:300]!r}")

    @step("finetune --list-tasks")
    def _():
        from ernie_doc import cli
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            status = cli.main(["finetune", "--list-tasks"])
        tasks = [line.split()[0] for line in text.getvalue().splitlines()]
        check(status == 0 and "imdb" in tasks and "longdep" in tasks,
              f"--list-tasks: exit {status}, listed {tasks}")

    rng = random.Random(0)
    os.makedirs(data, exist_ok=True)
    for split, n in (("train", 16), ("test", 8)):   # the official TSV layout
        rows = ["qid\tlabel\tscore\ttext_a"]
        rows += [f"{i + 1}\t{i % 2}\t{7 if i % 2 else 2}\t"
                 + " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 40)))
                 for i in range(n)]
        with open(os.path.join(data, f"{split}.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(rows) + "\n")
    os.makedirs(vocab, exist_ok=True)
    with open(os.path.join(vocab, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"] + WORDS) + "\n")
    texts = ["good great fine movie the plot " * 6, "awful bad poor actor", "the news"]
    with open(os.path.join(WORK, "docs.jsonl"), "w", encoding="utf-8") as f:
        for i, text in enumerate(texts):
            f.write(json.dumps({"id": f"d{i}", "text": text}) + "\n")

    @step("finetune imdb (tiny model, one step)")
    def _():
        run("finetune", "imdb", "--set", f"data_dir={data}", f"output_dir={out}",
            f"tokenizer={vocab}", *TINY)
        for name in ("task.json", "config.json", "model.safetensors", "vocab.txt"):
            check(os.path.isfile(os.path.join(out, "best", name)), f"run's best/ has no {name}")

    @step("predict (dygraph)")
    def _():
        run("predict", out, "--input", "docs.jsonl", "--output", "preds.jsonl")

    preds = {r["doc_id"]: r for r in read_jsonl(os.path.join(WORK, "preds.jsonl"))}
    check(sorted(preds) == ["d0", "d1", "d2"] and all("pred" in r for r in preds.values()),
          f"predict wrote {preds}")

    @step("plan: the packaged configs by name, the large variant too")
    def _():
        base = run("plan", "imdb", "--gpus", "8").stdout
        large = run("plan", "imdb:large", "--gpus", "8").stdout
        check("ernie-doc-base-en" in base and "GPU-hours (estimate)" in base,
              f"plan imdb printed {base[-500:]!r}")
        check("ernie-doc-large-en" in large and "GPU-hours (estimate)" in large,
              f"plan imdb:large printed {large[-500:]!r}")
        bad = run("plan", "imdb:huge", expect=2).stderr.strip().splitlines()
        check(len(bad) == 1 and bad[0].startswith("error:"), f"plan imdb:huge said {bad}")

    @step("explain (occlusion and gradients): lines, pictures, pages")
    def _():
        for method in ("occlusion", "gradient"):
            why = os.path.join(WORK, f"why-{method}")
            run("explain", out, "--input", "docs.jsonl", "--output", why, "--method", method)
            records = read_jsonl(os.path.join(why, "explanations.jsonl"))
            check([r["doc_id"] for r in records] == ["d0", "d1", "d2"] and
                  all(r["prediction"]["pred"] == preds[r["doc_id"]]["pred"] for r in records),
                  f"explain {method} wrote {records}, predict {preds}")
            for r in records:
                with open(os.path.join(why, r["files"]["png"]), "rb") as f:
                    check(f.read(8) == b"\x89PNG\r\n\x1a\n", f"{r['files']['png']}: no PNG")
                with open(os.path.join(why, r["files"]["html"]), encoding="utf-8") as f:
                    page = f.read()
                # occlusion lists no top tokens: a word of the document itself then
                words = [t["text"] for t in r["top_tokens"]][:1] or \
                    [texts[int(r["doc_id"][1:])].split()[0]]
                check("<html" in page and ">" + words[0] + "<" in page and
                      len(r["segments"]) == preds[r["doc_id"]]["segments"],
                      f"{r['files']['html']}: not the document's page ({r})")

    @step("export (sequence classification head)")
    def _():
        run("export", "--config", os.path.join(out, "best"), "--head",
            "sequence_classification", "--output", os.path.join(WORK, "export", "model"))

    @step("predict the export (paddle.inference)")
    def _():
        run("predict", "export", "--input", "docs.jsonl", "--output", "preds-export.jsonl")
        for record in read_jsonl(os.path.join(WORK, "preds-export.jsonl")):
            ref = preds[record["doc_id"]]
            check(record["pred"] == ref["pred"] and
                  max(abs(a - b) for a, b in zip(record["probs"], ref["probs"])) < 1e-4,
                  f"export predicted {record}, dygraph {ref}")

    @step("Python: Predictor, Pipeline, pipeline")
    def _():
        import numpy as np

        from ernie_doc.predict.engine import Predictor
        from ernie_doc.predict.pipeline import Pipeline, pipeline
        predictor = Predictor(os.path.join(WORK, "export", "model"))
        ids = np.array([[1] + [5 + i % 15 for i in range(14)] + [2]], dtype="int64")
        result = predictor.run(ids)
        check(list(np.shape(result["logits"])) == [1, 2], f"Predictor gave {result}")
        records = pipeline(out)(texts)
        check([r["pred"] for r in records] == [preds[f"d{i}"]["pred"] for i in range(3)],
              f"pipeline gave {records}, predict {preds}")
        check(len(Pipeline.from_pretrained(os.path.join(out, "best"))(texts[:1])) == 1,
              "Pipeline.from_pretrained on best/")
        one = pipeline(out)("Great movie, loved it.")   # a single string is one document
        check(len(one) == 1 and "pred" in one[0], f"pipeline on one string gave {one}")

    @step("Python: AutoModel/AutoTokenizer on the run's folder; model.read equals pipeline")
    def _():
        import warnings

        import numpy as np
        import paddle.nn.functional as F

        from ernie_doc import AutoModel, AutoTokenizer, pipeline
        from ernie_doc.modeling.reading import ReadingWarning
        model = AutoModel.from_pretrained(out).eval()   # the run's folder: its best/
        enc = AutoTokenizer.from_pretrained(out)(texts[1:], return_tensors="pd")
        check(enc["input_ids"].shape == [2, 16] and (enc["input_ids"][:, -1] == 1).all(),
              f"the folder's tokenizer gave {enc['input_ids'].numpy().tolist()}, not the "
              f"model's segment ([CLS] id 1 last, 16 tokens)")
        probs = F.softmax(model.read(**enc).logits, axis=-1).numpy()
        expected = np.array([r["probs"] for r in pipeline(out)(texts[1:])])
        check(np.abs(probs - expected).max() < 1e-5, f"model.read gave {probs.tolist()}, "
              f"pipeline {expected.tolist()}")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model(**enc)
        check([w.category for w in caught] == [ReadingWarning],
              f"a plain call of a model that reads twice warned {caught}")

    @step("predict on an input without documents: one line, or --allow-empty")
    def _():
        from ernie_doc.cli import predict
        with open(os.path.join(WORK, "header.tsv"), "w", encoding="utf-8") as f:
            f.write("id\ttext\n")   # a header row and no document
        proc = run("predict", out, "--input", "header.tsv", "--output", "empty.jsonl",
                   expect=2)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        check(lines == ["error: --input header.tsv: no documents: the file holds only a "
                        "header row (--allow-empty writes an empty --output instead)"] and
              not {"empty.jsonl", "empty.jsonl.meta.json"} & set(os.listdir(WORK)),
              f"predict on a header-only TSV: {proc.stderr[-2000:]!r}")
        text = io.StringIO()
        with contextlib.redirect_stdout(text):   # in this process: paddle is imported
            status = predict.main([out, "--input", os.path.join(WORK, "header.tsv"),
                                   "--output", os.path.join(WORK, "empty.jsonl"),
                                   "--allow-empty", "--no-progress"])
        summary = json.loads(text.getvalue().strip().splitlines()[-1])
        check(status == 0 and summary["documents"] == 0 and
              read_jsonl(os.path.join(WORK, "empty.jsonl")) == [],
              f"--allow-empty: exit {status}, {summary}")

    @step("convert to the PaddleNLP layout")
    def _():
        run("convert", os.path.join(out, "best"), "converted", "--to", "paddlenlp", "--quiet")
        check(os.path.isfile(os.path.join(WORK, "converted", "model_state.pdparams")),
              f"convert wrote {os.listdir(os.path.join(WORK, 'converted'))}")

    @step("run-document")
    def _():
        with open(os.path.join(WORK, "doc.txt"), "w", encoding="utf-8") as f:
            f.write("the movie plot " * 40 + "\n")
        run("run-document", "--model", os.path.join(out, "best"), "--text", "doc.txt",
            "--output", "summary.json")
        with open(os.path.join(WORK, "summary.json"), encoding="utf-8") as f:
            summary = json.load(f)
        check(isinstance(summary, dict) and summary, f"run-document wrote {summary}")

    @step("train-tokenizer")
    def _():
        with open(os.path.join(WORK, "corpus.txt"), "w", encoding="utf-8") as f:
            for _ in range(200):
                f.write(" ".join(rng.choice(WORDS) for _ in range(12)) + "\n")
        run("train-tokenizer", "--input", "corpus.txt", "--output-dir", "spm",
            "--vocab-size", "40", "--soft-vocab-limit")
        check(os.path.isfile(os.path.join(WORK, "spm", "spm.model")), "no spm.model written")

    @step("Ctrl-C during a fine-tune, then the --resume it prints")
    def _():
        stopped = os.path.join(WORK, "stopped")
        args = [a for a in TINY if not a.startswith(("epochs=", "max_steps=", "logging_steps="))]
        proc = subprocess.Popen(
            [ERNIE_DOC, "finetune", "imdb", "--set", f"data_dir={data}", f"output_dir={stopped}",
             f"tokenizer={vocab}", *args, "epochs=3", "logging_steps=1"],
            cwd=WORK, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        log, deadline = os.path.join(stopped, "train_log.jsonl"), time.time() + 240
        while not (os.path.isfile(log) and open(log, encoding="utf-8").read().count("\n") >= 2):
            check(proc.poll() is None, f"the run ended ({proc.returncode}) before its 2nd step")
            check(time.time() < deadline, "no step logged in 240 s")
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=240)
        lines = [line for line in err.splitlines() if line.strip()]
        check(proc.returncode == 130 and len(lines) == 1 and "resume with " in lines[0]
              and "Traceback" not in err, f"Ctrl-C: exit {proc.returncode}, stderr {err[-2000:]!r}")
        command = shlex.split(lines[0].split("resume with ", 1)[1])   # as a user pastes it
        check(command[:2] == ["ernie-doc", "finetune"], f"resume command {command}")
        resumed = subprocess.run([ERNIE_DOC, *command[1:]], cwd=WORK,
                                 capture_output=True, text=True, timeout=600,
                                 stdin=subprocess.DEVNULL)
        if resumed.returncode != 0:
            fail(f"{lines[0]!r}: the resume exited {resumed.returncode}", resumed)
        steps = [json.loads(line)["step"] for line in open(log, encoding="utf-8")]
        check(steps == list(range(1, len(steps) + 1)) and len(steps) > 2,
              f"the resumed run's steps: {steps}")
        check("results in" in resumed.stderr + resumed.stdout, "the resumed run did not finish")

    print("smoke passed", flush=True)


if __name__ == "__main__":
    start = time.time()
    no_paddle() if sys.argv[1:] == ["no-paddle"] else main()
    print(f"smoke: {time.time() - start:.1f} s", flush=True)
