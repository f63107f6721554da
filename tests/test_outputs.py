"""One rule for every output path (ernie_doc.outputs) and `predict --resume`'s provenance.

An output is never an input (a symbolic link to it, the input through a linked folder, a hard
link), never inside an input folder, never a FIFO or device (refused without being opened),
never an existing file without --overwrite, and --overwrite replaces the path itself, never
what a link there points to. `--resume` continues only a predictions file whose sidecar names
this model. A file an input folder links to is an input too; a folder swapped for a link after
the check redirects nothing; a locked or swapped output is not written; names too long, /dev,
/proc and /sys are refused before anything changes; --resume reads in bounded memory. Every
case checks the user's files by sha256 before and after. Two tiny imdb runs (a few seconds
each) are shared by the whole module."""
import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys

import pytest
from helpers import ROOT, exits, one_error_line
from test_tasks import WORDS, imdb_tsv, run_task, vocab_dir

from ernie_doc.cli import predict as predict_cli

DOCS = [{"id": "a", "text": "a good movie"}, {"id": "b", "text": "a bad film the end"}]
# no final newline: today's repair of a "cut short" last line would cut the whole file
INPUT = "\n".join(json.dumps(d) for d in DOCS)


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A fine-tuned imdb model, and a copy of it with other weights (every tensor moved a
    little) → (best/ of one, of the other)."""
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import save_file
    tmp = tmp_path_factory.mktemp("models")
    run_task("imdb", imdb_tsv(tmp), tmp / "run", vocab_dir(tmp / "vocab", WORDS),
             "test_splits=[]")
    one, two = tmp / "run" / "best", tmp / "two"
    shutil.copytree(one, two)
    with safe_open(str(one / "model.safetensors"), "np") as f:
        tensors = {k: f.get_tensor(k) + np.float32(0.01) for k in f.keys()}
        metadata = f.metadata()
    os.remove(two / "model.safetensors")
    save_file(tensors, str(two / "model.safetensors"), metadata=metadata)
    return one, two


@pytest.fixture
def work(tmp_path):
    """tmp_path/data/in.jsonl, the input."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "in.jsonl").write_text(INPUT, encoding="utf-8")
    return tmp_path


def predict(capsys, model, *argv, code=0):
    """ernie-doc predict in-process → its stderr's one error line (code 2) or its summary."""
    argv = [str(model), *[str(a) for a in argv], "--no-progress"]
    if code == 0:
        predict_cli.main(argv)
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    exits(code, lambda: predict_cli.main(argv))
    return one_error_line(capsys)


# -- aliases of the input -----------------------------------------------------------------------
ALIASES = {
    "symlink": lambda tmp: os.symlink(tmp / "data" / "in.jsonl", tmp / "out.jsonl")
    or tmp / "out.jsonl",
    "linked folder": lambda tmp: os.symlink(tmp / "data", tmp / "link") or
    tmp / "link" / "in.jsonl",
    "hard link": lambda tmp: os.link(tmp / "data" / "in.jsonl", tmp / "out.jsonl")
    or tmp / "out.jsonl",
}


@pytest.mark.parametrize("flag", ["--overwrite", "--resume"])
@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_an_alias_of_the_input_is_refused(models, work, capsys, alias, flag):
    before = sha(work / "data" / "in.jsonl")
    output = ALIASES[alias](work)
    line = predict(capsys, models[0], "--input", work / "data" / "in.jsonl", "--output", output,
                   flag, code=2)
    assert "is the input" in line and str(output) in line
    assert sha(work / "data" / "in.jsonl") == before
    assert not os.path.exists(str(output) + ".meta.json")


def test_a_hard_link_to_a_file_of_an_input_folder_is_refused(models, work, capsys):
    docs = work / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("a good movie", encoding="utf-8")
    before = sha(docs / "a.txt")
    os.link(docs / "a.txt", work / "out.jsonl")
    line = predict(capsys, models[0], "--input", docs, "--output", work / "out.jsonl",
                   "--overwrite", code=2)
    assert "of the input folder" in line and sha(docs / "a.txt") == before


def test_an_output_inside_the_input_or_model_folder_is_refused(models, work, capsys):
    docs = work / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("a good movie", encoding="utf-8")
    for folder, output in ((docs, docs / "preds.txt"), (models[0], models[0] / "preds.jsonl")):
        line = predict(capsys, models[0], "--input", docs, "--output", output, code=2)
        assert f"inside the input folder {folder}" in line
        assert not output.exists()
    assert sorted(os.listdir(docs)) == ["a.txt"]


