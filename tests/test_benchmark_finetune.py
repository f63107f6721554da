"""tools/benchmark_finetune.py (benchmarks/finetune.py): our fine-tuning beside
PaddleNLP's run_classifier.py. A stand-in reference script proves the driver's patches and the
timing, parsing and peak-RSS plumbing; PaddleNLP's real script runs when a folder holding it is
given (ERNIE_DOC_PADDLENLP_ERNIE_DOC_DIR); bad input and a failing contender give one error."""
import json
import os
import tempfile

import pytest
from helpers import shared_path

from benchmarks import finetune as benchmark_finetune

PADDLENLP_DIR_VARIABLE = "ERNIE_DOC_PADDLENLP_ERNIE_DOC_DIR"
TINY = "{num_hidden_layers: 1, hidden_size: 32, num_attention_heads: 2}"
BALLAST_MIB = 256

# Stands in for run_classifier.py: the calls the real one makes that the driver replaces, the
# two paddle incompatibilities it works around, checks of what they return, then PaddleNLP's
# step lines 0.2 s apart while holding BALLAST_MIB of memory (the child's peak RSS shows it).
FAKE_SCRIPT = f'''
import argparse
import os
import time

parser = argparse.ArgumentParser()
for name in ("batch_size", "max_seq_length", "memory_length", "epochs", "max_steps",
             "save_steps", "logging_steps"):
    parser.add_argument("--" + name, type=int)
for name in ("learning_rate",):
    parser.add_argument("--" + name, type=float)
for name in ("device", "output_dir", "model_name_or_path", "dataset"):
    parser.add_argument("--" + name)
args = parser.parse_args()

import paddle
from paddlenlp.transformers import ErnieDocBPETokenizer, ErnieDocForSequenceClassification

from datasets import load_dataset

train, test = load_dataset("imdb", split=["train", "test"])
assert (len(train), len(test)) == (4, 2), (len(train), len(test))
assert train.features["label"].num_classes == 2 and set(train["label"]) <= {{0, 1}}
tokenizer = ErnieDocBPETokenizer.from_pretrained(args.model_name_or_path)
tokens = tokenizer.tokenize(train[0]["text"])   # splits sentences through "nltk"
assert len(tokens) > 10 and all(t.isdigit() for t in tokens), tokens[:10]
model = ErnieDocForSequenceClassification.from_pretrained(args.model_name_or_path, num_classes=2)
config = model.ernie_doc.config
shape = (config["num_hidden_layers"], config["hidden_size"], config["memory_len"],
         config["vocab_size"])
assert shape == (1, 32, args.memory_length, 50265), shape
assert os.environ["OMP_NUM_THREADS"] == "1"
paddle.optimizer.AdamW(parameters=model.parameters(), lr_ratio=lambda p: 1.0)
correct = paddle.metric.Accuracy().compute(paddle.randn([2, 2]), paddle.to_tensor([[0], [1]]))
correct * paddle.to_tensor([1], dtype="int64")
from ernie_doc.utils import denormals_flushed
# --flush-denormals both flushes for the reference too; by default it runs as it is
assert denormals_flushed() in (None, os.environ.get("EXPECT_FLUSHED") == "1")
ballast = b"x" * ({BALLAST_MIB} << 20)
for step in range(1, args.max_steps + 1):
    time.sleep(0.2)
    print(f"[INFO] - train: global step {{step}}, epoch: 0, loss: 0.69, acc:0.5, lr: 0.0, "
          "speed: 5.00 step/s", flush=True)
print("Final test result:")
'''


def shared_inputs():
    """(the IMDB sample, the released BPE tokenizer's folder), or skip without ../shared."""
    return (shared_path("data", "imdb", "imdb_test_sample5k.tsv"),
            shared_path("assets", "ernie-doc", "base-en"))


def tiny_args(reference_dir, out, *extra):
    data, tokenizer = shared_inputs()
    return ["--paddlenlp-dir", str(reference_dir), "--data", str(data), "--tokenizer",
            str(tokenizer), "--train-docs", "4", "--test-docs", "2", "--batch-size", "2",
            "--seq-len", "32", "--memory-len", "8", "--threads", "1",
            "--model-overrides", TINY, "--output", str(out), *extra]


