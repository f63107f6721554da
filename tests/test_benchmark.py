"""tools/benchmark_model.py --quick: runs end to end, reports throughput, parity and streaming;
tools/benchmark_train.py (tools/pretrain.py with 1 and 2 processes) on a tiny corpus; each
tool's options stay its own."""
import json
import math
import os
import random
import subprocess
import sys

import pytest
from helpers import ROOT

from benchmarks import model as benchmark_model
from benchmarks import train as benchmark_train


@pytest.mark.slow
def test_benchmark_quick(tmp_path):
    pytest.importorskip("paddlenlp")
    out = tmp_path / "tmp.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "benchmark_model.py"), "--quick",
                           "--profile", "--output", str(out)], capture_output=True, text=True,
                          env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result == json.loads(proc.stdout[proc.stdout.index("{"):])
    assert sorted(os.listdir(tmp_path)) == ["tmp.json"]   # the profiler wrote no trace file

    # --profile: where one forward+backward step's time goes, by operator family, in dygraph,
    # compiled and compiled bf16 (where it runs)
    from ernie_doc.precision import cpu_bf16_problem
    profiles = result["profile"]
    assert set(profiles) == ({"ours", "ours_compiled"} |
                             ({"ours_compiled_bf16"} if cpu_bf16_problem() is None else set()))
    families = [name for name, _ in benchmark_model.PROFILE_FAMILIES]
    for name, profile in profiles.items():
        assert list(profile["seconds"]) == families + ["other operators", "outside operators"]
        assert profile["seconds"]["matmul"] > 0 and profile["seconds"]["softmax"] > 0
        # names matched; the compiled backward's wrapper event is not counted twice
        assert profile["seconds"]["other operators"] < 0.1 * profile["wall_s"], name
        total = sum(profile["seconds"].values())
        assert total == pytest.approx(max(total, profile["wall_s"]), rel=0.01)
        assert total < 1.1 * profile["wall_s"], name
    if "ours_compiled_bf16" in profiles:   # the autocast's conversions are their own family
        assert profiles["ours_compiled_bf16"]["seconds"]["cast (fp32 <-> bf16)"] > 0

    # ours as ernie-doc runs on CPU (stride kernels off), PaddleNLP as paddle's default
    assert result["setup"]["stride_kernels"] == {"ours": False, "paddlenlp": True}
    tp = result["throughput"]
    for model in ("ours", "paddlenlp"):
        assert tp[model]["forward_tokens_per_s"] > 0
        assert tp[model]["forward_backward_tokens_per_s"] > 0
    assert tp["ratio_ours_over_paddlenlp"]["forward_tokens_per_s"] > 0
    # the compiled training step (compile: true) is measured beside them, backward included
    assert tp["ours_compiled"]["forward_backward_tokens_per_s"] > 0
    assert "forward_tokens_per_s" not in tp["ours_compiled"]
    assert tp["ratio_compiled_over_dygraph"]["forward_backward_tokens_per_s"] > 0
    # and in bf16 where this paddle and CPU can (amp: bf16), else the reason it was not
    if cpu_bf16_problem() is None:
        assert tp["ours_compiled_bf16"]["forward_backward_tokens_per_s"] > 0
        assert tp["ratio_bf16_over_fp32_compiled"]["forward_backward_tokens_per_s"] == \
            pytest.approx(tp["ours_compiled_bf16"]["forward_backward_tokens_per_s"]
                          / tp["ours_compiled"]["forward_backward_tokens_per_s"], abs=2e-3)
    else:
        assert tp["bf16_skipped"] == cpu_bf16_problem()

    # the share of this CPU's matmul limit: sgemm rate over the necessary matmul work
    limit = result["matmul_limit"]
    assert limit["sgemm_2048_gflops"] > 1
    assert limit["training_mflop_per_token"] == pytest.approx(
        3 * limit["forward_mflop_per_token"], abs=0.2)
    for key, tokens in limit["limit_tokens_per_s"].items():
        share = limit["share_of_limit"]["ours"][key]
        assert share == pytest.approx(tp["ours"][key] / tokens, abs=2e-3)
    assert "forward_tokens_per_s" not in limit["share_of_limit"]["ours_compiled"]

    # the bf16 limit: one oneDNN bf16 product in a captured program, where bf16 can run
    if cpu_bf16_problem() is None:
        bf16 = result["bf16_limit"]
        assert bf16["bf16_2048_gflops"] > 1
        key = "forward_backward_tokens_per_s"
        assert bf16["share_of_limit"]["ours_compiled_bf16"][key] == pytest.approx(
            tp["ours_compiled_bf16"][key] / bf16["limit_tokens_per_s"][key], abs=2e-3)
        assert bf16["limit_tokens_per_s"][key] == pytest.approx(
            limit["limit_tokens_per_s"][key] * bf16["bf16_2048_gflops"]
            / limit["sgemm_2048_gflops"], rel=2e-3)
    else:
        assert result["bf16_limit"] == {"skipped": cpu_bf16_problem()}

    # per-segment overhead: the demo's L1 H64 model against its matmul time
    overhead = result["segment_overhead"]
    assert overhead["threads"] == 1 and overhead["paddle_gemm_2048_gflops"] > 1
    assert overhead["shape"] == {"layers": 1, "hidden_size": 64, "batch_size": 32,
                                 "seq_len": 8, "memory_len": 8}
    for name in ("dygraph_forward", "dygraph_forward_backward", "compiled_forward_backward"):
        row = overhead[name]
        mode = "forward" if name.endswith("_forward") else "forward_backward"
        matmul_ms = overhead["matmul_ms_at_gemm_rate"][mode]
        assert row["overhead_ms"] == pytest.approx(row["ms_per_segment"] - matmul_ms, abs=2e-3)
        assert row["times_matmul"] == pytest.approx(row["ms_per_segment"] / matmul_ms, rel=0.02)
        assert row["tokens_per_s"] == pytest.approx(256e3 / row["ms_per_segment"], rel=1e-3)
    assert overhead["matmul_ms_at_gemm_rate"]["forward_backward"] == pytest.approx(
        3 * overhead["matmul_ms_at_gemm_rate"]["forward"], abs=2e-4)

    parity = result["parity"]
    assert parity["ok"] and parity["max"] <= 1e-5
    assert set(parity["max_abs_diff"]) == {"sequence_output", "pooled_output", "memories"}
    assert all(0 <= d <= 1e-5 for d in parity["max_abs_diff"].values())

    streams = {s["document_tokens"]: s for s in result["streaming"]}
    assert set(streams) == {512, 2048}
    for length, s in streams.items():
        assert s["segments"] == length // 128
        assert s["wall_s"] > 0 and s["tokens_per_s"] > 0
        assert s["peak_rss_process_mb"] > 0
        # what the stream retains does not grow: after 2n segments exactly what after n
        for mode in ("eval", "train"):
            kept = s[f"retained_{mode}"]
            assert kept["flat"] and kept["growth_bytes"] == 0, (mode, kept)
            assert kept["allocated_bytes"][0] > 0
    assert streams[2048]["retained_eval"]["segments"] == [8, 16]
    summary = result["streaming_summary"]
    assert summary["length_ratio"] == 4.0 and summary["peak_rss_ratio"] > 0
    assert result["memory_retention"] == {"flat": True, "retained_growth_bytes": {
        "512": {"eval": 0, "train": 0}, "2048": {"eval": 0, "train": 0}}}
    assert result["environment"]["paddle"]


