"""Issue 13 for the trainer: what a run may delete, the config checks that run before anything
is written, memory estimates that refuse before allocating, and max_doc_tokens."""
import os
import resource
import subprocess
import sys

import numpy as np
import pytest
from helpers import ROOT

from ernie_doc.config import ConfigError

TINY = [
    "task=longdep", "model=ernie-doc-small",
    "model_overrides={num_hidden_layers: 2, hidden_size: 32, num_attention_heads: 2, "
    "memory_len: 16, max_position_embeddings: 16}",
    "reader={num_docs: {train: 8, dev: 4}, segment_tokens: 14, max_segments: 4}",
    "max_seq_len=16", "stride=14", "batch_size=4", "epochs=1", "learning_rate=0.001",
    "logging_steps=0", "progress=false",
]


def run(capsys, out, *overrides, config=None):
    """tools/finetune.py in this process → (exit code, stderr)."""
    from tools.finetune import main
    argv = ([config] if config else []) + ["--set", *TINY, f"output_dir={out}", *overrides]
    try:
        main(argv)
        code = 0
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def refused(capsys, out, *overrides, message, config=None):
    """The run exits 2 with one `error:` line containing `message`."""
    code, err = run(capsys, out, *overrides, config=config)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err
    return lines[0]


# -- output directories ----------------------------------------------------------------------
def test_a_run_writes_only_its_own_names_and_a_rerun_removes_only_those(tmp_path, capsys):
    from ernie_doc.training.outdir import clear_previous_run, foreign_entries
    out = tmp_path / "run"
    assert run(capsys, out)[0] == 0
    assert foreign_entries(out) == []            # every name the run wrote is in RUN_ENTRIES
    before = sorted(os.listdir(out))
    assert {"run_config.yaml", "best", "checkpoints", "train_log.jsonl"} <= set(before)
    assert run(capsys, out, "overwrite_output_dir=true")[0] == 0
    assert sorted(os.listdir(out)) == before
    # the library call itself never touches a name a run does not write
    (out / "notes.txt").write_text("mine")
    (out / "analysis").mkdir()
    (out / "analysis" / "plot.py").write_text("mine")
    removed = clear_previous_run(str(out))
    assert set(removed) == set(before)
    assert sorted(os.listdir(out)) == ["analysis", "notes.txt"]
    assert (out / "analysis" / "plot.py").read_text() == "mine"