def run_benchmark(args, capsys):
    """main(args) → (exit status, the JSON it printed or None, its stderr)."""
    code = benchmark_finetune.main(args)
    captured = capsys.readouterr()
    printed = json.loads(captured.out[captured.out.index("{"):]) if code == 0 else None
    return code, printed, captured.err


def check_result(result, steps, warmup):
    setup = result["setup"]
    assert setup["stride_ours"] == 8 and setup["tokens_per_step"] == 64
    assert (setup["steps"], setup["warmup_steps"], setup["threads"]) == (steps, warmup, 1)
    for name in ("paddlenlp", "ours"):
        numbers = result["contenders"][name]
        assert numbers["runs"][0]["steps_logged"] == steps
        assert 0 < numbers["time_to_first_step_s"] < numbers["wall_s"]
        assert numbers["seconds_per_step"] > 0 and numbers["peak_rss_mib"] > 0
        assert numbers["tokens_per_sec"] == pytest.approx(64 / numbers["seconds_per_step"],
                                                          rel=1e-3)
        assert numbers["after_last_step_s"] >= 0
    ratio = result["ratio_ours_over_paddlenlp"]
    ours, theirs = result["contenders"]["ours"], result["contenders"]["paddlenlp"]
    assert set(ratio) == set(benchmark_finetune.MEASURES)
    for key, value in ratio.items():
        expected = ours[key] / theirs[key] if theirs[key] else None
        assert value == pytest.approx(expected, abs=2e-3), key


def test_stand_in_script_through_the_driver_timing_and_rss(tmp_path, capsys):
    reference = tmp_path / "ernie-doc"
    reference.mkdir()
    (reference / "run_classifier.py").write_text(FAKE_SCRIPT, encoding="utf-8")
    out = tmp_path / "result.json"
    code, printed, err = run_benchmark(tiny_args(reference, out, "--steps", "4",
                                                 "--warmup", "1"), capsys)
    assert code == 0, err[-3000:]
    result = json.loads(out.read_text())
    assert result == printed
    check_result(result, steps=4, warmup=1)
    fake = result["contenders"]["paddlenlp"]
    # its step lines come 0.2 s apart (more on a busy machine, never less)
    assert 0.19 <= fake["seconds_per_step"] < 1.5
    assert fake["time_to_first_step_s"] >= 0.2
    # the child's own peak: the stand-in held its ballast, our run did not
    assert fake["peak_rss_mib"] >= BALLAST_MIB
    from tools.benchmark_finetune import main  # the checkout's entry point runs this module
    assert main is benchmark_finetune.main


def test_real_paddlenlp_script(tmp_path, capsys):
    directory = os.environ.get(PADDLENLP_DIR_VARIABLE)
    if not directory:
        pytest.skip(f"set {PADDLENLP_DIR_VARIABLE} to a folder holding PaddleNLP's "
                    "model_zoo/ernie-doc (run_classifier.py, data.py, metrics.py)")
    out = tmp_path / "result.json"
    code, printed, err = run_benchmark(tiny_args(directory, out, "--steps", "3",
                                                 "--warmup", "1"), capsys)
    assert code == 0, err[-3000:]
    check_result(printed, steps=3, warmup=1)


def test_a_folder_without_the_script_is_one_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        benchmark_finetune.main(["--paddlenlp-dir", str(tmp_path), "--data", "x.tsv",
                                 "--tokenizer", "tok"])
    assert info.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and str(tmp_path) in errors[0] and "run_classifier.py" in errors[0]