def test_profile_events_fall_in_their_operator_family():
    """The autocast's conversions are casts, a broadcast is not; the events that wrap other
    operators (the compiled backward, add_broadcast's PyLayer backward) count nowhere (their
    operators count)."""
    family = benchmark_model.operator_family
    assert family("pd_op.cast") == family("cast dygraph") == "cast (fp32 <-> bf16)"
    assert family("CastGradNode") == "cast (fp32 <-> bf16)"
    assert family("pd_op.broadcast_tensors") != "cast (fp32 <-> bf16)"   # no cast in it
    assert family("onednn_op.matmul_grad") == "matmul"
    assert family("Global_Dy2StGradNode") is None
    assert family("Global_GradNodePyLayer__BroadcastAdd") is None
    assert family("builtin_combine_instruction") == "other operators"


def test_each_contender_is_measured_with_its_own_stride_kernels():
    """Ours with paddle's stride kernels off (as ernie-doc runs on CPU), PaddleNLP with them
    on (paddle's default): the flag each model call sees, and off again after."""
    import argparse

    import paddle

    class Model:
        def eval(self):
            pass

        train = clear_gradients = eval

    seen = []

    def run(call, memories):
        seen.append(paddle.get_flags("FLAGS_use_stride_kernel")["FLAGS_use_stride_kernel"])
        out = paddle.ones([1], dtype="float32")
        out.stop_gradient = False
        return out, out, None

    args = argparse.Namespace(steps=1, warmup=0)
    for strided in (True, False):
        seen.clear()
        benchmark_model.measure("m", Model(), run, None, args, strided=strided)
        assert seen == [strided, strided]   # forward, then forward + backward
        assert not paddle.get_flags("FLAGS_use_stride_kernel")["FLAGS_use_stride_kernel"]


