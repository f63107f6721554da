"""What a user of a Hugging Face / PaddleNLP pipeline types at `ernie-doc predict`, on one tiny
saved IMDB classifier (tests/helpers.tiny_classifier, the official TSV layout `qid label score
text_a`):

- `--format task` reads the task's own files through its reader, and predicts exactly what
  the run's evaluation did; `--format tsv` reads the official column names;
- `--output -` is standard output (only records there), `--input -` standard input;
- a save_pretrained folder (no task.json) predicts when the task is named;
- `predict --help` answers without importing paddle; a missing paddle is one line;
- the checkpoint loader's "loaded N tensors" line is printed once per load.
"""
import json
import os
import subprocess
import sys

import pytest
from helpers import ROOT, tiny_classifier

from ernie_doc.errors import PipelineError
from ernie_doc.predict.pipeline import Pipeline, pipeline


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """(the run's OUTPUT_DIR, its data directory: train.txt and test.txt)."""
    root = tmp_path_factory.mktemp("habits")
    out = tiny_classifier(root)
    return out, root / "imdb"


def environment(**extra):
    """The environment of a subprocess: this checkout's package first (it may run from
    another directory)."""
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                **extra)


def cli(*args, cwd, stdin=None, code=0):
    """`python -m ernie_doc.cli ARGS` → the finished process (exit status checked)."""
    proc = subprocess.run([sys.executable, "-m", "ernie_doc.cli", *map(str, args)], cwd=cwd,
                          input=stdin, capture_output=True, text=True, timeout=120,
                          env=environment())
    assert proc.returncode == code, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


def records(text):
    """JSON lines → records in input order (predict writes them as documents finish)."""
    return sorted((json.loads(line) for line in text.splitlines() if line.strip()),
                  key=lambda r: r["index"])


def evaluated(out):
    """The run's evaluation records of its eval split (test)."""
    with open(out / "predictions_test.jsonl", encoding="utf-8") as f:
        return {r["doc_id"]: r for r in map(json.loads, f)}


def assert_equal_to_evaluation(out, predicted):
    """Every field predict wrote equals the evaluation's record of the same document, and
    every evaluated document was predicted."""
    gold = evaluated(out)
    assert sorted(r["doc_id"] for r in predicted) == sorted(gold)
    for r in predicted:
        assert {k: v for k, v in r.items() if k != "index"} == \
            {k: gold[r["doc_id"]][k] for k in r if k != "index"}


def test_format_task_predicts_the_evaluated_file_as_evaluation_did(run_dir, tmp_path):
    from ernie_doc.cli import predict
    out, data = run_dir
    # the file the model was evaluated on, through the imdb reader: ids are its qid column
    preds = tmp_path / "file.jsonl"
    assert predict.main([str(out), "--format", "task", "--input", str(data / "test.txt"),
                         "--output", str(preds), "--no-progress"]) == 0
    got = records(preds.read_text(encoding="utf-8"))
    assert [r["doc_id"] for r in got] == [str(i) for i in range(1, 9)]
    assert_equal_to_evaluation(out, got)
    # no --input: the run's own data_dir, the split it evaluated (eval_splits: test)
    preds = tmp_path / "split.jsonl"
    assert predict.main([str(out), "--format", "task", "--output", str(preds),
                         "--no-progress"]) == 0
    assert_equal_to_evaluation(out, records(preds.read_text(encoding="utf-8")))


def test_format_tsv_reads_the_official_column_names(run_dir, tmp_path):
    from ernie_doc.cli import predict
    out, data = run_dir
    preds = tmp_path / "tsv.jsonl"
    assert predict.main([str(out), "--format", "tsv", "--input", str(data / "test.txt"),
                         "--output", str(preds), "--no-progress"]) == 0
    got = records(preds.read_text(encoding="utf-8"))
    assert [r["doc_id"] for r in got] == [str(i) for i in range(1, 9)]   # qid → id
    assert all("error" not in r and r["pred"] in ("0", "1") for r in got)  # text_a → text


def test_output_dash_is_standard_output_and_input_dash_standard_input(run_dir, tmp_path):
    out, data = run_dir
    lines = "".join(json.dumps({"id": f"d{i}", "text": "the end"}) + "\n" for i in range(3))
    proc = cli("predict", out, "--input", "-", "--output", "-", "--no-progress",
               cwd=tmp_path, stdin=lines)
    got = records(proc.stdout)   # records, and nothing else
    assert [r["doc_id"] for r in got] == ["d0", "d1", "d2"]
    assert all(set(r) == {"doc_id", "pred", "probs", "segments", "index"} for r in got)
    assert os.listdir(tmp_path) == []   # no file named "-", no sidecar
    err = proc.stderr.splitlines()
    assert json.loads(err[-1])["documents"] == 3   # the summary went to stderr
    assert sum("loaded " in line for line in err) == 1
    # standard output has no file to resume or replace
    proc = cli("predict", out, "--input", data / "test.txt", "--output", "-", "--resume",
               cwd=tmp_path, code=2)
    assert "--resume and --overwrite need a file --output" in proc.stderr
    assert os.listdir(tmp_path) == []


