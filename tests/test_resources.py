"""Every size is bounded before it is used: batch sizes, threads, layer counts and memory
lengths from the command line, `--set`, a saved model's task.json or the Python API are
checked against the memory estimate (ernie_doc.resources) before anything is allocated, the
estimate decides in milliseconds whatever the size, and YAML cannot expand (no anchors or
aliases). Error lines quote at most a bounded part of a value.

Each command runs under an address-space limit (3 GiB above what the process holds) and an
alarm: on code without the bounds it dies of a MemoryError or the alarm, a clean test failure
rather than a machine out of memory or a hung run. They run in-process (main(argv), stderr
through capsys), except --threads, whose OpenMP abort (signal 6) would take pytest with it:
that one runs in a subprocess. The models are tiny, written directly (weights and task.json,
no training run) once per module."""
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import ROOT, SECONDS, bounded, tiny_config

from ernie_doc.errors import ConfigError, PipelineError
from ernie_doc.predict.pipeline import Pipeline, pipeline

HUGE = 10 ** 9


def refused(capsys, tool, *args, parts=()):
    """`ernie-doc TOOL ARGS` (or a module's main, TOOL dotted) in-process, bounded: exit
    status 2 with exactly one `error:` line on stderr holding every part → that line."""
    import importlib
    module = tool if "." in tool else f"ernie_doc.cli.{tool.replace('-', '_')}"
    main = importlib.import_module(module).main
    capsys.readouterr()
    with bounded():
        try:
            code = main([str(a) for a in args])
        except SystemExit as e:
            code = e.code
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), (code, err[-5:])
    for part in parts:
        assert part in err[0], (part, err[0])
    return err[0]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny classification model of longdep (pre-tokenized ids: no tokenizer files), a
    language model, and one input document → {name: path}."""
    from ernie_doc import ErnieDocForSequenceClassification
    from ernie_doc.lm.data import Vocabulary
    from ernie_doc.lm.model import TransformerXLConfig, TransformerXLLM
    root = tmp_path_factory.mktemp("bounds")
    classifier = root / "classifier"
    ErnieDocForSequenceClassification(tiny_config(), num_labels=2).save_pretrained(
        str(classifier))
    (classifier / "task.json").write_text(json.dumps({
        "format": 1, "task": "longdep", "kind": "classification", "labels": ["0", "1"],
        "config": {"task": "longdep", "kind": "classification", "max_seq_len": 16,
                   "stride": 12, "batch_size": 2}}))
    lm = root / "lm"
    words = ["<eos>", "<unk>"] + [f"w{i}" for i in range(30)]
    TransformerXLLM(TransformerXLConfig(
        n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, vocab_size=len(words),
        cutoffs=[], tgt_len=8, mem_len=8)).save_pretrained(str(lm))
    Vocabulary(words).save(lm / "vocab.txt")
    (lm / "task.json").write_text(json.dumps({
        "format": 1, "task": "wikitext103", "kind": "language_model", "labels": [],
        "config": {"task": "wikitext103", "kind": "language_model", "max_steps": 1,
                   "batch_size": 2, "eval_splits": ["valid"],
                   "task_options": {"eval_mem_len": HUGE}}}))
    document = root / "in.jsonl"
    document.write_text(json.dumps({"id": "a", "ids": [5, 6, 7, 8, 9, 10]}) + "\n")
    return {"classifier": classifier, "lm": lm, "input": document, "root": root}


# -- the estimate: exact, and fast whatever the size ------------------------------------------
def test_parameter_count_is_exact_for_any_layer_count():
    """resources.parameter_count builds one and two layers and extrapolates: it equals the
    real model's count for heads with per-layer and shared relative biases, and for the
    language model with untied biases."""
    import paddle

    from ernie_doc import (ErnieDocForQuestionAnswering, ErnieDocForSequenceClassification,
                           ErnieDocModel, resources)
    from ernie_doc.lm.model import TransformerXLConfig, TransformerXLLM

    def real(model):
        return sum(int(np.prod(p.shape)) for p in model.parameters())

    paddle.seed(0)
    for layers, sharing in ((3, False), (5, True)):
        config = tiny_config(num_hidden_layers=layers, rel_pos_params_sharing=sharing)
        for head, kwargs in ((ErnieDocModel, {}), (ErnieDocForSequenceClassification,
                                                   {"num_labels": 3}),
                             (ErnieDocForQuestionAnswering, {})):
            count = resources.parameter_count(
                lambda n: head(config.replace(num_hidden_layers=n), **kwargs), layers)
            assert count == real(head(config, **kwargs)), (head.__name__, layers, sharing)
    for untie in (False, True):
        lm = TransformerXLConfig(n_layer=4, d_model=16, n_head=2, d_head=8, d_inner=32,
                                 vocab_size=40, cutoffs=[20], div_val=2, untie_r=untie)
        count = resources.parameter_count(
            lambda n: TransformerXLLM(TransformerXLConfig(**dict(lm.to_dict(), n_layer=n))), 4)
        assert count == real(TransformerXLLM(lm)), untie


def test_the_estimate_decides_in_well_under_a_second():
    """num_hidden_layers 100000 (a model of 1.2 billion parameters whose weights alone would
    fit): the count and the refusal take milliseconds, not the minutes building 100000 layers
    lazily took."""
    from ernie_doc import ErnieDocConfig, ErnieDocForSequenceClassification, resources
    config = ErnieDocConfig(hidden_size=32, num_attention_heads=2, num_hidden_layers=100_000)
    start = time.perf_counter()
    params = resources.parameter_count(lambda n: ErnieDocForSequenceClassification(
        config.replace(num_hidden_layers=n)), config.num_hidden_layers)
    parts = resources.training_parts(params, config.num_hidden_layers, 16, 512, 128, 32, 2)
    with pytest.raises(ConfigError, match="needs about"):
        resources.check_fits(parts, "x", available=8 << 30)
    assert time.perf_counter() - start < 10, "the old lazy build of 100000 layers took minutes"
    per_layer = 12 * 32 * 32 + 13 * 32 + 3 * 2 * 16   # matrices, biases + norms, r_* biases
    assert params > 100_000 * per_layer


TINY_RUN = ["task=longdep", "progress=false", "max_seq_len=16",
            "reader={num_docs: {train: 8, dev: 4}, segment_tokens: 14}",
            "model_overrides={hidden_size: 16, num_attention_heads: 2, "
            "max_position_embeddings: 16}"]


@pytest.mark.parametrize("given, parts", [
    ("model_overrides.num_hidden_layers=100000", ("387,203,522 parameters", "batch_size 16")),
    (f"eval_batch_size={HUGE}", ("parameters, eval_batch_size 1000000000", "activations")),
], ids=["layers", "eval_batch_size"])
def test_set_sizes_are_refused_before_the_run(capsys, tmp_path, given, parts):
    """A 100000-layer model (built lazily layer by layer, no decision in minutes), and an
    eval_batch_size only the first evaluation allocated: refused at once."""
    refused(capsys, "finetune", "--set", *TINY_RUN, given, f"output_dir={tmp_path / 'run'}",
            parts=("needs about",) + parts)
    assert not (tmp_path / "run").exists()


def test_the_estimate_counts_the_rows_of_an_example(monkeypatch):
    """batch_size counts C3 questions (batch_unit: examples): the estimate is for batch_size ×
    num_choices rows, and its message names both."""
    from types import SimpleNamespace

    from ernie_doc import resources
    from ernie_doc.assemble import Assembly
    from ernie_doc.kinds.document import check_memory
    from ernie_doc.run_config import load_config
    seen = []
    monkeypatch.setattr(resources, "parameter_count", lambda build, layers: 1000)
    monkeypatch.setattr(resources, "training_parts",
                        lambda params, layers, rows, *rest, **kw: seen.append(rows) or
                        {"weights": 1})
    monkeypatch.setattr(resources, "check_fits", lambda parts, where, device: seen.append(where))
    cfg = load_config(None, ["task=c3", "kind=multiple_choice", "batch_size=6",
                             "eval_batch_size=8"])
    run = Assembly(cfg=cfg, task=SimpleNamespace(group_size=4), device="cpu")
    check_memory(run, (None, 2, 16, 2, 16, 8))
    assert seen == [24, f"{cfg.source}: 1,000 parameters, batch_size 6 (24 rows), 16 tokens "
                        f"per row", 32, f"{cfg.source}: 1,000 parameters, eval_batch_size 8 "
                                        f"(32 rows), 16 tokens per row"]


@pytest.mark.parametrize("recompute", [False, True])
def test_the_trainers_estimate_follows_recompute(monkeypatch, recompute):
    """recompute: true is checked with recomputed activations (each layer's inputs and one
    layer's activations), so a batch that fits only with recompute is not refused."""
    from types import SimpleNamespace

    from ernie_doc import ErnieDocConfig, ErnieDocForSequenceClassification, resources
    from ernie_doc.assemble import Assembly
    from ernie_doc.kinds.document import check_head_memory
    from ernie_doc.run_config import load_config
    seen = []
    monkeypatch.setattr(resources, "check_fits",
                        lambda parts, where, device=None: seen.append(parts))
    cfg = load_config(None, ["task=imdb", "batch_size=3", "max_seq_len=16",
                             f"recompute={str(recompute).lower()}"])
    task = SimpleNamespace(group_size=1, head_class=ErnieDocForSequenceClassification,
                           model_kwargs=lambda: {"num_labels": 2})
    config = ErnieDocConfig(hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                            memory_len=4, max_position_embeddings=16)
    check_head_memory(Assembly(cfg=cfg, task=task, device="cpu"), config)
    kept = resources.recomputed_activation_bytes if recompute else resources.activation_bytes
    checked = [parts for parts in seen if "activations" in parts]   # not the model's own
    assert checked[0]["activations"] == kept(2, 3, 16, 20, 8, 2)
    assert resources.recomputed_activation_bytes(2, 3, 16, 20, 8, 2) == \
        4 * 2 * 3 * 20 * 8 + resources.activation_bytes(1, 3, 16, 20, 8, 2)


@pytest.mark.parametrize("given, part", [
    ("model_overrides.memory_len=100000000000", "memory_len must be at most 2147483647"),
    ("model_overrides.max_position_embeddings=10000000000",
     "max_position_embeddings must be at most 2147483647"),
], ids=["memory_len", "max_position_embeddings"])
def test_set_sizes_past_int32_are_one_line(capsys, tmp_path, given, part):
    """Paddle takes tensor dimensions as int32: the memory estimate's lazy build raised a
    78-line IndexError ("exceeds int32") before it could decide."""
    refused(capsys, "finetune", "--set", *TINY_RUN, given, f"output_dir={tmp_path / 'run'}",
            parts=("model_overrides:", part))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("key", ["model", "init_checkpoint"])
def test_saved_model_config_sizes_past_int32_are_one_line(saved, capsys, tmp_path, key):
    """The same memory_len in a saved model's config.json, and 5000 digits (a ValueError from
    int())."""
    model = tmp_path / "model"
    model.mkdir()
    for name in os.listdir(saved["classifier"]):
        (model / name).write_bytes((saved["classifier"] / name).read_bytes())
    config = json.loads((model / "config.json").read_text())
    config["memory_len"] = 10 ** 11
    (model / "config.json").write_text(json.dumps(config))
    refused(capsys, "finetune", "--set", *TINY_RUN, f"{key}={model}",
            f"output_dir={tmp_path / 'run'}",
            parts=(f"{model / 'config.json'}: memory_len must be at most 2147483647",))
    (model / "config.json").write_text(json.dumps(config).replace(str(10 ** 11), "9" * 5000))
    refused(capsys, "finetune", "--set", *TINY_RUN, f"{key}={model}",
            f"output_dir={tmp_path / 'run'}",
            parts=(f"{model / 'config.json'}:1: an integer of 5000 digits",))
    assert not (tmp_path / "run").exists()


# -- predict: batch size and threads ----------------------------------------------------------
def test_predict_batch_size_is_checked_against_the_estimate(saved, tmp_path, capsys):
    out = tmp_path / "preds.jsonl"
    refused(capsys, "predict", saved["classifier"], "--input", saved["input"], "--output", out,
            "--no-progress", "--batch-size", HUGE,
            parts=(f"batch_size {HUGE}", "needs about", "task.json"))
    assert not out.exists()


def test_predict_threads_above_the_cpu_count_are_refused(saved, tmp_path):
    """paddle's OpenMP aborted the process (signal 6) on --threads 100000: a subprocess."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    out = tmp_path / "preds.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "ernie_doc.cli", "predict", str(saved["classifier"]), "--input",
         str(saved["input"]), "--output", str(out), "--no-progress", "--threads", "100000"],
        cwd=ROOT, env=dict(os.environ, PYTHONWARNINGS="ignore"), preexec_fn=limit,
        capture_output=True, text=True, timeout=SECONDS)
    err = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(err) == 1, (proc.returncode, err[-5:])
    assert err[0] == (f"error: --threads: 100000 exceeds the {len(os.sched_getaffinity(0))} "
                      f"CPUs this process may use")
    assert not out.exists()


def test_language_model_eval_mem_len_is_checked(saved, tmp_path, capsys):
    """task_options.eval_mem_len 10^9 in a language model's task.json: memories grow to it
    as a document is read; refused before the model loads, naming the key and the file."""
    document = tmp_path / "doc.txt"
    document.write_text("w1 w2 w3\n" * 40)
    out = tmp_path / "preds.jsonl"
    refused(capsys, "predict", saved["lm"], "--input", document, "--output", out, "--no-progress",
            parts=(f"eval_mem_len {HUGE}", str(saved["lm"] / "task.json"), "needs about"))
    assert not out.exists()


def test_benchmark_model_batch_size_is_checked_against_the_estimate(capsys):
    refused(capsys, "benchmarks.model", "--quick", "--no-paddlenlp", "--batch-size", 100_000,
            parts=("--batch-size 100000", "needs about"))


# -- the Python API -----------------------------------------------------------------------------
@pytest.mark.parametrize("call, message", [
    (lambda d: pipeline(str(d["classifier"]), batch_size=0), "batch_size must be a positive"),
    (lambda d: pipeline(str(d["lm"]), batch_size=0), "batch_size must be a positive"),
    (lambda d: Pipeline.from_pretrained(str(d["classifier"]), batch_size=True),
     "batch_size must be a positive"),
    (lambda d: Pipeline.from_pretrained(str(d["classifier"]), batch_size=HUGE),
     f"batch_size {HUGE}"),
    (lambda d: pipeline(str(d["classifier"]), threads=100_000), "threads: 100000 exceeds"),
], ids=["zero", "lm-zero", "bool", "huge", "threads"])
def test_python_api_sizes_are_checked(saved, call, message):
    """batch_size 0 is not "the default"; a batch that cannot fit is refused when the
    pipeline is made, not when its rows are."""
    with pytest.raises(PipelineError, match=message):
        call(saved)


def test_task_json_batch_size_is_checked(saved, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    for name in os.listdir(saved["classifier"]):
        (model / name).write_bytes((saved["classifier"] / name).read_bytes())
    record = json.loads((model / "task.json").read_text())
    record["config"]["eval_batch_size"] = HUGE
    (model / "task.json").write_text(json.dumps(record))
    with pytest.raises(PipelineError, match=f"task.json: .*batch_size {HUGE}.*needs about"):
        pipeline(str(model))


# -- YAML ------------------------------------------------------------------------------------------
LAUGHS = "task: longdep\nreader:\n  a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + \
    "".join(f"  {b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefg", "bcdefgh")) + \
    "model: *h\n"


def test_yaml_aliases_are_refused_in_one_short_line(tmp_path, capsys):
    """A few hundred bytes of aliases ("billion laughs") stood for 9^8 strings, and the error
    line that quoted them (model must be a string) was 380 MB: anchors and aliases are
    refused at their line."""
    config = tmp_path / "config.yaml"
    config.write_text(LAUGHS)
    assert len(LAUGHS) < 500
    line = refused(capsys, "finetune", config, "--set", f"output_dir={tmp_path / 'run'}",
                   parts=(f"{config}:3: invalid YAML", "&a: anchors and aliases"))
    assert len(line) < 300
    assert not (tmp_path / "run").exists()


def test_yaml_nul_and_long_integers_are_one_line(tmp_path, capsys):
    """A NUL character in the config file was PyYAML's two-line message; 5000 digits, in the
    file or in --set, a ValueError traceback from int()."""
    config = tmp_path / "config.yaml"
    config.write_bytes(b"task: longdep\nmodel: a\0b\n")
    refused(capsys, "finetune", config, "--set", f"output_dir={tmp_path / 'run'}",
            parts=(f"{config}:2: invalid YAML (character U+0000",))
    config.write_text("task: longdep\nwarmup_steps: " + "9" * 5000 + "\n")
    refused(capsys, "finetune", config, "--set", f"output_dir={tmp_path / 'run'}",
            parts=(f"{config}:2: invalid YAML (an integer of 5000 digits (at most 30))",))
    refused(capsys, "finetune", "--set", "task=longdep", "warmup_steps=" + "9" * 5000,
            parts=("an integer of 5000 digits (at most 30)",))
    assert not (tmp_path / "run").exists()


def test_every_yaml_read_goes_through_the_strict_loader():
    """The config file, --set, run_config.yaml read back by benchmarks/train.py, and
    benchmarks/finetune.py's --model-overrides share one loader: aliases, merges and deep nesting
    are errors with a line; what the package writes has no alias."""
    import yaml

    from ernie_doc.run_config import dump_yaml, load_config, parse_yaml
    for text, problem in (("a: &x 1\nb: *x\n", "&x: anchors and aliases are not read"),
                          ("a: {x: 1}\nb:\n  <<: *y\n", "*y: anchors and aliases"),
                          ("a: " + "[" * 150 + "]" * 150, "nested deeper than 100")):
        with pytest.raises(yaml.YAMLError, match=problem.replace("*", r"\*")):
            parse_yaml(text)
    with pytest.raises(ConfigError, match=r"override 'reader=\{a: &x \[1\], b: \*x\}': &x"):
        load_config(None, ["task=longdep", "reader={a: &x [1], b: *x}"])
    shared = [1, 2]
    text = dump_yaml({"eval_splits": shared, "test_splits": shared})
    assert "&" not in text and parse_yaml(text) == {"eval_splits": [1, 2], "test_splits": [1, 2]}
    sources = {name: (ROOT / "benchmarks" / name).read_text()
               for name in ("train.py", "finetune.py")}
    for name, source in sources.items():
        assert "parse_yaml(" in source and "safe_load" not in source, name


def test_error_lines_quote_a_bounded_part_of_a_value():
    """A 100,000-element list where a string belongs: the line names the key and quotes the
    start and end of the value, not all of it."""
    from ernie_doc.run_config import config_from_values
    with pytest.raises(ConfigError) as info:
        config_from_values({"task": "longdep", "model": list(range(100_000))}, "big.yaml")
    line = str(info.value)
    assert line.startswith("big.yaml: model: must be a string") and len(line) < 450
    assert "99999]" in line and "characters)" in line
    with pytest.raises(ConfigError) as info:
        config_from_values({"task": "longdep", "x" * 100_000: 1}, "big.yaml")
    assert len(str(info.value)) < 300


# -- memory estimates -----------------------------------------------------------------------------
def test_memory_estimate_parts_and_refusal():
    from ernie_doc import resources
    parts = resources.training_parts(params=1000, layers=2, rows=3, tokens=4, memory_len=5,
                                     hidden=8, heads=2)
    assert parts == {"weights": 4000, "layer objects": 2 * resources.LAYER_OVERHEAD,
                     "gradients + Adam moments": 12000,
                     "activations": 2 * 3 * (4 * (72 * 8 + 10 * 2 * 9 + 4 * 2 * 13)
                                             + 4 * 13 * 8),
                     "memories": 4 * 2 * 3 * 5 * 8}
    eval_parts = resources.training_parts(1000, 2, 3, 4, 5, 8, 2, training=False)
    assert eval_parts["activations"] == parts["activations"] // 2 and \
        "gradients + Adam moments" not in eval_parts
    total = sum(parts.values())
    assert resources.check_fits(parts, "x", available=total) == total
    with pytest.raises(ConfigError) as info:
        resources.check_fits({"weights": 3 << 30, "activations": 1 << 29}, "my model",
                             available=2 << 30)
    assert str(info.value) == ("my model: needs about 3.5 GiB (weights 3.0 GiB + activations "
                               "0.5 GiB) but the memory available is 2.0 GiB; use a smaller "
                               "model, batch_size or max_seq_len")


def test_available_memory_reads_meminfo_and_a_cgroup_limit(monkeypatch):
    from ernie_doc import resources
    monkeypatch.setattr(resources, "_meminfo_available", lambda: 8 << 30)
    monkeypatch.setattr(resources, "_cgroup_available", lambda: None)
    assert resources.available_memory("cpu") == 8 << 30
    monkeypatch.setattr(resources, "_cgroup_available", lambda: 1 << 30)
    assert resources.available_memory("cpu") == 1 << 30   # the tighter of the two
    monkeypatch.setattr(resources, "_meminfo_available", lambda: None)
    monkeypatch.setattr(resources, "_cgroup_available", lambda: None)
    assert resources.available_memory("cpu") is None
    assert resources.check_fits({"weights": 1 << 60}, "x") == 1 << 60   # unknown: no refusal


def test_gpu_memory_is_the_device_total(monkeypatch):
    """The GPU branch (never run on a GPU here): the device's total memory, None without
    CUDA."""
    import paddle

    from ernie_doc import resources

    class Props:
        total_memory = 80 << 30
    monkeypatch.setattr(paddle.device.cuda, "get_device_properties", lambda i: Props())
    assert resources.available_memory("gpu") == 80 << 30

    def no_cuda(i):
        raise ValueError("not compiled with CUDA")
    monkeypatch.setattr(paddle.device.cuda, "get_device_properties", no_cuda)
    assert resources.available_memory("gpu") is None


def test_parameter_count_is_exact_and_allocates_nothing():
    from helpers import tiny_config

    from ernie_doc import ErnieDocConfig, ErnieDocForSequenceClassification, resources
    config = tiny_config()
    real = ErnieDocForSequenceClassification(config, num_labels=3)
    assert resources.parameter_count(lambda n: ErnieDocForSequenceClassification(
        config.replace(num_hidden_layers=n), num_labels=3), config.num_hidden_layers) == \
        sum(int(np.prod(p.shape)) for p in real.parameters())
    assert config.min_parameters <= sum(int(np.prod(p.shape))
                                        for p in real.ernie_doc.parameters())
    # 2.2 billion parameters (8.8 GB of weights) counted without allocating them
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    big = ErnieDocConfig(hidden_size=2048, num_attention_heads=16, num_hidden_layers=40)
    n = resources.parameter_count(lambda n: ErnieDocForSequenceClassification(
        big.replace(num_hidden_layers=n)), big.num_hidden_layers)
    assert n > 2_000_000_000
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 200 * 1024   # KB


def test_free_heap_pages_go_back_to_the_system():
    """release_free_memory: 60 MB of freed blocks under a live one stay resident until it
    runs (glibc's malloc_trim); it is what predict calls once a long document is tokenized."""
    script = """
from ernie_doc.resources import _libc, release_free_memory
def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS:"))
if _libc() is None:
    print("no glibc")
    raise SystemExit
blocks = [bytearray(1000) for _ in range(60000)]
kept = blocks[-1:]   # the last block pins the top of the heap
del blocks
before = rss()
print(release_free_memory(), before - rss())
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    if proc.stdout.strip() == "no glibc":
        pytest.skip("malloc_trim is glibc's")
    released, freed = proc.stdout.split()
    assert released == "True" and int(freed) > 40 << 20