def test_throughput_is_the_median_of_alternating_rounds(capsys):
    import argparse
    order = []

    def timed(name, per_step):
        def run(call, memories):
            order.append(name)
            return per_step
        return run

    args = argparse.Namespace(batch_size=2, seq_len=8, steps=2, warmup=0, repeats=3)
    summary = benchmark_model.summarize(
        [{"forward": [1.0, 1.0]}, {"forward": [4.0, 4.0]}, {"forward": [2.0, 2.0]}], tokens=16)
    assert summary["forward_tokens_per_s_rounds"] == [16.0, 4.0, 8.0]
    assert summary["forward_tokens_per_s"] == 8.0          # the median, not the mean
    assert summary["forward_step_s"] == [1.0, 1.0, 4.0, 4.0, 2.0, 2.0]

    class Model:
        def eval(self):
            pass

        train = eval

        def clear_gradients(self):
            pass

    import paddle
    out = (paddle.ones([1]), paddle.ones([1]), None)
    tp = benchmark_model.throughput({"a": dict(name="a", model=Model(), run=timed("a", out),
                                               forward=False),
                                     "b": dict(name="b", model=Model(), run=timed("b", out),
                                               forward=False)}, None, args)
    # the models take turns round by round: a a b b | a a b b | a a b b
    assert order == (["a"] * 2 + ["b"] * 2) * 3
    assert set(tp) == {"a", "b"} and len(tp["a"]["forward_backward_tokens_per_s_rounds"]) == 3


