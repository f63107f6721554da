"""Issue 13 for the trainer: what a run may delete, the config checks that run before anything
is written, memory estimates that refuse before allocating, and max_doc_tokens."""
import os
import resource
import subprocess
import sys

import numpy as np
import pytest
from helpers import ROOT

from ernie_doc.errors import ConfigError

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
    from ernie_doc.training.outdir import MANIFEST, clear_previous_run, foreign_entries
    out = tmp_path / "run"
    assert run(capsys, out)[0] == 0
    assert foreign_entries(out) == []            # the manifest lists every entry the run wrote
    before = sorted(os.listdir(out))
    assert {"run_config.yaml", "best", "checkpoints", "train_log.jsonl", MANIFEST} <= \
        set(before)
    assert run(capsys, out, "overwrite_output_dir=true")[0] == 0
    assert sorted(os.listdir(out)) == before
    # the library call itself never touches an entry the manifest does not list
    (out / "notes.txt").write_text("mine")
    (out / "analysis").mkdir()
    (out / "analysis" / "plot.py").write_text("mine")
    removed = clear_previous_run(str(out))
    assert set(removed) == set(before) - {MANIFEST}
    assert sorted(os.listdir(out)) == [MANIFEST, "analysis", "notes.txt"]
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
def test_absurd_model_sizes_are_refused_before_allocation(tmp_path, capsys):
    from ernie_doc import ErnieDocConfig, ErnieDocModel
    with pytest.raises(ConfigError, match=r"ErnieDocModel\(hidden_size=500000000, "
                                          r"num_hidden_layers=12, vocab_size=50265\): needs "
                                          r"about \d+\.\d GiB \(weights"):
        ErnieDocModel(ErnieDocConfig(hidden_size=500_000_000, num_attention_heads=1))
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
    from ernie_doc.kinds import base as tasks
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
    from ernie_doc.kinds.base import truncate_tokens
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


# -- a run deletes only what its manifest lists ----------------------------------------------
def _finetune(argv):
    """tools/finetune.py ARGV in this process → (exit code, stderr)."""
    import contextlib
    import io

    from tools.finetune import main
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            main(argv)
            code = 0
        except SystemExit as e:
            code = e.code
    return code, err.getvalue()


def _train(out, *overrides):
    from helpers import tiny_longdep
    code, err = _finetune(["--set", *tiny_longdep(f"output_dir={out}", *overrides)])
    assert code == 0, err
    return out


def _resume(out, *overrides):
    return _finetune(["--resume", str(out)] + (["--set", *overrides] if overrides else []))


def _one_line(code, err, message):
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and \
        message in lines[0], (code, err)
    return lines[0]


def _hashes(root):
    """{relative path: sha256} of every file under root, and every link with its target."""
    import hashlib
    out = {}
    for directory, dirs, files in os.walk(root):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(directory, d))]:
            path = os.path.join(directory, name)
            rel = os.path.relpath(path, root)
            out[rel] = ("-> " + os.readlink(path)) if os.path.islink(path) else \
                hashlib.sha256(open(path, "rb").read()).hexdigest()
    return out


MANIFEST = ".ernie-doc-run.json"


def _listed(out):
    """The entries the run's manifest lists ([] without one)."""
    import json
    path = os.path.join(out, MANIFEST)
    return json.load(open(path))["entries"] if os.path.exists(path) else []