# -- --overwrite replaces the path, never what a link there shows -------------------------------
@pytest.mark.parametrize("link", [os.symlink, os.link])
def test_overwrite_replaces_a_link_not_its_target(models, work, capsys, link):
    outside = work / "notes.txt"
    outside.write_text("the user's notes\n", encoding="utf-8")
    before = sha(outside)
    link(outside, work / "out.jsonl")
    summary = predict(capsys, models[0], "--input", work / "data" / "in.jsonl", "--output",
                      work / "out.jsonl", "--overwrite")
    assert summary["documents"] == 2 and sha(outside) == before
    assert not os.path.islink(work / "out.jsonl") and os.stat(work / "out.jsonl").st_nlink == 1
    assert [json.loads(x)["doc_id"] for x in open(work / "out.jsonl")] == ["a", "b"]


# -- --resume continues only our own file, for this model ---------------------------------------
@pytest.mark.parametrize("name, content", [
    ("notes.json", '{"title": "my notes", "pages": 3}\n'),
    ("notes.txt", "first line of my notes\nsecond line, no newline"),
])
def test_resume_refuses_a_file_it_did_not_write(models, work, capsys, name, content):
    notes = work / name
    notes.write_text(content, encoding="utf-8")
    line = predict(capsys, models[0], "--input", work / "data" / "in.jsonl", "--output", notes,
                   "--resume", code=2)
    assert "did not write it" in line and notes.read_text(encoding="utf-8") == content
    assert sorted(os.listdir(work)) == ["data", name]


def test_resume_refuses_another_models_predictions(models, work, capsys):
    out = work / "out.jsonl"
    predict(capsys, models[0], "--input", work / "data" / "in.jsonl", "--output", out)
    lines = out.read_text(encoding="utf-8").splitlines(keepends=True)
    out.write_text(lines[0] + lines[1][:7], encoding="utf-8")   # stopped mid-line
    before = sha(out)
    line = predict(capsys, models[1], "--input", work / "data" / "in.jsonl", "--output", out,
                   "--resume", code=2)
    assert sha(out) == before and "written by a different model" in line
    record = sha(str(out) + ".meta.json")
    # the model that wrote it continues it: the cut line dropped, the rest predicted once
    summary = predict(capsys, models[0], "--input", work / "data" / "in.jsonl", "--output", out,
                      "--resume")
    assert summary["skipped"] == 1 and summary["documents"] == 1
    assert out.read_text(encoding="utf-8").splitlines(keepends=True) == lines
    # --overwrite with the other model: its own record replaces the first one's
    predict(capsys, models[1], "--input", work / "data" / "in.jsonl", "--output", out,
            "--overwrite")
    assert sha(str(out) + ".meta.json") != record


def test_resume_refuses_a_damaged_line_before_the_last(models, work, capsys):
    out = work / "out.jsonl"
    predict(capsys, models[0], "--input", work / "data" / "in.jsonl", "--output", out)
    lines = out.read_text(encoding="utf-8").splitlines(keepends=True)
    out.write_text(lines[0] + "a line of mine, complete\n", encoding="utf-8")
    before = sha(out)
    line = predict(capsys, models[0], "--input", work / "data" / "in.jsonl", "--output", out,
                   "--resume", code=2)
    assert sha(out) == before and f"{out}:2: not a prediction record" in line