def test_user_files_survive_every_output_directory_case(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    assert run(capsys, out)[0] == 0
    (out / "notes.txt").write_text("mine")
    (out / "analysis").mkdir()
    listing = sorted(os.listdir(out))
    # 1. a re-run into a run directory that also holds the user's files: refused, untouched
    refused(capsys, out, "overwrite_output_dir=true",
            message="holds files that are not a previous run's (analysis/, notes.txt)")
    assert sorted(os.listdir(out)) == listing and (out / "notes.txt").read_text() == "mine"
    # 2. a fresh run into a directory of someone else's files
    other = tmp_path / "other"
    other.mkdir()
    (other / "thesis.tex").write_text("mine")
    refused(capsys, other, message="thesis.tex")
    assert os.listdir(other) == ["thesis.tex"]
    # 3. OUTPUT_DIR = DATA_DIR (twice, as run.sh's overwrite would), inside it, around it
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.txt").write_text("1\tgood\n")
    for target, message in ((data, "is " + str(data)), (data / "out", "lies inside"),
                            (tmp_path, "contains " + str(data))):
        for _ in range(2):
            refused(capsys, target, f"data_dir={data}", "overwrite_output_dir=true",
                    message=message)
    assert os.listdir(data) == ["train.txt"] and not (data / "out").exists()
    # 4. the current directory, the repository, $HOME
    work = tmp_path / "checkout"
    (work / ".git").mkdir(parents=True)
    (work / "README.md").write_text("mine")
    monkeypatch.chdir(work)
    refused(capsys, ".", "overwrite_output_dir=true", message="is the current directory")
    refused(capsys, tmp_path, message="contains the current directory")
    refused(capsys, ROOT, message="the repository")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    refused(capsys, tmp_path / "home", message="$HOME")
    assert sorted(os.listdir(work)) == [".git", "README.md"]
    # 5. the checkpoint a run starts from
    refused(capsys, out / "best" / "sub", f"init_checkpoint={out / 'best'}",
            message="lies inside")


def test_launch_sh_refuses_output_dir_equal_to_data_dir(tmp_path):
    """The scenario of the issue through run.sh (which always passes overwrite_output_dir)."""
    data = tmp_path / "imdb"
    (data / "train" / "pos").mkdir(parents=True)
    (data / "train" / "pos" / "0_9.txt").write_text("a good film")
    env = dict(os.environ, DATA_DIR=str(data), OUTPUT_DIR=str(data), PYTHON=sys.executable)
    for _ in range(2):
        proc = subprocess.run(["bash", "tasks/imdb/run.sh", "epochs=1"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert "is " + str(data) + ", an input of this run" in proc.stderr
        assert "Traceback" not in proc.stderr
    assert sorted(os.listdir(data)) == ["train"]


# -- configuration checked before anything is written ------------------------------------------
@pytest.mark.parametrize("overrides, message", [
    (["seed=abc"], "seed: must be an integer in [0, 2^32), got 'abc'"),
    (["seed=-5"], "seed: must be an integer in [0, 2^32), got -5"),
    (["seed=1e20"], "seed: must be an integer"),
    (["learning_rate=.nan"], "learning_rate: must be a finite non-negative number, got nan"),
    (["learning_rate=.inf"], "learning_rate: must be a finite non-negative number, got inf"),
    (["adam_epsilon=0"], "adam_epsilon: must be positive, got 0"),
    (["threads=100000"], "threads: 100000 exceeds the"),
    (["main_metric=bogus"], "main_metric 'bogus': kind 'classification' reports accuracy, "
                            "f1, loss"),
    (["max_examples.tset=3"], "max_examples.tset: 'tset' is not a split of this run "
                              "(train, dev)"),
    (["retro_feed=false", "train_skim=true"], "train_skim: trains the skim pass"),
    (["model_overrides.vocab_size=5"], "model_overrides.vocab_size 5 is smaller than the 32 "
                                       "ids the tokenizer produces"),
    (["model_overrides.pad_token_id=3"], "model_overrides.pad_token_id 3 is not the "
                                         "tokenizer's [PAD] id 0"),
    (["model_overrides.memory_len=0", "stride=null"], "stride: the model's memory_len is 0"),
    (["max_seq_len=1"], "max_seq_len 1: seq_len 1 leaves no room"),
    (["max_seq_len=2"], "max_seq_len 2: seq_len 2 leaves no room"),
    (["max_doc_tokens=-1"], "max_doc_tokens: must be a non-negative integer"),
    (["eval_splits=[{a: 1}]"], "eval_splits: must be a list of names"),
    (["allow_partial_checkpoint=maybe"], "allow_partial_checkpoint: must be true or false"),
    (["reader={a: 1, a: 2}"], "duplicate key 'a'"),
])
def test_bad_values_are_one_line_before_anything_is_written(tmp_path, capsys, overrides,
                                                             message):
    out = tmp_path / "run"
    refused(capsys, out, *overrides, message=message)
    assert not out.exists()


def test_duplicate_yaml_keys_name_the_file_and_line(tmp_path, capsys):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("task: longdep\nepochs: 1\nreader:\n  num_docs: 4\nepochs: 2\n")
    out = tmp_path / "run"
    refused(capsys, out, config=str(cfg),
            message=f"{cfg}:5: invalid YAML (duplicate key 'epochs' (first on line 2))")
    assert not out.exists()


def test_larger_vocab_size_override_is_kept_and_logged(tmp_path, capsys):
    code, _ = run(capsys, tmp_path / "run", "model_overrides.vocab_size=40")
    assert code == 0
    log = (tmp_path / "run" / "train.log").read_text()
    from ernie_doc import ErnieDocForSequenceClassification
    best = ErnieDocForSequenceClassification.from_pretrained(str(tmp_path / "run" / "best"))
    assert best.config.vocab_size == 40
    assert "vocab_size" in capsys.readouterr().out + log


# -- memory: refused before it is allocated ------------------------------------------------------
def test_memory_estimate_parts_and_refusal():
    from ernie_doc import resources
    parts = resources.training_parts(params=1000, layers=2, rows=3, tokens=4, memory_len=5,
                                     hidden=8, heads=2)
    assert parts == {"weights": 4000, "gradients + Adam moments": 12000,
                     "activations": 2 * 3 * 4 * (68 * 8 + 10 * 2 * 9),
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
    assert resources.parameter_count(lambda: ErnieDocForSequenceClassification(
        config, num_labels=3)) == sum(int(np.prod(p.shape)) for p in real.parameters())
    assert config.min_parameters <= sum(int(np.prod(p.shape))
                                        for p in real.ernie_doc.parameters())
    # 2.2 billion parameters (8.8 GB of weights) counted without allocating them
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    big = ErnieDocConfig(hidden_size=2048, num_attention_heads=16, num_hidden_layers=40)
    n = resources.parameter_count(lambda: ErnieDocForSequenceClassification(big))
    assert n > 2_000_000_000
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 200 * 1024   # KB


def test_absurd_model_sizes_are_refused_before_allocation(tmp_path, capsys):
    from ernie_doc import ErnieDocConfig, ErnieDocModel
    with pytest.raises(ConfigError, match=r"ErnieDocModel\(hidden_size=1000000000, "
                                          r"num_hidden_layers=12, vocab_size=50265\): needs "
                                          r"about \d+\.\d GiB \(weights"):
        ErnieDocModel(ErnieDocConfig(hidden_size=1_000_000_000, num_attention_heads=1))
    # the trainer counts gradients, Adam's moments and activations too, before building: a
    # model whose weights alone would fit is refused when training it cannot
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    line = refused(capsys, tmp_path / "run", "model_overrides.hidden_size=3200",
                   "model_overrides.num_attention_heads=32",
                   "model_overrides.num_hidden_layers=24", message="needs about")
    assert "3,452,556,802 parameters" in line and "(weights 12.9 GiB + gradients + Adam " \
        "moments 38.6 GiB" in line
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 500 * 1024
    assert not (tmp_path / "run").exists()
    refused(capsys, tmp_path / "run", "batch_size=100000000", message="activations")


# -- long documents ------------------------------------------------------------------------------
def test_max_doc_tokens_cuts_counts_and_logs(tmp_path, capsys):
    out = tmp_path / "run"
    assert run(capsys, out, "reader.segment_tokens=20", "reader.max_segments=3")[0] == 0
    full = (out / "train.log").read_text()
    assert "train: longest documents (segment reads): " in full
    out2 = tmp_path / "cut"
    assert run(capsys, out2, "reader.segment_tokens=20", "reader.max_segments=3",
               "max_doc_tokens=14")[0] == 0
    cut = (out2 / "train.log").read_text()
    # every longdep document has at least 2 segments of 20 tokens: all are cut to 14 tokens,
    # one window of T - 2 = 14, read twice (retrospective feed)
    assert "train: 8 documents longer than max_doc_tokens 14 were cut to it" in cut
    assert "dev: 4 documents longer than max_doc_tokens 14 were cut to it" in cut
    assert "train: longest documents (segment reads): train-0 2, train-1 2, train-2 2; " \
           "median 2" in cut


def test_one_huge_document_is_warned_about_up_front(tmp_path, capsys, monkeypatch):
    """A 3,000-token document among 10-token ones (a 5 MB line among reviews, scaled down)."""
    import types

    from ernie_doc.data import Document
    from ernie_doc.training import tasks
    assert tasks.truncate_tokens(list(range(10)), 4) == [0, 1, 2, 3]
    reader = types.ModuleType("hugedoc")
    reader.labels = lambda data_dir, options: ["0", "1"]
    reader.id_vocabulary = lambda options: ({"pad": 0, "cls": 1, "sep": 2}, 20)
    reader.read = lambda data_dir, split, options: [
        Document(f"{split}-{i}", ids=[5] * (3000 if i == 0 else 10), label=str(i % 2))
        for i in range(8 if split == "train" else 2)]
    monkeypatch.setattr(tasks, "load_reader", lambda task: reader)
    code, _ = run(capsys, tmp_path / "run", "task=hugedoc", "reader={}", "retro_feed=false")
    assert code == 0
    log = (tmp_path / "run" / "train.log").read_text()
    # 3,000 tokens in windows of 14 advancing by 14: 215 reads, while the 8 documents' 222
    # reads over 4 rows would need 56 steps
    assert "train: longest documents (segment reads): train-0 215, train-1 1, train-2 1; " \
           "median 1" in log
    assert "WARNING train: document train-0 alone takes 215 segment reads, so an epoch " \
           "needs at least 215 steps (its rows would need 56); max_doc_tokens caps a " \
           "document's length" in log
    code, _ = run(capsys, tmp_path / "cut", "task=hugedoc", "reader={}", "retro_feed=false",
                  "max_doc_tokens=50")
    log = (tmp_path / "cut" / "train.log").read_text()
    assert code == 0 and "WARNING" not in log
    assert "train: 1 documents longer than max_doc_tokens 50 were cut to it (2,950 tokens " \
           "not read)" in log


def test_transformer_xl_sizes_and_config_files_are_checked(tmp_path):
    from ernie_doc.lm.model import TransformerXLConfig, TransformerXLLM, load_lm_config
    with pytest.raises(ConfigError, match=r"TransformerXLLM\(n_layer=16, d_model=100000, "
                                          r"d_inner=400000, vocab_size=267735\): needs about"):
        TransformerXLLM(TransformerXLConfig(d_model=100000, d_inner=400000, n_head=10,
                                            d_head=10000))
    (tmp_path / "lm_config.json").write_text('{"n_layer": 2, "bogus": 1}')
    with pytest.raises(ConfigError, match=f"^{tmp_path / 'lm_config.json'}: bogus: unknown "):
        load_lm_config(str(tmp_path))
    (tmp_path / "lm_config.json").write_text('[1, 2]')
    with pytest.raises(ConfigError, match="expected a JSON object, got list"):
        load_lm_config(str(tmp_path))
    (tmp_path / "lm_config.json").write_text('{"n_layer": 2,')
    with pytest.raises(ConfigError, match=r"lm_config.json:1: invalid JSON"):
        load_lm_config(str(tmp_path))


def test_eval_only_refuses_a_checkpoint_without_the_trained_head(tmp_path, capsys):
    from helpers import tiny_config

    from ernie_doc import ErnieDocModel
    encoder = tmp_path / "encoder"
    ErnieDocModel(tiny_config(vocab_size=32, pad_token_id=0, memory_len=16)).save_pretrained(
        str(encoder))
    out = tmp_path / "run"
    refused(capsys, out, "eval_only=true", f"init_checkpoint={encoder}",
            message=f"eval_only: {encoder} lacks 2 tensors of ErnieDocForSequenceClassification "
                    "(linear.weight, linear.bias): there is no trained model to evaluate")
    assert not out.exists()


def test_config_files_that_are_fifos_are_refused_without_blocking(tmp_path, capsys):
    import threading

    from ernie_doc import ErnieDocConfig
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    errors = []

    def read():
        try:
            ErnieDocConfig.from_json(fifo)
        except ConfigError as e:
            errors.append(str(e))
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(30)
    assert errors == [f"{fifo}: file is a FIFO, not a regular file"]
    yaml_fifo = tmp_path / "config.yaml"
    os.mkfifo(yaml_fifo)
    refused(capsys, tmp_path / "run", config=str(yaml_fifo),
            message=f"{yaml_fifo}: config file is a FIFO, not a regular file")


def _snapshot(root):
    """{relative path: bytes} of every file under root (links as their targets' names)."""
    out = {}
    for directory, _, files in os.walk(root):
        for name in files:
            path = os.path.join(directory, name)
            out[os.path.relpath(path, root)] = open(path, "rb").read()
    return out


def test_a_refused_resume_writes_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    assert run(capsys, out, "stop_at_step=3", "save_steps=1")[0] == 0
    step = out / "checkpoints" / "step-3"
    before = _snapshot(out)
    from tools.finetune import main

    def resume(*overrides):
        try:
            main(["--resume", str(out), *(["--set", *overrides] if overrides else [])])
        except SystemExit as e:
            return e.code, capsys.readouterr().err
        return 0, capsys.readouterr().err
    # the data changed since: refused before the run's logs are touched
    code, err = resume("reader.num_docs.train=12")
    assert code == 2 and "the data or config changed (14 steps then, 22 now)" in err, err
    assert _snapshot(out) == before
    # a damaged file of the checkpoint, and a damaged log line that is not the last
    (step / "rank-0.npz").write_bytes(b"PK\x03\x04 cut short")
    code, err = resume()
    assert code == 2 and err.startswith(f"error: {step / 'rank-0.npz'}: ") and \
        err.count("\n") == 1, err
    assert _snapshot(out) == dict(before, **{"checkpoints/step-3/rank-0.npz":
                                             b"PK\x03\x04 cut short"})


def test_truncate_tokens_cuts_every_kind_of_tokenized_text_alike():
    from ernie_doc.data.span import TokenizedText
    from ernie_doc.training.tasks import truncate_tokens
    from tasks.hotpotqa.task import Layout
    from tasks.openkp.task import WordTokens
    a = np.arange(6)
    text = truncate_tokens(TokenizedText(a + 10, a * 2, a * 2 + 1), 4)     # span contexts
    assert text.ids.tolist() == [10, 11, 12, 13] and text.ends.tolist() == [1, 3, 5, 7]
    layout = truncate_tokens(Layout(a, a + 1, a + 2, a + 3, a + 4, a + 5), 2)   # HotpotQA
    assert [getattr(layout, f).tolist() for f in ("ids", "kind", "end")] == \
        [[0, 1], [1, 2], [5, 6]]
    words = truncate_tokens(WordTokens(a + 20, np.asarray([0, 2, 3, 5])), 4)   # OpenKP
    assert words.ids.tolist() == [20, 21, 22, 23] and words.word_starts.tolist() == [0, 2, 3]
    assert truncate_tokens(a, 3).tolist() == [0, 1, 2]