def _copy(src, dst):
    import shutil
    shutil.copytree(src, dst, symlinks=True)
    return dst


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """A run stopped at step 2 of 8 (checkpoints at every step, one kept): copy it to change it."""
    return _train(tmp_path_factory.mktemp("stopped") / "run", "stop_at_step=2", "save_steps=1")


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A run that finished at max_steps=3 (linear schedule, no warmup, lr 0.01)."""
    return _train(tmp_path_factory.mktemp("finished") / "run", "max_steps=3")


LOOK_ALIKES = {"results.json": '{"mine": 1}\n', "vocab.txt": "my\nwords\n",
               "predictions_mine.jsonl": '{"id": 1}\n', "final/report.txt": "my report\n",
               "checkpoints/epoch-9/model.pt": b"\x80\x04another tool's weights"}


@pytest.mark.parametrize("overwrite", [[], ["overwrite_output_dir=true"]])
def test_a_new_run_never_deletes_look_alike_files(tmp_path, overwrite):
    """A folder of someone else's files named like a run's, without a manifest: refused in
    one line naming them, with or without overwrite_output_dir; every file as it was."""
    from helpers import tiny_longdep, write
    out = write(tmp_path / "mine", LOOK_ALIKES)
    before = _hashes(out)
    code, err = _finetune(["--set", *tiny_longdep(f"output_dir={out}", *overwrite)])
    _one_line(code, err, f"output_dir {out} holds files that are not a previous run's "
                         "(checkpoints/, final/, predictions_mine.jsonl, results.json, "
                         "vocab.txt): choose an empty or new directory, or move them")
    assert _hashes(out) == before


def test_every_entry_is_listed_in_the_manifest_before_it_is_created(tmp_path):
    """Whatever a run creates in OUTPUT_DIR (or in checkpoints/) through Python (open for
    writing, mkdir, rename, symlink), the manifest lists it already: a kill at any moment
    leaves nothing unlisted. Seen through an audit hook on every such call of a whole run
    with evaluation, best model, test split and checkpoint rotation."""
    import threading
    out = tmp_path / "run"
    root = str(out) + os.sep
    unlisted, seen = [], set()
    local = threading.local()   # the guard is per thread: VisualDL writes from its own

    def check(path):
        path = os.path.abspath(os.fsdecode(path))
        busy = local.__dict__.setdefault("busy", [])
        if busy or not path.startswith(root):
            return
        parts = os.path.relpath(path, out).split(os.sep)
        if parts[0] == MANIFEST or (parts[0].startswith(MANIFEST + ".") and
                                    parts[0].endswith(".tmp")):   # its own fresh temp file
            return
        busy.append(1)
        try:
            listed = _listed(out)
        finally:
            busy.pop()
        entry = parts[0] if parts[0] + "/" not in listed else "/".join(parts[:2])
        seen.add(entry)
        if entry not in listed and entry + "/" not in listed:
            unlisted.append(os.path.relpath(path, out))

    def hook(event, args):
        if not _AUDIT:
            return
        if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)) and \
                (args[2] or 0) & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):   # (path, mode, flags)
            check(args[0])
        elif event in ("os.mkdir", "os.symlink"):
            check(args[0] if event == "os.mkdir" else args[1])
        elif event == "os.rename":
            check(args[1])

    _install_audit_hook(hook)
    _AUDIT.append(1)
    try:
        _train(out, "test_splits=[test]", "eval_steps=2", "save_steps=1")
    finally:
        _AUDIT.clear()
    assert unlisted == []
    assert {"run_config.yaml", "train.log", "train_log.jsonl", "eval_results.json",
            "checkpoints/step-1.tmp", "checkpoints/latest", "best", ".ernie-doc-tmp"} <= seen
    from ernie_doc.training.outdir import foreign_entries
    assert foreign_entries(out) == []
    listed = _listed(out)
    assert {"run_config.yaml", "train.log", "best", "checkpoints/", "test_results.json",
            "predictions_test.jsonl"} <= set(listed)
    # rotated checkpoints are unlisted once removed: only the last one remains
    assert [e for e in listed if e.startswith("checkpoints/step-")] == \
        [f"checkpoints/{os.readlink(out / 'checkpoints' / 'latest')}"]


_AUDIT = []          # non-empty while a test watches the run's file operations
_HOOKS = []


def _install_audit_hook(hook):
    """sys.addaudithook is for the life of the process: install one dispatcher, once."""
    if not _HOOKS:
        sys.addaudithook(lambda event, args: [h(event, args) for h in _HOOKS])
    _HOOKS[:] = [hook]


def test_checkpoint_rotation_and_overwrite_spare_another_tools_checkpoints(stopped, tmp_path):
    """Another tool's checkpoints/epoch-9/ and a step-1/ the run did not write, added to a run's
    folder: the resumed run rotates its own step-N away (keep_checkpoints 1) and leaves
    them; overwriting the folder is refused, naming them; nothing of theirs changes."""
    from helpers import write
    out = _copy(stopped, tmp_path / "run")
    write(out, {"checkpoints/epoch-9/model.pt": b"another tool's weights",
                "checkpoints/step-1/model.pt": b"not this run's step 1",
                ".ernie-doc-tmp/.tmp-results.json.x1y2z3": "left by a killed write"})
    theirs = {k: v for k, v in _hashes(out).items()
              if k.startswith(("checkpoints/epoch-9", "checkpoints/step-1"))}
    code, err = _resume(out)
    assert code == 0, err
    assert os.listdir(out / ".ernie-doc-tmp") == []   # the run's own leftovers go
    names = sorted(os.listdir(out / "checkpoints"))
    assert "step-2" not in names and names == sorted(
        ["best-step-" + os.readlink(out / "best").split("-")[-1], "epoch-9", "latest",
         os.readlink(out / "checkpoints" / "latest"), "step-1"])
    before = _hashes(out)
    assert {k: before[k] for k in theirs} == theirs
    from helpers import tiny_longdep
    code, err = _finetune(["--set", *tiny_longdep(f"output_dir={out}",
                                                  "overwrite_output_dir=true")])
    _one_line(code, err, "holds files that are not a previous run's (checkpoints/epoch-9/, "
                         "checkpoints/step-1/)")
    assert _hashes(out) == before


def test_overwrite_removes_the_manifests_entries_and_refuses_a_look_alike_added_later(
        stopped, tmp_path):
    """A user's test_results.json (a name a run writes, but this one did not) in a run's
    folder: overwrite is refused naming it. Without it, overwrite removes exactly the listed
    entries: the new run's folder holds only its own."""
    from helpers import tiny_longdep

    from ernie_doc.training import outdir
    out = _copy(stopped, tmp_path / "run")
    (out / "test_results.json").write_text('{"mine": true}\n')
    before = _hashes(out)
    argv = ["--set", *tiny_longdep(f"output_dir={out}", "overwrite_output_dir=true")]
    _one_line(*_finetune(argv), "holds files that are not a previous run's "
                                "(test_results.json)")
    assert _hashes(out) == before
    os.remove(out / "test_results.json")
    code, err = _finetune(argv + ["max_steps=1"])
    assert code == 0, err
    assert outdir.foreign_entries(out) == []
    assert sorted(os.listdir(out / "checkpoints")) == ["best-step-1", "latest", "step-1"]