# -- FIFOs never block --------------------------------------------------------------------------
def test_a_fifo_output_is_refused_promptly(models, work, capsys):
    """Refused from its status, never opened (opening a FIFO blocks until a reader comes):
    --overwrite in a subprocess (today it blocks after loading the model), --resume in-process
    under an alarm (today it blocks reading the file)."""
    import signal
    fifo = work / "out.jsonl"
    os.mkfifo(fifo)
    argv = [str(models[0]), "--input", str(work / "data" / "in.jsonl"), "--output", str(fifo)]
    proc = subprocess.run([sys.executable, "-m", "ernie_doc.cli", "predict", *argv,
                           "--overwrite", "--no-progress"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    err = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.returncode == 2 and err == [f"error: --output {fifo}: is a FIFO, not a regular "
                                            f"file"], proc.stderr

    def blocked(*_):
        raise TimeoutError("predict --resume blocked on a FIFO")
    previous = signal.signal(signal.SIGALRM, blocked)
    signal.alarm(20)
    try:
        line = predict(capsys, *argv, "--resume", code=2)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert line == f"error: --output {fifo}: is a FIFO, not a regular file"


# -- the other commands -------------------------------------------------------------------------
def test_benchmark_predict_never_writes_its_report_over_the_input(models, work, capsys):
    from benchmarks import predict as benchmark_predict
    data = work / "data" / "in.jsonl"
    before = sha(data)
    exits(2, lambda: benchmark_predict.main([str(models[0]), "--input", str(data), "--output",
                                             str(data), "--engines", "dygraph", "--limit", "2",
                                             "--warmup", "0"]))
    one_error_line(capsys, f"--output {data}: is the input")
    assert sha(data) == before


def test_benchmark_predict_fifo_input_is_one_line(models, work, capsys):
    from benchmarks import predict as benchmark_predict
    fifo = work / "fifo.jsonl"
    os.mkfifo(fifo)   # read without blocking today too, but reported as a traceback
    exits(2, lambda: benchmark_predict.main([str(models[0]), "--input", str(fifo),
                                             "--engines", "dygraph"]))
    assert one_error_line(capsys) == f"error: {fifo}: --input is a FIFO, not a regular file"


def test_benchmark_predict_pickled_model_is_one_line(models, work, capsys):
    """A pickle that would run code in place of the weights: refused, in one line."""
    from benchmarks import predict as benchmark_predict
    model = work / "pickled"
    shutil.copytree(models[0], model)
    os.remove(model / "model.safetensors")
    canary = work / "canary"


    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {canary}",)
    (model / "model_state.pdparams").write_bytes(pickle.dumps({"w": Payload()}, protocol=2))
    exits(2, lambda: benchmark_predict.main([str(model), "--input", str(work / "data" /
                                                                        "in.jsonl"),
                                             "--engines", "dygraph", "--warmup", "0"]))
    one_error_line(capsys, "model_state.pdparams")
    assert not canary.exists()


def test_convert_keeps_the_users_config_without_overwrite(models, tmp_path, capsys):
    from ernie_doc.cli import convert
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text('{"mine": true}\n', encoding="utf-8")
    before = sha(out / "config.json")
    assert convert.main([str(models[0]), str(out), "--to", "paddlenlp", "--quiet"]) == 2
    one_error_line(capsys, f"DST {out / 'config.json'}: exists; --overwrite replaces it")
    assert sha(out / "config.json") == before and sorted(os.listdir(out)) == ["config.json"]
    # into the source folder itself, by another name: refused, whatever the flags
    os.symlink(models[0], tmp_path / "same")
    assert convert.main([str(models[0]), str(tmp_path / "same"), "--to", "paddlenlp",
                         "--overwrite", "--quiet"]) == 2
    one_error_line(capsys, f"inside the input folder {models[0]}")
    # asked: replaced (renamed onto: a hard link elsewhere keeps the user's bytes)
    os.link(out / "config.json", tmp_path / "kept.json")
    assert convert.main([str(models[0]), str(out), "--to", "paddlenlp", "--overwrite",
                         "--quiet"]) == 0
    assert sha(tmp_path / "kept.json") == before != sha(out / "config.json")


def test_export_into_the_checkpoint_folder_is_one_line(models, tmp_path, capsys):
    from ernie_doc.cli import export
    model = tmp_path / "best"
    shutil.copytree(models[0], model)
    before = {name: sha(model / name) for name in os.listdir(model)}
    exits(2, lambda: export.main(["--config", str(model), "--head", "sequence_classification",
                                  "--output", str(model / "model")]))
    one_error_line(capsys, f"--output {model / 'model'}", f"inside the input folder {model}")
    assert {name: sha(model / name) for name in os.listdir(model)} == before


def test_benchmark_reports_keep_an_existing_file_without_overwrite(tmp_path, capsys):
    from benchmarks import model as benchmark_model
    report = tmp_path / "bench.json"
    report.write_text("my earlier numbers\n", encoding="utf-8")
    exits(2, lambda: benchmark_model.parse_args(["--quick", "--output", str(report)]))
    one_error_line(capsys, f"--output {report}: exists; --overwrite replaces it")
    assert benchmark_model.parse_args(["--quick", "--output", str(report),
                                       "--overwrite"]).overwrite


@pytest.mark.parametrize("make", ["device", "link to a device"])
def test_a_device_is_never_an_output(tmp_path, make):
    from ernie_doc.errors import OutputError
    from ernie_doc.outputs import check_output
    path = "/dev/null"
    if make == "link to a device":
        path = str(tmp_path / "out.jsonl")
        os.symlink("/dev/null", path)
    with pytest.raises(OutputError, match=f"^--output {path}: is a character device, not a "
                                          f"regular file$"):
        check_output(path, exists_ok=True)


# -- what an input folder links to is an input too ---------------------------------------------
def linked_copy(source, folder, name, target):
    """A copy of the model folder `source` at `folder` whose file `name` is moved to `target`
    (its folder made) and left behind as a link to it."""
    shutil.copytree(source, folder)
    target.parent.mkdir()
    os.rename(folder / name, target)
    os.symlink(target, folder / name)


def test_the_file_a_model_folder_links_to_is_never_an_output(models, work, capsys):
    """The model's weights are a link to store/weights.safetensors: that plain file, given as
    --output, is the model (before, --overwrite replaced it with 87 bytes of predictions)."""
    model, store = work / "mlink", work / "store"
    linked_copy(models[0], model, "model.safetensors", store / "weights.safetensors")
    before = sha(store / "weights.safetensors")
    line = predict(capsys, model, "--input", work / "data" / "in.jsonl", "--output",
                   store / "weights.safetensors", "--overwrite", code=2)
    assert f"is {model / 'model.safetensors'} of the input folder {model}" in line
    assert sha(store / "weights.safetensors") == before
    assert sorted(os.listdir(store)) == ["weights.safetensors"]
    # the same for a folder of documents whose .txt is a link
    docs = work / "docs"
    docs.mkdir()
    (work / "real.txt").write_text("a good movie", encoding="utf-8")
    os.symlink(work / "real.txt", docs / "a.txt")
    line = predict(capsys, models[0], "--input", docs, "--output", work / "real.txt",
                   "--overwrite", code=2)
    assert f"is {docs / 'a.txt'} of the input folder {docs}" in line
    assert (work / "real.txt").read_text(encoding="utf-8") == "a good movie"


def test_export_and_convert_never_write_what_their_source_links_to(models, tmp_path, capsys):
    """export: mx/vocab.txt links to vs/vocab.txt, exported into vs/ with --overwrite (before:
    vs/vocab.txt deleted, then a FileNotFoundError traceback); convert: cs's weights link to
    cd/model.safetensors, converted into cd/ with --overwrite."""
    from ernie_doc.cli import convert, export
    mx, vs = tmp_path / "mx", tmp_path / "vs"
    linked_copy(models[0], mx, "vocab.txt", vs / "vocab.txt")
    before = sha(vs / "vocab.txt")
    exits(2, lambda: export.main(["--config", str(mx), "--head", "sequence_classification",
                                  "--output", str(vs / "model"), "--overwrite"]))
    one_error_line(capsys, f"--output {vs / 'vocab.txt'}: is {mx / 'vocab.txt'} of the input "
                           f"folder {mx}")
    assert sha(vs / "vocab.txt") == before and sorted(os.listdir(vs)) == ["vocab.txt"]
    cs, cd = tmp_path / "cs", tmp_path / "cd"
    linked_copy(models[0], cs, "model.safetensors", cd / "model.safetensors")
    before = sha(cd / "model.safetensors")
    assert convert.main([str(cs), str(cd), "--to", "ours", "--overwrite", "--quiet"]) == 2
    one_error_line(capsys, f"is {cs / 'model.safetensors'} of the input folder {cs}")
    assert sha(cd / "model.safetensors") == before


# -- a folder of the path swapped for a link after the check redirects nothing ------------------
@pytest.mark.parametrize("when", ["after the check", "while the model loads"])
def test_a_folder_swapped_for_a_link_to_the_model_redirects_nothing(models, work, capsys,
                                                                    monkeypatch, when):
    """A co-user flips shared/out into a link to the model folder: right after the paths were
    checked (refused: the folder is checked again by its descriptor), or once the folder is
    opened (the run writes into the folder it opened). Before, both wrote preds.jsonl and
    its sidecar into the model folder."""
    import ernie_doc.predict.pipeline
    model, shared = work / "model", work / "shared"
    shutil.copytree(models[0], model)
    (shared / "out").mkdir(parents=True)
    before = {name: sha(model / name) for name in os.listdir(model)}

    def swap():
        os.rename(shared / "out", shared / "real")
        os.symlink(model, shared / "out")
    if when == "after the check":
        check = predict_cli.check_paths
        monkeypatch.setattr(predict_cli, "check_paths", lambda args: (check(args), swap())[0])
    else:
        load = ernie_doc.predict.pipeline.pipeline
        monkeypatch.setattr(ernie_doc.predict.pipeline, "pipeline",
                            lambda *a, **k: (swap(), load(*a, **k))[1])
    argv = ["--input", work / "data" / "in.jsonl", "--output", shared / "out" / "preds.jsonl"]
    if when == "after the check":
        line = predict(capsys, model, *argv, code=2)
        assert "its folder is now inside the input folder" in line
        assert os.listdir(shared / "real") == []
    else:
        assert predict(capsys, model, *argv)["documents"] == 2
        assert sorted(os.listdir(shared / "real")) == ["preds.jsonl", "preds.jsonl.meta.json"]
    assert {name: sha(model / name) for name in os.listdir(model)} == before


# -- one writer at a time, on the file that was checked -----------------------------------------
def test_a_locked_or_swapped_output_is_never_written(models, work, capsys, monkeypatch):
    """Another predict holds the output (its lock): --resume and --overwrite stop with one
    line, the file unchanged (before: two --resume runs both appended, 595 lines for 300
    documents). A file put in the output's place after the check is not the one appended
    to."""
    import fcntl
    out = work / "out.jsonl"
    data = work / "data" / "in.jsonl"
    predict(capsys, models[0], "--input", data, "--output", out)
    lines = out.read_text(encoding="utf-8").splitlines(keepends=True)
    out.write_text(lines[0], encoding="utf-8")
    before = sha(out)
    with open(out, "rb") as other:
        fcntl.flock(other, fcntl.LOCK_EX)
        for flag in ("--resume", "--overwrite"):
            line = predict(capsys, models[0], "--input", data, "--output", out, flag, code=2)
            assert line == f"error: --output {out}: another ernie-doc predict is writing it; " \
                           f"wait for it to finish or choose another path"
            assert sha(out) == before
    check = predict_cli.check_paths

    def check_then_swap(args):
        checked = check(args)
        os.rename(out, work / "checked.jsonl")
        shutil.copy(work / "checked.jsonl", out)
        return checked
    monkeypatch.setattr(predict_cli, "check_paths", check_then_swap)
    line = predict(capsys, models[0], "--input", data, "--output", out, "--resume", code=2)
    assert "changed since it was checked" in line and sha(out) == before


# -- names that do not fit ----------------------------------------------------------------------
def test_a_name_too_long_is_refused_before_anything_changes(models, work, capsys):
    """A 250-byte --output is legal, its sidecar's name (260 bytes) is not: refused before
    the model loads, the existing output kept (before: deleted, then an OSError traceback).
    export with a 245-byte prefix: refused with nothing copied (before: task.json, vocab.txt
    and tokenizer_config.json were left in the folder)."""
    from ernie_doc.cli import export
    out = work / ("x" * 250)
    out.write_text("my notes\n", encoding="utf-8")
    line = predict(capsys, models[0], "--input", work / "data" / "in.jsonl", "--output", out,
                   "--overwrite", code=2)
    assert line.startswith(f"error: --output's record {out}.meta.json: the name xxx") and \
        "is 260 bytes, longer than the 255" in line
    assert out.read_text(encoding="utf-8") == "my notes\n"
    folder = work / "export"
    folder.mkdir()
    exits(2, lambda: export.main(["--config", str(models[0]), "--head",
                                  "sequence_classification", "--output",
                                  str(folder / ("z" * 245))]))
    one_error_line(capsys, "is 260 bytes, longer than the 255")
    assert os.listdir(folder) == []


# -- the system's folders -----------------------------------------------------------------------
@pytest.mark.parametrize("path, place", [
    ("/dev/stdout", "/dev"), ("/dev/ernie-doc-preds.jsonl", "/dev"),
    ("/dev/fd/1", "/proc"), ("/sys/ernie-doc-preds.jsonl", "/sys")])
def test_an_output_in_dev_proc_or_sys_is_refused(path, place):
    """/dev/stdout is a link the system owns (to /proc/self/fd/1): with stdout redirected to
    a file, --overwrite used to unlink it and leave a file and its sidecar in /dev."""
    from ernie_doc.errors import OutputError
    from ernie_doc.outputs import check_output
    with pytest.raises(OutputError, match=f"^--output {path}: is in {place} "):
        check_output(path, exists_ok=True)


# -- --resume reads what it must, never a whole file --------------------------------------------
RESUME = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from ernie_doc.errors import PipelineError
from ernie_doc.predict.records import completed_ids, provenance
try:
    completed_ids(sys.argv[1], provenance(sys.argv[2]))
except PipelineError as e:
    print(e)
"""


@pytest.mark.parametrize("huge", ["sidecar", "a line"])
def test_resume_reads_a_huge_sidecar_or_line_in_bounded_memory(models, work, capsys, huge):
    """A 3 GB (sparse) sidecar, or a 3 GB last line, under a 1 GiB address-space limit: one
    line (before: read whole, a MemoryError traceback)."""
    out = work / "out.jsonl"
    predict(capsys, models[0], "--input", work / "data" / "in.jsonl", "--output", out)
    with open(str(out) + ".meta.json" if huge == "sidecar" else out, "r+b") as f:
        f.truncate(3 << 30)
    proc = subprocess.run([sys.executable, "-c", RESUME, str(out), str(models[0])], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-2000:]
    expected = f"--output {out}: out.jsonl.meta.json is over 65,536 bytes" if huge == \
        "sidecar" else f"{out}:3: a line over 64 MiB, not a prediction record"
    assert proc.stdout.startswith(expected), proc.stdout


def test_a_link_to_an_ancestor_inside_an_input_folder_is_not_an_input(models, work, capsys):
    """docs/up -> .. inside the documents folder: predict never reads subfolders, so their
    tree is not an input (before, every output under the parent was refused)."""
    docs = work / "docs-up"
    docs.mkdir()
    (docs / "a.txt").write_text("a good movie", encoding="utf-8")
    os.symlink("..", docs / "up")
    (work / "elsewhere").mkdir(exist_ok=True)
    out = work / "elsewhere" / "preds.jsonl"
    predict(capsys, models[0], "--input", docs, "--output", out)
    assert [json.loads(line)["doc_id"] for line in out.read_text().splitlines()
            if "error" not in json.loads(line)] == ["a.txt"]


def test_every_writer_checks_its_paths_through_the_one_rule():
    """Training's OUTPUT_DIR, predict (explain runs it), export, convert, context and the
    benchmarks' --output reach ernie_doc.outputs; the per-command doors are gone."""
    writers = ["ernie_doc/training/outdir.py", "ernie_doc/cli/predict.py",
               "ernie_doc/cli/export.py", "ernie_doc/cli/convert.py", "ernie_doc/cli/context.py",
               "benchmarks/common.py"]
    for path in writers:
        assert "from ernie_doc.outputs import" in (ROOT / path).read_text(encoding="utf-8"), path
    for gone in ("ernie_doc/predict/outputs.py", "ernie_doc/predict/inputs.py"):
        assert not (ROOT / gone).exists(), gone


def test_a_temporary_is_new_and_gets_the_mode_open_gives(tmp_path):
    """create_new makes a new file only (a link planted at the name is refused, never
    followed), with mode 0666 less the umask; temp_name keeps a prefix and suffix."""
    from ernie_doc.outputs import create_new, temp_name
    name = temp_name(".ernie-doc-run.json.", ".tmp")
    assert name.startswith(".ernie-doc-run.json.") and name.endswith(".tmp") and \
        name != temp_name(".ernie-doc-run.json.", ".tmp")
    umask = os.umask(0o022)
    try:
        os.close(create_new(str(tmp_path / name)))
    finally:
        os.umask(umask)
    assert os.stat(tmp_path / name).st_mode & 0o777 == 0o644
    os.symlink(tmp_path / "target", tmp_path / "planted")
    with pytest.raises(FileExistsError):
        create_new(str(tmp_path / "planted"))
    assert not (tmp_path / "target").exists()
