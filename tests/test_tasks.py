"""Every task's run.sh on small fixtures in the official formats (the run.sh contract), and
the command line's behaviour on bad data."""
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from helpers import ROOT, in_process

WORDS = ["good", "great", "fine", "bad", "awful", "poor", "the", "movie", "plot", "actor",
         "left", "right", "news", "party", "vote"]
HANZI = list("好坏新闻体育财经游戏软件应用手机学习教育音乐")
TINY_MODEL = ("model_overrides={num_hidden_layers: 1, hidden_size: 16, num_attention_heads: 2,"
              " memory_len: 8, max_position_embeddings: 16}")
COMMON = ["model=ernie-doc-small", TINY_MODEL, "max_seq_len=16", "batch_size=4", "epochs=1",
          "learning_rate=0.001", "progress=false", "logging_steps=0"]


def vocab_dir(root, tokens):
    root.mkdir(parents=True, exist_ok=True)
    specials = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]
    (root / "vocab.txt").write_text("\n".join(specials + tokens) + "\n", encoding="utf-8")
    return root


def text(rng, vocab, n, sep=" "):
    return sep.join(rng.choice(vocab, size=n))


def run_task(task, data_dir, out, tokenizer, *extra, expect=0, nproc=1):
    env = dict(os.environ, DATA_DIR=str(data_dir), OUTPUT_DIR=str(out), PYTHON=sys.executable,
               INIT_CHECKPOINT="", MODEL_CONFIG="ernie-doc-small", NPROC=str(nproc),
               LAUNCH_LOG_DIR=str(out) + ".launch",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    cmd = ["bash", f"tasks/{task}/run.sh", f"tokenizer={tokenizer}", *COMMON, *extra]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == expect, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


def finetune_task(task, data_dir, out, tokenizer, *extra, expect=0):
    """What run_task's tasks/<task>/run.sh runs (tools/launch.sh's overrides, then the same
    arguments), in this process: for tests of a task's data and results; the run.sh tests keep
    one real launch per task family for the wiring."""
    from tools.finetune import command
    return in_process(command, [
        str(ROOT / "tasks" / task / "config.yaml"), "--set", f"output_dir={out}",
        "overwrite_output_dir=true", f"data_dir={data_dir}", "model=ernie-doc-small",
        f"tokenizer={tokenizer}", *COMMON, *extra], expect)


def check_results(out, metric, n_dev):
    results = json.loads((out / "eval_results.json").read_text())
    assert results["main_metric"] == metric and 0.0 <= results[metric] <= 1.0
    preds = [json.loads(line) for line in open(out / f"predictions_{results['split']}.jsonl")]
    assert len(preds) == n_dev
    return results


def imdb_tsv(tmp_path):
    rng = np.random.default_rng(0)
    data = tmp_path / "imdb"
    data.mkdir()
    for split, n in (("train", 16), ("test", 8)):
        rows = ["qid\tlabel\tscore\ttext_a"]
        for i in range(n):
            rows.append(f"{i + 1}\t{i % 2}\t{7 if i % 2 else 2}\t"
                        + text(rng, WORDS, int(rng.integers(5, 40))) + " <br /><br /> the end")
        (data / f"{split}.txt").write_text("\n".join(rows) + "\n")
    return data


def test_imdb_run_sh_on_the_official_tsv(tmp_path):
    out = tmp_path / "out"
    run_task("imdb", imdb_tsv(tmp_path), out, vocab_dir(tmp_path / "vocab", WORDS + ["end"]))
    check_results(out, "accuracy", 8)


def test_run_sh_with_nproc_2_uses_fleetrun(tmp_path):
    out = tmp_path / "out"
    run_task("imdb", imdb_tsv(tmp_path), out, vocab_dir(tmp_path / "vocab", WORDS + ["end"]),
             nproc=2)
    check_results(out, "accuracy", 8)
    assert (tmp_path / "out.launch" / "workerlog.1").is_file()


RUN_SH_TASKS = sorted(p.parent.name for p in (ROOT / "tasks").glob("*/run.sh"))


@pytest.mark.parametrize("task, flag", [(t, "--help") for t in RUN_SH_TASKS] + [("imdb", "-h")])
def test_run_sh_help_is_its_contract_then_the_trainers(tmp_path, task, flag):
    """`bash tasks/<task>/run.sh --help`: the script's own notes, the environment contract and
    the overrides (written once, in tools/launch.sh), then the trainer's help; nothing is
    launched (a PYTHON that records its calls, a fleetrun that would leave a mark, NPROC=2) and
    paddle is not imported (a stand-in that fails on import)."""
    calls, mark = tmp_path / "calls", tmp_path / "fleetrun-ran"
    fake = tmp_path / "bin"
    (fake / "paddle").mkdir(parents=True)
    (fake / "paddle" / "__init__.py").write_text("raise ImportError('paddle imported')\n")
    (fake / "python").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n'
                                 f'PYTHONPATH={fake} exec {sys.executable} "$@"\n')
    (fake / "fleetrun").write_text(f"#!/bin/sh\ntouch {mark}\n")
    for name in ("python", "fleetrun"):
        (fake / name).chmod(0o755)
    env = dict(os.environ, PYTHON=str(fake / "python"), NPROC="2", OUTPUT_DIR=str(tmp_path / "out"),
               DATA_DIR=str(tmp_path / "data"), PATH=f"{fake}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(["bash", f"tasks/{task}/run.sh", "epochs=1", flag], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    out = proc.stdout
    own = (ROOT / "tasks" / task / "run.sh").read_text().splitlines()[1].lstrip("# ")
    assert out.startswith(own), out[:300]   # the script's own notes first
    contract = out.index("DATA_DIR   ")
    for name in ("OUTPUT_DIR", "INIT_CHECKPOINT", "MODEL_CONFIG", "NPROC", "PYTHON",
                 "key=value", "--help-config"):
        assert name in out[contract:], name
    assert f"here: {tmp_path / 'out'}" in out   # where this run would write
    assert out.index("usage: finetune.py") > contract and "--set KEY=VALUE" in out
    assert calls.read_text().split("\n")[:-1] == [f"{ROOT}/tools/finetune.py --help"]
    assert not mark.exists() and not (tmp_path / "out").exists()
    extra = {"hotpotqa": ["STAGE", "EVIDENCE"], "longdep": ["JOBS", "DATA_DIR is not used"],
             "wikitext103": ["CONFIG=config_large.yaml"]}
    assert all(name in out[:contract] for name in extra.get(task, [])), out[:contract]
    # SIZE where the task has a large-model config (the paper's large rows), only there
    large = (ROOT / "tasks" / task / "config_large.yaml").is_file()
    assert ("\n  SIZE " in out[contract:]) == large


def test_size_large_picks_the_large_config_and_its_own_output_dir(tmp_path):
    """SIZE=large: <config>_large.yaml (the contract's Config line) and OUTPUT_DIR
    output/<task>_large (hotpotqa's stage 2: output/hotpotqa_answer_large, reading
    output/hotpotqa_large); another value, or large for a task without one, is one line and
    nothing runs."""
    env = {k: v for k, v in os.environ.items() if k not in ("OUTPUT_DIR", "STAGE")}
    env.update(PYTHON="true", SIZE="large")   # the trainer's help is not what is tested here
    for task, stage, config, out in (
            ("imdb", "evidence", "imdb/config_large.yaml", "output/imdb_large"),
            ("hotpotqa", "answer", "hotpotqa/config_answer_large.yaml",
             "output/hotpotqa_answer_large")):
        proc = subprocess.run(["bash", f"tasks/{task}/run.sh", "--help"], cwd=ROOT,
                              env=dict(env, STAGE=stage), capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        assert f"Config: tasks/{config}\n" in proc.stdout, proc.stdout
        assert f"here: {out})" in proc.stdout
        # the SIZE line said "OUTPUT_DIR's default is then output/hotpotqa_large" for stage 2
        contract = proc.stdout[proc.stdout.index("Config: "):]
        assert contract.count(out) == 1 and "LAUNCH_LOG_DIR then end\n" in contract
    for task, size, line in (
            ("imdb", "huge", "SIZE=huge: expected base or large"),
            ("c3", "large", "SIZE=large: no large-model config beside tasks/c3/config.yaml "
                            "(tasks/c3/config_large.yaml)")):
        proc = subprocess.run(["bash", f"tasks/{task}/run.sh", "epochs=1"], cwd=ROOT,
                              env=dict(env, SIZE=size), capture_output=True, text=True,
                              timeout=60)
        assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
        assert proc.stderr == f"error: {line}\n"


@pytest.mark.parametrize("task", ["imdb", "longdep"])
def test_run_sh_help_without_python_is_the_contract_then_one_line(tmp_path, task):
    """No `python` on PATH: --help printed the contract, then bash's `python: command not
    found` (exit 127) where a run says which variable to set. Now the contract, then that
    same one line, exit 2; PYTHON naming no executable alike. A run of longdep (not through
    tools/launch.sh) checks PYTHON and NPROC as every other run.sh does (it ran
    `exec python`: exit 127)."""
    bin_dir = tmp_path / "bin"   # what the scripts run, but no python
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "basename", "sed", "cat"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    cases = [(dict(env, PATH=str(bin_dir)), "python"),
             (dict(env, PYTHON=str(tmp_path / "nope")), str(tmp_path / "nope"))]
    for case, name in cases:
        proc = subprocess.run([shutil.which("bash"), f"tasks/{task}/run.sh", "--help"],
                              cwd=ROOT, env=case, capture_output=True, text=True, timeout=60)
        assert (proc.returncode, proc.stderr) == \
            (2, f"error: PYTHON: '{name}' is not an executable\n"), proc.stderr
        assert "NPROC" in proc.stdout and proc.stdout.rstrip().endswith(
            "A run writes OUTPUT_DIR/eval_results.json, best/ (for predict) and its logs."), \
            proc.stdout[-300:]
    for case, line in ((cases[0][0], "PYTHON: 'python' is not an executable"),
                       (dict(env, NPROC="x"), "NPROC: must be a positive integer, got 'x'")):
        proc = subprocess.run([shutil.which("bash"), f"tasks/{task}/run.sh", "epochs=1"],
                              cwd=ROOT, env=case, capture_output=True, text=True, timeout=60)
        assert (proc.returncode, proc.stderr, proc.stdout) == (2, f"error: {line}\n", "")


def test_hyp_on_semeval_xml(tmp_path):
    rng = np.random.default_rng(1)
    data = tmp_path / "hyp"
    data.mkdir()
    ids = [f"{i:07d}" for i in range(20)]
    arts = "".join(f'<article id="{a}" title="t{a}"><p>{text(rng, WORDS, 30)}</p> '
                   f'<a href="x">{text(rng, WORDS, 3)}</a></article>\n' for a in ids)
    (data / "articles-training-byarticle.xml").write_text(
        f'<?xml version="1.0" encoding="UTF-8"?><articles>\n{arts}</articles>\n')
    truth = "".join(f'<article id="{a}" hyperpartisan="{"true" if i % 2 else "false"}"/>\n'
                    for i, a in enumerate(ids))
    (data / "ground-truth-training-byarticle.xml").write_text(
        f'<?xml version="1.0" ?><articles>\n{truth}</articles>\n')
    (data / "hp-splits.json").write_text(json.dumps(
        {"train": list(range(12)), "dev": list(range(12, 16)), "test": list(range(16, 20))}))
    out = tmp_path / "out"
    finetune_task("hyp", data, out, vocab_dir(tmp_path / "vocab", WORDS))
    results = check_results(out, "f1", 4)
    test = json.loads((out / "test_results.json").read_text())
    assert test["split"] == "test" and {"f1", "macro_f1", "accuracy"} <= set(test)
    assert {"f1", "macro_f1", "accuracy"} <= set(results)


@pytest.mark.parametrize("pred, f1, macro_f1, accuracy", [
    # "true": tp 1, fp 1, fn 1 → 1/2; "false": tp 2, fp 1, fn 1 → 2/3
    (["true", "true", "false", "false", "false"], 1 / 2, (1 / 2 + 2 / 3) / 2, 3 / 5),
    # the majority guess: "true" 0; "false": tp 3, fp 2 → 3/4
    (["false"] * 5, 0.0, (0 + 3 / 4) / 2, 3 / 5),
])
def test_hyp_reports_binary_and_macro_f1(pred, f1, macro_f1, accuracy):
    """The shipped HYP config reports F1 of "true" (PaddleNLP's; it picks the checkpoint) and
    sklearn's macro F1 (Longformer's script's, the one beside the paper's table): on 5 articles
    (2 hyperpartisan) they differ."""
    from ernie_doc.data.document import Document
    from ernie_doc.kinds import build_task
    from ernie_doc.run_config import load_config
    task = build_task(load_config(str(ROOT / "tasks" / "hyp" / "config.yaml")))
    assert task.main_metric == "f1" and task.labels[task.positive] == "true"
    gold = ["true", "false", "false", "false", "true"]
    docs = [Document(f"a{i}", text="x", label=g) for i, g in enumerate(gold)]
    rows = {i: [(0, np.array([0.3, 0.7]) if p == "true" else np.array([0.7, 0.3]))]
            for i, p in enumerate(pred)}
    metrics, _ = task.evaluate(docs, rows)
    assert metrics == pytest.approx({"f1": f1, "macro_f1": macro_f1, "accuracy": accuracy})


def iflytek_json(folder, sizes, label, sentence):
    """CLUE's IFLYTEK JSON lines in `folder`: n records per file of `sizes` ((name, n), ...),
    with label(i) and sentence()."""
    folder.mkdir()
    for name, n in sizes:
        with open(folder / name, "w", encoding="utf-8") as f:
            for i in range(n):
                f.write(json.dumps({"label": label(i), "label_des": "x", "sentence": sentence()},
                                   ensure_ascii=False) + "\n")
    return folder


def test_iflytek_on_clue_json_lines(tmp_path):
    rng = np.random.default_rng(2)
    data = iflytek_json(tmp_path / "iflytek", (("train.json", 16), ("dev.json", 6)),
                        lambda i: str(int(rng.integers(0, 119))),
                        lambda: text(rng, HANZI, 30, sep=""))
    out = tmp_path / "out"
    finetune_task("iflytek", data, out, vocab_dir(tmp_path / "vocab", HANZI))
    check_results(out, "accuracy", 6)
    from ernie_doc import ErnieDocForSequenceClassification
    assert ErnieDocForSequenceClassification.from_pretrained(
        str(out / "best")).config.num_labels == 119


def test_thucnews_on_label_tab_text(tmp_path):
    rng = np.random.default_rng(3)
    data = tmp_path / "thucnews"
    data.mkdir()
    labels = ["体育", "财经", "游戏"]
    (data / "label.txt").write_text("\n".join(labels) + "\n", encoding="utf-8")
    for name, n in (("train.txt", 12), ("val.txt", 6), ("test.txt", 6)):
        lines = [f"{labels[i % 3]}\t{text(rng, HANZI, 25, sep='')}" for i in range(n)]
        (data / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    finetune_task("thucnews", data, out, vocab_dir(tmp_path / "vocab", HANZI))
    check_results(out, "accuracy", 6)
    assert (out / "test_results.json").is_file()


def test_longdep_run_sh_prints_the_ablation_table(tmp_path):
    """Run from outside the checkout with a relative OUTPUT_DIR: every variant's results land
    under the caller's directory, where the table is read from (none in the checkout)."""
    out = tmp_path / "out"
    env = dict(os.environ, OUTPUT_DIR="out", PYTHON=sys.executable)
    proc = subprocess.run(
        ["bash", os.path.join(ROOT, "tasks", "longdep", "run.sh"), "epochs=1",
         "reader.num_docs={train: 16, dev: 8}", "model_overrides.num_hidden_layers=1",
         "model_overrides.hidden_size=16", "model_overrides.num_attention_heads=2"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (out / "none" / "eval_results.json").is_file()
    results = json.loads((out / "results.json").read_text())
    assert list(results) == ["none", "xl", "enhanced", "enhanced+retro"]
    assert all(0.0 <= v <= 1.0 for v in results.values())
    for name in results:
        assert name in proc.stdout
    assert json.loads((out / "eval_results.json").read_text())["accuracy"] == \
        results["enhanced+retro"]
    # live progress: each variant's evaluations reach the screen while it runs (before its
    # `finished` line), and with two variants at once every line is whole: one variant's
    lines = proc.stdout.splitlines()
    table = lines.index("")   # the table follows the progress lines
    for name in results:
        finished = next(i for i, line in enumerate(lines) if line.startswith(f"[{name}] fin"))
        evals = [i for i, line in enumerate(lines) if re.fullmatch(
            rf"\[{re.escape(name)}\] step \d+/\d+ dev accuracy \d\.\d{{4}}", line)]
        assert evals and max(evals) < finished, proc.stdout
    assert all(re.fullmatch(r"\[(none|xl|enhanced|enhanced\+retro)\] .+", line)
               for line in lines[:table]), proc.stdout
    assert lines[table + 1].split() == ["variant", "accuracy", "best", "step", "seconds"]


@pytest.mark.parametrize("content, message", [
    ("qid\tlabel\tscore\ttext_a\n1\t0\t2\tfine movie\n2\t1\t9\n", "train.txt:3:"),
    ("qid\tlabel\tscore\ttext_a\n1\t7\t2\tfine movie\n", "train.txt:2:"),
    ("qid\tlabel\tscore\ttext_a\n1\t0\t2\t   \n", "train.txt:2:"),
    (b"qid\tlabel\tscore\ttext_a\n1\t0\t2\tfine \xff movie\n", "train.txt:2:"),
])
def test_bad_data_is_one_error_line_and_nothing_written(tmp_path, content, message):
    data = tmp_path / "imdb"
    data.mkdir()
    mode = "wb" if isinstance(content, bytes) else "w"
    with open(data / "train.txt", mode) as f:
        f.write(content)
    (data / "test.txt").write_text("qid\tlabel\tscore\ttext_a\n1\t0\t2\tfine\n")
    out = tmp_path / "out"
    proc = finetune_task("imdb", data, out, vocab_dir(tmp_path / "vocab", WORDS), expect=2)
    assert message in proc.stderr and proc.stderr.startswith("error: ")
    assert proc.stderr.strip().count("\n") == 0, proc.stderr
    assert not out.exists()


def test_missing_data_dir_and_empty_split(tmp_path):
    out = tmp_path / "out"
    proc = run_task("iflytek", tmp_path / "nowhere", out, vocab_dir(tmp_path / "v", HANZI),
                    expect=2)
    assert "nowhere" in proc.stderr and not out.exists()
    # a real process: nothing else reaches stderr (warnings, paddle's own output)
    assert proc.stderr.startswith("error: ") and proc.stderr.strip().count("\n") == 0, \
        proc.stderr
    data = tmp_path / "empty"
    data.mkdir()
    (data / "train.json").write_text("\n\n")
    (data / "dev.json").write_text('{"label": "1", "sentence": "好"}\n')
    proc = finetune_task("iflytek", data, out, vocab_dir(tmp_path / "v", HANZI), expect=2)
    assert "train.json" in proc.stderr and not out.exists()


def test_init_checkpoint_loads_weights_and_tokenizer_from_a_run(tmp_path):
    data = imdb_tsv(tmp_path)
    first = tmp_path / "first"
    finetune_task("imdb", data, first, vocab_dir(tmp_path / "vocab", WORDS + ["end"]))
    assert (first / "best" / "vocab.txt").is_file()        # the tokenizer travels with it
    before = json.loads((first / "eval_results.json").read_text())
    # learning rate 0: the weights stay those of the checkpoint, so the first evaluation
    # reproduces the checkpoint's own
    second = tmp_path / "second"
    env_ckpt = str(first / "best")
    proc = finetune_task("imdb", data, second, "", f"init_checkpoint={env_ckpt}",
                         "learning_rate=0", "weight_decay=0")
    assert "loaded" in proc.stdout
    after = json.loads((second / "eval_results.json").read_text())
    assert after["accuracy"] == before["accuracy"]
    assert after["loss"] == pytest.approx(before["loss"], abs=1e-6)


@pytest.mark.slow
def test_main_command_shows_the_paper_ablation_order(tmp_path):
    """The README's main command (its block, marked `by=` this test: tests/test_readme.py does
    not run it again), as is, in the checkout (about 3 minutes on 2 cores)."""
    import readme_fixtures as rf
    block = rf.block_run_by(
        "tests/test_tasks.py::test_main_command_shows_the_paper_ablation_order")
    assert block.lang == "bash" and "tasks/longdep/run.sh" in block.code, block.code
    script = tmp_path / "block.sh"
    script.write_text(block.code, encoding="utf-8")
    out = tmp_path / "longdep"
    # offline, as test_readme runs the blocks: the demo downloads nothing
    env = dict(os.environ, OUTPUT_DIR=str(out), PYTHON=sys.executable, ERNIE_DOC_OFFLINE="1",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    proc = subprocess.run(["bash", "-e", "-o", "pipefail", str(script)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads((out / "results.json").read_text())
    assert r["none"] < 0.6 and r["enhanced+retro"] > 0.95, r
    assert r["none"] < r["xl"] < r["enhanced"] < r["enhanced+retro"], r
    demo_explanations_find_the_keys(out)


def demo_explanations_find_the_keys(out):
    """On the trained demo, occlusion puts the decision on the two segments that hold the keys
    (the first and the last) for enhanced + retrospective feed; without recurrence the first
    segment moves nothing (its own row aside, the model is at chance), and the last segment's
    prediction is not influenced by any earlier one."""
    from ernie_doc.explain.context import last_segment_influence
    from ernie_doc.explain.explainer import Explainer
    from ernie_doc.predict.model_folder import model_directory, task_record
    from ernie_doc.predict.pipeline import Pipeline, task_documents
    first = {}
    for variant in ("enhanced+retro", "none"):
        run = str(out / variant)
        docs = task_documents(task_record(model_directory(run)), None, "dev")[:40]
        pipe = Pipeline.from_pretrained(run)
        records = pipe.explain(docs, method="occlusion")
        deltas = [np.abs([s["score"] for s in x["segments"]]) for x in records]
        first[variant] = np.mean([d[0] for d in deltas])
        if variant == "enhanced+retro":
            shares = [(d[0] + d[-1]) / d.sum() for d in deltas]
            assert np.mean(shares) > 0.9, np.mean(shares)
        reach = [last_segment_influence(Explainer(pipe), d) for d in docs[:10]]
        curves = [np.array(x["occlusion"]) for x in reach if x is not None]
        if variant == "none":
            assert all((c[1:] == 0).all() for c in curves)
        else:   # the first key reaches the last segment from the farthest segment
            assert np.mean([c[-1] / c[0] for c in curves if len(c) > 2]) > 0.1
    assert first["none"] < 0.01 * first["enhanced+retro"], first


def test_trained_sentencepiece_tokenizer_survives_resume(tmp_path):
    data = imdb_tsv(tmp_path)
    out = tmp_path / "out"
    proc = finetune_task("imdb", data, out, "train", "tokenizer_vocab_size=400", expect=2)
    assert "tokenizer_vocab_size 400" in proc.stderr and "Vocabulary size too high" in \
        proc.stderr and proc.stderr.strip().count("\n") == 0 and not out.exists()
    finetune_task("imdb", data, out, "train", "tokenizer_vocab_size=30", "epochs=2",
                  "stop_at_step=3")
    model = out / "tokenizer" / "spm.model"
    first = model.read_bytes()
    from tools.finetune import command
    in_process(command, ["--resume", str(out)])
    assert model.read_bytes() == first and (out / "best" / "spm.model").is_file()
    assert (out / "eval_results.json").is_file()