def test_a_run_folder_without_a_manifest_is_never_resumed_or_cleared(stopped, tmp_path):
    """A folder holding a run's files but no manifest was not written by a run: a new run
    (with or without overwrite_output_dir) and --resume are refused in one line, and nothing
    in it changes (another tool's checkpoints/epoch-9/ included)."""
    from helpers import tiny_longdep, write
    out = _copy(stopped, tmp_path / "run")
    (out / MANIFEST).unlink(missing_ok=True)
    write(out, {"checkpoints/epoch-9/model.pt": b"another tool's weights"})
    before = _hashes(out)
    for overwrite in ([], ["overwrite_output_dir=true"]):
        _one_line(*_finetune(["--set", *tiny_longdep(f"output_dir={out}", *overwrite)]),
                  f"output_dir {out} holds files that are not a previous run's (")
        assert _hashes(out) == before
    _one_line(*_resume(out), f"--resume {out}: no run there ({MANIFEST} missing)")
    assert _hashes(out) == before and not (out / MANIFEST).exists()


def test_a_damaged_manifest_never_deletes_outside_the_folder(stopped, tmp_path):
    import json
    out = _copy(stopped, tmp_path / "run")
    (tmp_path / "outside.txt").write_text("mine")
    manifest = out / MANIFEST
    manifest.write_text(json.dumps({"format": 1, "entries": ["../outside.txt"]}))
    from helpers import tiny_longdep
    _one_line(*_finetune(["--set", *tiny_longdep(f"output_dir={out}",
                                                 "overwrite_output_dir=true")]),
              f"{manifest}: entry '../outside.txt' is not a name inside the directory")
    assert (tmp_path / "outside.txt").read_text() == "mine"


# -- a finished run ------------------------------------------------------------------------
def test_a_finished_run_refuses_resume_unless_max_steps_or_epochs_is_raised(finished,
                                                                           tmp_path):
    import json

    from ernie_doc.training.optim import lr_lambda
    before = _hashes(finished)
    message = (f"--resume {finished}: the run finished at step 3 (max_steps 3): raise "
               "max_steps or epochs to continue")
    _one_line(*_resume(finished), message)
    # epochs raised, but max_steps still ends the run at step 3
    _one_line(*_resume(finished, "epochs=2"), message)
    assert _hashes(finished) == before
    out = _copy(finished, tmp_path / "run")
    code, err = _resume(out, "max_steps=6")
    assert code == 0, err
    log = [json.loads(line) for line in open(out / "train_log.jsonl")]
    assert [r["step"] for r in log] == [1, 2, 3, 4, 5, 6]
    # steps 4..6 follow the schedule of a 6-step run (linear to 0, no warmup), not lr 0
    schedule = lr_lambda("linear", 0, 6)
    assert [r["lr"] for r in log[3:]] == pytest.approx([0.01 * schedule(g) for g in (3, 4, 5)])
    assert all(r["lr"] > 0 for r in log[3:])
    assert "the learning rate follows the linear schedule of a 6-step run" in \
        (out / "train.log").read_text()
    state = json.loads((out / "checkpoints" / "latest" / "trainer_state.json").read_text())
    assert state["step"] == 6 and state["total_steps"] == 6
    # run_config.yaml now says max_steps 6: a later --resume finds the run finished at 6
    _one_line(*_resume(out), "the run finished at step 6 (max_steps 6)")