def test_save_pretrained_folder_predicts_with_its_task(run_dir, tmp_path, capsys):
    from ernie_doc import ErnieDocForSequenceClassification, load_tokenizer
    out, data = run_dir
    saved = tmp_path / "saved"
    ErnieDocForSequenceClassification.from_pretrained(str(out / "best")).save_pretrained(
        str(saved))
    load_tokenizer(str(out / "best")).save_pretrained(str(saved))
    assert not (saved / "task.json").exists()
    texts = ["the end", "a film <br /><br /> the end"]
    want = Pipeline.from_pretrained(str(out))(texts)
    assert Pipeline.from_pretrained(str(saved), task="imdb")(texts) == want
    assert pipeline(str(saved), task="imdb")(texts) == want
    with pytest.raises(PipelineError, match="pass --task NAME.*imdb"):
        Pipeline.from_pretrained(str(saved))
    with pytest.raises(PipelineError, match="fine-tuned for task 'imdb', not 'c3'"):
        Pipeline.from_pretrained(str(out), task="c3")
    # the command line: without --task, one line naming the option and the tasks
    from ernie_doc.cli import predict
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(SystemExit) as info:
        predict.main([str(saved), "--input", str(data / "test.txt"), "--output",
                      str(tmp_path / "p.jsonl")])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--task" in err[0] and "imdb" in err[0], err
    assert sorted(os.listdir(tmp_path)) == before


def test_a_bare_string_is_one_document(run_dir):
    out, _ = run_dir
    got = pipeline(str(out))("Great movie, loved it.")
    assert len(got) == 1 and got[0]["doc_id"] == "0" and "error" not in got[0]


def test_hugging_faces_pipeline_call_names_the_task_beside_the_model(run_dir):
    """pipeline("text-classification", model=RUN) is pipeline(RUN) with the task checked
    against the model's kind (it was a TypeError: "got multiple values for argument 'model'");
    so is pipeline(model=RUN)."""
    out, _ = run_dir
    text = "Great movie, loved it."
    expected = pipeline(str(out))(text)
    for pipe in (pipeline("text-classification", model=str(out)),
                 pipeline("sentiment-analysis", model=str(out)), pipeline(model=str(out))):
        assert pipe(text) == expected
    with pytest.raises(PipelineError) as e:
        pipeline("question-answering", model=str(out))
    assert str(e.value) == (f"{out / 'best'}: a classification model (task imdb), not one for "
                            f"'question-answering' (span or hotpotqa); pipeline({str(out)!r}) "
                            "reads it as what it is")
    with pytest.raises(PipelineError, match=r"pipeline\('text-classification'\): give the model "
                                            r"too: pipeline\('text-classification', model=RUN\)"):
        pipeline("text-classification")
    with pytest.raises(PipelineError, match="a Hugging Face task name, one of text-classification"):
        pipeline("imdb", model=str(out))
    with pytest.raises(PipelineError, match="give the model"):
        pipeline()
    assert pipeline(task="text-classification", model=str(out))(text) == expected
    for odd in (["text-classification"], b"run", {"a": 1}):
        with pytest.raises(PipelineError, match="expected a model folder .a path. or a task "
                                                "name, got " + type(odd).__name__):
            pipeline(odd, model=str(out))
    for odd in (None, 5):
        with pytest.raises(PipelineError, match="documents: expected text or an iterable of "
                                                "documents, got " + type(odd).__name__):
            pipeline(str(out))(odd)


@pytest.mark.parametrize("option, says", [
    ("batch_size", "batch_size is the pipeline's, set when it is made: pipeline(RUN, "
                   "batch_size=N)"),
    ("truncation", "truncation: a pipeline reads the whole document, segment by segment"),
    ("top_k", "unexpected option 'top_k': a call takes the documents only; the options are "
              "pipeline()'s: batch_size")])
def test_a_hugging_face_call_option_says_where_it_belongs(run_dir, option, says):
    """pipe(texts, batch_size=2) was "DocumentStream.__call__() got an unexpected keyword
    argument"."""
    out, _ = run_dir
    with pytest.raises(TypeError) as e:
        pipeline(str(out))(["Great movie."], **{option: 2})
    assert says in str(e.value)


def _python(code, tmp_path, env=None):
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=environment(**(env or {})))