@pytest.mark.slow
@pytest.mark.two_ranks
def test_benchmark_pretraining_throughput(tmp_path):
    # a tiny corpus: 6 documents of 100 words (about 50 distinct ones: enough text for a
    # 60-piece SentencePiece vocabulary), separated by blank lines
    rng = random.Random(0)
    words = ("the quick brown fox jumps over lazy dog while memory segments carry long context "
             "through recurrent layers of attention; every document is read twice, skimmed "
             "first and then retrospectively, so the model learns from whole texts rather than "
             "windows. Zebras yodel with vexing kites, and jovial wizards quietly pack boxes of "
             "gym equipment").split()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(" ".join(rng.choice(words) for _ in range(100))
                                  for _ in range(6)) + "\n", encoding="utf-8")
    out = tmp_path / "pretrain.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "benchmark_train.py"),
         "--config", str(ROOT / "configs" / "pretrain" / "tiny.yaml"),
         "--nproc", "1", "2", "--steps", "8", "--warmup", "2",
         "--output", str(out), "--set", f"data_dir={corpus}", "reader.format=blank_lines",
         "tokenizer=train", "tokenizer_vocab_size=60", "max_seq_len=32", "batch_size=2",
         "model_overrides={num_hidden_layers: 1, hidden_size: 32, num_attention_heads: 2, "
         "memory_len: 16, max_position_embeddings: 32}"],
        cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result == json.loads(proc.stdout[proc.stdout.index("{"):])
    assert "throughput" not in result and "streaming" not in result   # the mode is exclusive
    assert result["setup"]["tokens_counted"] == "every segment read, skim pass included"
    runs = {r["nproc"]: r for r in result["pretraining"]}
    assert set(runs) == {1, 2}
    for n, r in runs.items():
        assert r["steps_measured"] == 6 and r["steps_logged"] == 8
        assert r["rows_per_rank"] == 2 and r["max_seq_len"] == 32
        assert r["threads_per_process"] == max(1, (os.cpu_count() or 1) // n)
        for key in ("tokens_per_sec_per_rank_median", "tokens_per_sec_per_rank_mean",
                    "tokens_per_sec_median", "wall_s", "scaling_efficiency"):
            assert isinstance(r[key], float) and math.isfinite(r[key]) and r[key] > 0, (key, r)
        assert 0 <= r["input_share"] < 1   # the run's timing.json (tests/test_timing.py)
    assert runs[1]["scaling_efficiency"] == 1.0


def test_benchmark_options_stay_with_their_tool(capsys):
    config = str(ROOT / "configs" / "pretrain" / "tiny.yaml")
    for main, argv, message in (
            (benchmark_model.main, ["--pretrain-config", config], "unrecognized arguments"),
            (benchmark_train.main, ["--steps", "3"], "required: --config"),
            (benchmark_train.main, ["--config", config, "--steps", "5", "--warmup", "5"],
             "--warmup must be >= 0 and --steps greater than it"),
            (benchmark_train.main, ["--config", config, "--pretrain-steps", "20"],
             "unrecognized arguments: --pretrain-steps")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
        assert message in capsys.readouterr().err
    args = benchmark_train.parse_args(["--config", config, "--steps", "20"])
    assert (args.pretrain_config, args.pretrain_steps, args.pretrain_warmup) == (config, 20, 10)


def test_retained_memory_check_flags_a_leaking_loop():
    """The streaming benchmark's memory check (benchmarks.common.measure_retention: allocated
    bytes after n and after 2n segments) passes the benchmark's own train-mode stream and
    fails a loop that keeps one tensor per segment, by exactly what it keeps."""
    import numpy as np
    import paddle
    from helpers import tiny_config

    from benchmarks.common import measure_retention
    from ernie_doc import ErnieDocModel
    B, T = 2, 16
    config = tiny_config(max_position_embeddings=T)
    model = ErnieDocModel(config)
    ids = np.random.default_rng(0).integers(5, config.vocab_size, (B, 4 * T))
    types = paddle.zeros([B, T], dtype="int64")

    def segment(i):
        return (paddle.to_tensor(ids[:, i * T:(i + 1) * T]),
                paddle.ones([B, T], dtype="float32"))

    model.train()
    clean = measure_retention(benchmark_model.train_segment_step(model, segment, types, 4), 3)
    assert clean["segments"] == [3, 6] and clean["flat"] and clean["growth_bytes"] == 0

    model.eval()
    kept, memories = [], [None]

    def leaking(i):
        with paddle.no_grad():
            out = model(*segment(i % 4)[:1], memories[0], types, segment(i % 4)[1])
        memories[0] = out.memories
        kept.append(out.sequence_output)   # the leak: one [B, T, H] float32 per segment

    leak = measure_retention(leaking, 3)
    assert not leak["flat"] and leak["growth_bytes"] >= 3 * B * T * config.hidden_size * 4



def documented_commands(page: str = "docs/benchmarks.md"):
    """(block id, tool name, argv) of every `python tools/benchmark_<name>.py ...` line of the
    page's code blocks, continuation lines joined and `# comments` dropped."""
    import shlex

    import readme_fixtures as rf
    for block in rf.collect_blocks():
        if block.page != page:
            continue
        for line in block.code.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["python"] and words[1].startswith("tools/benchmark_"):
                yield block.id, words[1][len("tools/benchmark_"):-len(".py")], words[2:]


def test_documented_commands_parse(monkeypatch):
    """The benchmark commands the documentation shows (its measuring block is not run: it
    takes minutes) are accepted by their tools' argument checks, as a user types them from the
    checkout."""
    from benchmarks import explain, finetune, predict
    parsers = {"model": benchmark_model.parse_args, "train": benchmark_train.parse_args,
               "predict": predict.parse_args, "explain": explain.parse_args,
               # its check wants PaddleNLP's script and the data: the options alone
               "finetune": lambda argv: finetune.build_parser().parse_args(argv)}
    monkeypatch.chdir(ROOT)
    seen = []
    for where, tool, argv in documented_commands():
        try:
            parsers[tool](argv)
        except SystemExit as e:
            pytest.fail(f"{where}: tools/benchmark_{tool}.py {' '.join(argv)}: exit {e.code}")
        seen.append(tool)
    assert {"model", "train", "finetune", "explain"} <= set(seen), seen