# -- the run folder: paths, names, links, manifests, one run at a time -------------------------
def test_a_tilde_in_output_dir_means_home_for_the_checks_and_the_writes(stopped, tmp_path,
                                                                        monkeypatch):
    """output_dir=~/x (a config's value, unexpanded by any shell) is $HOME/x for the checks
    and for every write: a run folder at ./~/x is not cleared as if it were the checked
    $HOME/x; nothing of it changes."""
    from helpers import tiny_longdep
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    _copy(stopped, work / "~" / "x")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    before = _hashes(work)
    code, err = _finetune(["--set", *tiny_longdep("output_dir=~/x", "max_steps=1")])
    assert code == 0, err
    assert _hashes(work) == before
    assert (home / "x" / "run_config.yaml").is_file()
    assert "output_dir: ~/x" in (home / "x" / "run_config.yaml").read_text()


def test_resume_never_replaces_a_users_file_named_like_a_run_output(stopped, tmp_path):
    """Files of the user's in a run folder, named like outputs the run writes but not listed
    in its manifest: --resume is refused in one line naming the first, nothing changes; an
    atomic write of the run's onto such a name is refused too (a new run's files appearing
    between its checks and its writes)."""
    from helpers import write

    from ernie_doc.training import outdir
    out = _copy(stopped, tmp_path / "run")
    write(out, {"eval_results.json": '{"mine": 1}\n', "predictions_dev.jsonl": '{"id": 1}\n',
                "curves.png": b"my plot", "best": "my notes on the best run\n"})
    before = _hashes(out)
    _one_line(*_resume(out), f"--resume {out}: {out / 'best'}: exists and was not written by "
                             f"this run (not listed in {MANIFEST}): move it away")
    assert _hashes(out) == before
    with pytest.raises(ConfigError, match="test_results.json: exists and was not written"):
        (out / "test_results.json").write_text("mine")
        outdir.write_text(str(out), "test_results.json", "the run's")
    assert (out / "test_results.json").read_text() == "mine"
    assert "test_results.json" not in _listed(out)


@pytest.mark.parametrize("entry, target", [
    ("train.log", "file"), ("vdl", "dir"), ("checkpoints", "dir"),
    ("checkpoints/latest", "dir"), ("best", "file")])
def test_resume_never_writes_through_a_link_planted_in_a_run_folder(stopped, tmp_path, entry,
                                                                    target):
    """A listed entry replaced by a symbolic link to someone else's file or folder: --resume
    is refused in one line naming it; the victim is unchanged. `best` and
    `checkpoints/latest`, the run's own links, must point into OUTPUT_DIR/checkpoints."""
    import shutil

    from helpers import write
    out = _copy(stopped, tmp_path / "run")
    victim = tmp_path / "victim"
    if target == "file":
        write(tmp_path, {"victim": "someone's log\n"})
    else:
        shutil.copytree(out / "checkpoints" if entry.startswith("checkpoints") else
                        out / entry if (out / entry).is_dir() else out, victim, symlinks=True)
    link = out / entry
    if link.is_dir() and not link.is_symlink():
        shutil.rmtree(link)
    else:
        link.unlink(missing_ok=True)
    link.symlink_to(victim)
    if entry == "best":   # a link the run did not list: its name is in the run's way
        message = f"{link}: exists and was not written by this run"
    elif entry in ("checkpoints/latest",):
        message = f"{link} points to {victim}, not to a checkpoint of this run"
    else:
        message = f"{link} is a symbolic link, not the file or folder this run wrote"
    before, theirs = _hashes(out), _hashes(tmp_path / "victim") if victim.is_dir() else \
        victim.read_text()
    _one_line(*_resume(out), message)
    assert _hashes(out) == before
    assert (_hashes(victim) if victim.is_dir() else victim.read_text()) == theirs


def test_appended_logs_are_never_opened_through_a_link(tmp_path):
    from ernie_doc.training import outdir
    (tmp_path / "victim").write_text("someone's\n")
    (tmp_path / "train.log").symlink_to(tmp_path / "victim")
    with pytest.raises(ConfigError, match="train.log: is a symbolic link"):
        outdir.open_append(str(tmp_path / "train.log"))
    assert (tmp_path / "victim").read_text() == "someone's\n"