def test_a_training_checkpoint_is_not_taken_for_a_model(tmp_path):
    """A run's checkpoints/latest (weights, optimizer, trainer_state.json): one line pointing
    to the run's folder, not "fine-tune it first"."""
    step = tmp_path / "out" / "checkpoints" / "step-3"
    step.mkdir(parents=True)
    (step / "trainer_state.json").write_text('{"step": 3, "total_steps": 3}')
    (step / "model.safetensors").write_bytes(b"")
    (tmp_path / "out" / "checkpoints" / "latest").symlink_to("step-3")
    latest = tmp_path / "out" / "checkpoints" / "latest"
    with pytest.raises(PipelineError) as e:
        pipeline(str(latest))
    assert str(e.value) == (f"{latest}: a training checkpoint (what `--resume` continues), not "
                            f"a saved model; give the run's folder {tmp_path / 'out'}, or its "
                            "best/ or final/")


def test_predict_help_does_not_import_paddle(tmp_path):
    code = ("import sys\nfrom ernie_doc.cli import main\ntry:\n    main(['predict', '--help'])\n"
            "except SystemExit:\n    pass\nprint('paddle' in sys.modules, file=sys.stderr)")
    # a PATH without ccache: paddle's import would warn about it
    proc = _python(code, tmp_path, env={"PATH": os.path.dirname(sys.executable)})
    assert "--format" in proc.stdout and "--split" in proc.stdout
    assert proc.stderr.strip() == "False", proc.stderr


@pytest.mark.parametrize("argv", [["run-document"], ["predict", "m", "--input", "x",
                                                      "--output", "y"],
                                  ["export", "--config", "m", "--output", "y"]])
def test_missing_paddle_is_one_line(tmp_path, argv):
    code = ("import sys\nsys.modules['paddle'] = None   # as if paddle were not installed\n"
            f"from ernie_doc.cli import main\nsys.exit(main({argv!r}))")
    proc = _python(code, tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: paddle is not installed: pip install paddlepaddle==3.3.1 (CPU) or "
        "paddlepaddle-gpu==2.6.2 (GPU)"]
    assert os.listdir(tmp_path) == []


def test_loaded_tensors_is_logged_once(run_dir, tmp_path, capsys):
    """Each command as the command line runs it (in-process: notes and the run's log both
    print to stdout), one checkpoint load, one line."""
    from ernie_doc.cli import main
    out, data = run_dir
    best = out / "best"
    commands = {
        "finetune": ["finetune", "imdb", "--set", f"data_dir={data}",
                     f"output_dir={tmp_path / 'eval'}", f"init_checkpoint={best}",
                     "eval_only=true", "max_seq_len=16", "eval_splits=[test]",
                     "progress=false"],
        "run-document": ["run-document", "--model", str(best), "--tokens", "8"],
        "export": ["export", "--config", str(best), "--head", "sequence_classification",
                   "--output", str(tmp_path / "export" / "m")],
        "predict": ["predict", str(out), "--input", str(data / "test.txt"), "--format",
                    "tsv", "--output", str(tmp_path / "p.jsonl"), "--no-progress"],
    }
    capsys.readouterr()
    for name, argv in commands.items():
        assert main(argv) == 0, name
        text = capsys.readouterr()
        lines = (text.out + text.err).splitlines()
        assert sum("loaded " in line and " tensors from " in line for line in lines) == 1, \
            (name, lines[:5])


PADDLE_MISSING = ("error: paddle is not installed: pip install paddlepaddle==3.3.1 (CPU) or "
                  "paddlepaddle-gpu==2.6.2 (GPU)")


def test_without_paddle_help_and_listings_answer(tmp_path):
    """--help of export / convert and finetune --list-tasks need no paddle; --nproc 2
    without paddle is the one paddle-missing line (not the launcher's failure)."""
    code = ("import sys\nsys.modules['paddle'] = None   # as if paddle were not installed\n"
            "from ernie_doc.cli import main\n"
            "for argv in (['export', '--help'], ['convert', '--help'],\n"
            "             ['finetune', '--list-tasks']):\n"
            "    try:\n        status = main(argv)\n    except SystemExit as e:\n"
            "        status = e.code\n"
            "    print('STATUS', argv[0], status)\n"
            "sys.exit(main(['finetune', 'imdb', '--nproc', '2']))")
    proc = _python(code, tmp_path)
    assert proc.returncode == 2, proc.stderr
    for name in ("export", "convert", "finetune"):
        assert f"STATUS {name} 0" in proc.stdout, proc.stdout
    assert "--head" in proc.stdout and "\nimdb " in proc.stdout
    assert proc.stderr.strip().splitlines() == [PADDLE_MISSING]
    assert os.listdir(tmp_path) == []