def test_a_failing_contender_is_named_with_its_output(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))   # the files it keeps land here
    reference = tmp_path / "ernie-doc"
    reference.mkdir()
    (reference / "run_classifier.py").write_text(
        "import sys\nprint('train: global step 1, epoch: 0')\nprint('the reference broke')\n"
        "sys.exit(3)\n", encoding="utf-8")
    code, _, err = run_benchmark(tiny_args(reference, tmp_path / "r.json", "--steps", "2",
                                           "--warmup", "1"), capsys)
    assert code == 1
    first = next(line for line in err.splitlines() if "error:" in line)
    assert first.startswith("error: paddlenlp (PaddleNLP's run_classifier.py) failed (exit 3")
    assert "the reference broke" in err
    assert not (tmp_path / "r.json").exists()
    kept = next(tmp_path.glob("ernie-doc-bench-finetune-*/paddlenlp-*"))
    assert str(kept) in first


def test_medians_over_repeats_and_the_ratio():
    runs = [dict.fromkeys(benchmark_finetune.MEASURES, v) for v in (1.0, 5.0, 2.0)]
    summary = benchmark_finetune.median_of(runs)
    assert summary["seconds_per_step"] == 2.0 and summary["runs"] == runs
    ours = dict(summary, after_last_step_s=3.0)
    reference = dict(summary, after_last_step_s=0.0, peak_rss_mib=4.0)
    ratio = benchmark_finetune.ratios(ours, reference)
    assert ratio["seconds_per_step"] == 1.0 and ratio["peak_rss_mib"] == 0.5
    assert ratio["after_last_step_s"] is None   # nothing to divide by


def test_memory_len_is_not_a_model_override(tmp_path, capsys):
    (tmp_path / "run_classifier.py").write_text("", encoding="utf-8")
    (tmp_path / "data.tsv").write_text("qid\tlabel\tscore\ttext_a\n", encoding="utf-8")
    for name in benchmark_finetune.TOKENIZER_FILES:
        (tmp_path / name).write_text("", encoding="utf-8")
    with pytest.raises(SystemExit) as info:
        benchmark_finetune.main(["--paddlenlp-dir", str(tmp_path), "--data",
                                 str(tmp_path / "data.tsv"), "--tokenizer", str(tmp_path),
                                 "--model-overrides", "{memory_len: 4}"])
    assert info.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "memory_len is --memory-len" in errors[0]


MODES = [("ours", False, True), ("both", True, True), ("none", False, False)]


@pytest.mark.parametrize("mode, theirs, ours", MODES)
def test_flush_denormals_modes_build_the_commands(tmp_path, mode, theirs, ours):
    reference = tmp_path / "ernie-doc"
    reference.mkdir()
    (reference / "run_classifier.py").write_text("", encoding="utf-8")
    args = benchmark_finetune.parse_args(tiny_args(reference, tmp_path / "r.json",
                                                   "--flush-denormals", mode))
    assert benchmark_finetune.setup(args)["flush_denormals"] == {"ours": ours,
                                                                  "paddlenlp": theirs}
    command = benchmark_finetune.ours_command(args, "data", "out")
    assert f"flush_denormals={str(ours).lower()}" in command
    # PaddleNLP's optimiser whatever the steps (ours would clip a run without warmup)
    assert {"max_grad_norm=0", "adam_epsilon=1e-8"} <= set(command)
    driver = benchmark_finetune.paddlenlp_command(args, "data", "out")
    assert ("--flush-denormals" in driver[:driver.index("--")]) == theirs


def test_flush_denormals_both_flushes_in_the_reference_process(tmp_path, capsys, monkeypatch):
    """End to end for the one mode that changes the reference's process (the default, which
    leaves it as it is, runs in test_stand_in_script_through_the_driver_timing_and_rss)."""
    reference = tmp_path / "ernie-doc"
    reference.mkdir()
    (reference / "run_classifier.py").write_text(FAKE_SCRIPT, encoding="utf-8")
    monkeypatch.setenv("EXPECT_FLUSHED", "1")   # the stand-in asserts it
    code, printed, err = run_benchmark(tiny_args(reference, tmp_path / "r.json", "--steps", "2",
                                                 "--warmup", "1", "--flush-denormals", "both"),
                                       capsys)
    assert code == 0, err[-3000:]
    assert printed["setup"]["flush_denormals"] == {"ours": True, "paddlenlp": True}
    assert "flush_denormals=true" in printed["contenders"]["ours"]["command"]