@pytest.mark.parametrize("entries, files, message", [
    (["notes.txt", "analysis"], {"notes.txt": "mine", "analysis/plot.py": "mine"},
     "entry 'notes.txt' is not a name a run writes"),
    (["checkpoints"], {"checkpoints/epoch-9/model.pt": b"weights"},
     "entry 'checkpoints' is not a name a run writes"),
    (["vdl", "results.json"], {"vdl/events.out": b"another tool's", "results.json": "mine"},
     "lists vdl, results.json but not the run's run_config.yaml beside them"),
])
def test_a_planted_manifest_makes_overwrite_delete_nothing(tmp_path, entries, files, message):
    """A manifest that is not a run's (naming what no run writes, checkpoints/ whole, or a
    run's names without the run's run_config.yaml): overwrite_output_dir is refused in one
    line and every file stays."""
    import json

    from helpers import tiny_longdep, write
    out = write(tmp_path / "f", files)
    (out / MANIFEST).write_text(json.dumps({"format": 1, "entries": entries}))
    before = _hashes(out)
    _one_line(*_finetune(["--set", *tiny_longdep(f"output_dir={out}",
                                                 "overwrite_output_dir=true")]), message)
    assert _hashes(out) == before


def test_a_run_folder_in_use_is_refused_before_anything_changes(stopped, tmp_path):
    """While a process holds the run folder's lock (here: this test), another run into it
    (--resume in a second process; a new run with overwrite_output_dir in this one) is one
    line naming the holder's pid, exit 2, and nothing in the folder changes."""
    import fcntl

    from helpers import tiny_longdep
    out = _copy(stopped, tmp_path / "run")
    before = _hashes(out)
    fd = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        message = f"output_dir {out} is in use by another run (pid {os.getpid()})"
        proc = subprocess.run([sys.executable, str(ROOT / "tools" / "finetune.py"),
                               "--resume", str(out), "--set", "threads=1"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        _one_line(proc.returncode, proc.stderr, message)
        _one_line(*_finetune(["--set", *tiny_longdep(f"output_dir={out}",
                                                     "overwrite_output_dir=true")]), message)
        assert _hashes(out) == before
    finally:
        os.close(fd)
    code, err = _resume(out)   # once released, the run continues
    assert code == 0, err


def test_the_manifest_is_bounded_kept_in_memory_and_never_written_through_a_link(
        stopped, tmp_path):
    """A link planted at the manifest's old fixed temporary name is never followed (the run
    resumes, the link's target is unchanged); a resumed run reads its manifest once, not at
    every claim; a manifest of more than MAX_ENTRIES entries is refused in one line."""
    import json

    from ernie_doc.training import outdir
    out = _copy(stopped, tmp_path / "run")
    (tmp_path / "victim").write_text("mine")
    (out / (MANIFEST + ".tmp")).symlink_to(tmp_path / "victim")
    reads, manifest = [], str(out / MANIFEST)

    def hook(event, args):
        if _AUDIT and event == "open" and isinstance(args[0], str) and \
                args[0] == manifest and not (args[2] or 0) & (os.O_WRONLY | os.O_RDWR):
            reads.append(1)
    _install_audit_hook(hook)
    _AUDIT.append(1)
    try:
        code, err = _resume(out)
    finally:
        _AUDIT.clear()
    assert code == 0, err
    assert (tmp_path / "victim").read_text() == "mine"
    assert len(reads) <= 2, len(reads)
    big = _copy(stopped, tmp_path / "big")
    entries = _listed(big) + [f"predictions_{i}.jsonl" for i in range(outdir.MAX_ENTRIES)]
    (big / MANIFEST).write_text(json.dumps({"format": 1, "entries": entries}))
    _one_line(*_resume(big), f"{big / MANIFEST}: {len(entries):,} entries (a run lists at "
                             "most 100,000)")


def test_a_file_system_without_flock_runs_unlocked_with_a_warning(tmp_path, monkeypatch, caplog):
    """NFS without lockd or Lustre without -o flock: the lock cannot be taken, and the run goes
    on with a warning instead of a traceback (a held lock is still refused)."""
    import errno
    import fcntl
    import logging

    from ernie_doc.training import outdir

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")
    monkeypatch.setattr(fcntl, "flock", no_flock)
    with caplog.at_level(logging.WARNING, logger="ernie_doc.train"):
        assert outdir.lock_output_dir(str(tmp_path / "out")) is True
    assert "cannot lock it (No locks available)" in caplog.text
    assert (tmp_path / "out").is_dir()
    outdir.release_output_dir(str(tmp_path / "out"))