def _predict_main(argv):
    """predict.main(argv) in-process → its status (SystemExit's code); a KeyboardInterrupt
    escaping it (a traceback for the user) fails the test instead of stopping pytest."""
    import logging

    from ernie_doc.cli import predict

    # the module fixture's run left its log handlers on a stream an earlier test captured
    log = logging.getLogger("ernie_doc.train")
    saved, log.handlers = log.handlers, []
    try:
        return predict.main(argv)
    except SystemExit as e:
        return e.code
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped predict: the user sees a traceback")
    finally:
        log.handlers = saved


def test_ctrl_c_in_predict_is_one_line_and_the_command_it_names_resumes(run_dir, tmp_path,
                                                                         capsys, monkeypatch):
    import shlex

    from ernie_doc.predict import pipeline as pipeline_module
    out, data = run_dir
    full, cut = tmp_path / "full.jsonl", tmp_path / "cut.jsonl"
    base = [str(out), "--input", str(data / "test.txt"), "--format", "tsv", "--no-progress"]
    assert _predict_main(base + ["--output", str(full)]) == 0
    real = pipeline_module.Pipeline.stream

    def ctrl_c_after_3(self, documents, skip=()):
        for i, record in enumerate(real(self, documents, skip)):
            if i == 3:
                raise KeyboardInterrupt
            yield record

    monkeypatch.setattr(pipeline_module.Pipeline, "stream", ctrl_c_after_3)
    capsys.readouterr()
    argv = base + ["--output", str(cut), "--overwrite"]
    assert _predict_main(argv) == 130
    err = capsys.readouterr().err.strip().splitlines()
    again = base + ["--output", str(cut), "--resume"]
    assert err == [f"interrupted after 3 documents: resume with ernie-doc predict "
                   f"{shlex.join(again)}"], err
    assert len(records(cut.read_text())) == 3
    monkeypatch.undo()
    assert _predict_main(again) == 0
    assert records(cut.read_text()) == records(full.read_text())
    from ernie_doc.cli.predict import interrupted_line  # standard output: no file to resume
    assert interrupted_line(base + ["--output", "-"], "-", {"records": 2}) == \
        "interrupted after 2 documents"


def test_output_dash_never_writes_into_an_input_nor_a_closed_stdout(run_dir, tmp_path,
                                                                   capsys, monkeypatch):
    """`--output - >> in.jsonl` (standard output is the input), and `>&-`: one line, exit
    2, the input unchanged."""
    import hashlib
    out, _ = run_dir
    doc = tmp_path / "in.jsonl"
    doc.write_text('{"text": "a film"}\n')
    before = hashlib.sha256(doc.read_bytes()).hexdigest()
    argv = [str(out), "--input", str(doc), "--output", "-"]
    capsys.readouterr()
    with open(doc, "a") as alias:
        monkeypatch.setattr(sys, "stdout", alias)
        assert _predict_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --output -: standard output is the input {doc} (the same file); "
                   "write it elsewhere"], err
    assert hashlib.sha256(doc.read_bytes()).hexdigest() == before
    monkeypatch.setattr(sys, "stdout", None)   # what Python sets for a closed descriptor 1
    assert _predict_main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: --output -: standard output is closed; give --output a file name"]


def test_a_head_of_another_task_is_refused_not_initialised(run_dir, tmp_path, capsys):
    """A save_pretrained folder of a classifier, predicted with --task cmrc2018 (a span
    head): its head would be newly initialised (random predictions); refused with one line
    naming the folder and the task."""
    from ernie_doc import ErnieDocForSequenceClassification, load_tokenizer
    out, _ = run_dir
    saved = tmp_path / "saved"
    ErnieDocForSequenceClassification.from_pretrained(str(out / "best")).save_pretrained(
        str(saved))
    load_tokenizer(str(out / "best")).save_pretrained(str(saved))
    want = (f"{saved}: holds the ErnieDocForSequenceClassification head, not the one task "
            "'cmrc2018' predicts with; give --task the task it was fine-tuned for")
    with pytest.raises(PipelineError) as info:
        Pipeline.from_pretrained(str(saved), task="cmrc2018")
    assert str(info.value) == want
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"context": "the end", "question": "what"}\n')
    before = sorted(os.listdir(tmp_path))
    capsys.readouterr()
    assert _predict_main([str(saved), "--task", "cmrc2018", "--input", str(questions),
                          "--output", str(tmp_path / "p.jsonl")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {want}"]
    assert sorted(os.listdir(tmp_path)) == before


def test_a_txt_file_with_a_tsv_header_points_to_format_tsv(run_dir, tmp_path, capsys):
    """The official IMDB layout in a .txt file (`qid label score text_a`) is not one
    document: one line naming --format tsv / task, nothing written."""
    out, data = run_dir
    capsys.readouterr()
    assert _predict_main([str(out), "--input", str(data / "test.txt"), "--output",
                          str(tmp_path / "p.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(data / "test.txt") in err[0] and "--format tsv" in err[0] \
        and "--format task" in err[0], err
    assert os.listdir(tmp_path) == []
