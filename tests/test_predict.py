"""ernie-doc predict and ernie_doc.predict.pipeline: a fine-tuned run's model on new documents.

The models are tiny runs of the tasks (what their run.sh runs, in-process) on fixtures in the
official formats; the predictions must equal, field for field, what the trainer's evaluation
(eval_only's code) wrote for the same documents."""
import io
import itertools
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import paddle
import pytest
from helpers import ROOT, exits, in_process, one_error_line, tiny_classifier, tiny_export
from test_span_tasks import HANZI as ZH
from test_span_tasks import c3_data, cail_data, cmrc_run
from test_tasks import HANZI as THUC
from test_tasks import WORDS, finetune_task, iflytek_json, imdb_tsv, text, vocab_dir

from ernie_doc.cli import predict
from ernie_doc.data.document import parse_json_line, read_json_file, read_tsv
from ernie_doc.data.schedule import schedule_rows
from ernie_doc.errors import DataError, PipelineError
from ernie_doc.kinds.base import load_reader
from ernie_doc.predict.documents import to_document
from ernie_doc.predict.model_folder import model_directory
from ernie_doc.predict.pipeline import Pipeline, pipeline, read_inputs
from ernie_doc.predict.records import completed_ids, provenance
from ernie_doc.utils import denormals_flushed, flush_denormals


def predict_cli(*args, expect=0):
    """tools/predict.py, in this process."""
    from tools.predict import command
    return in_process(command, [str(a) for a in args] + ["--no-progress"], expect)


def yaml_values(path):
    import yaml
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def assert_same_predictions(evaluated, predicted):
    """Every field predict writes equals the evaluation's record of the same document."""
    by_id = {p["doc_id"]: p for p in evaluated}
    assert sorted(by_id) == sorted(p["doc_id"] for p in predicted)
    for p in predicted:
        fields = {k: v for k, v in p.items() if k != "index"}
        assert fields == {k: by_id[p["doc_id"]][k] for k in fields}, (p, by_id[p["doc_id"]])


@pytest.fixture(scope="module")
def imdb_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("imdb")
    data = imdb_tsv(tmp)
    out = tmp / "out"
    finetune_task("imdb", data, out, vocab_dir(tmp / "vocab", WORDS), "test_splits=[test]",
                  "eval_batch_size=2")
    return data, out


def test_classification_predict_equals_evaluation(imdb_run, tmp_path):
    data, out = imdb_run
    assert (out / "best" / "task.json").is_file()
    docs = load_reader("imdb").read(str(data), "test", {})
    evaluated = read_jsonl(out / "predictions_test.jsonl")
    # Python, from the run directory (best/ inside it)
    records = Pipeline.from_pretrained(str(out))(docs)
    assert [r["index"] for r in records] == list(range(len(docs)))
    assert_same_predictions(evaluated, records)
    for r in records:
        assert set(r) == {"doc_id", "pred", "probs", "segments", "index"}
        assert r["pred"] in ("0", "1") and sum(r["probs"]) == pytest.approx(1.0, abs=1e-5)
    # the command line, on JSON lines, with another batch size (the rows hold other
    # documents side by side: each row's memory is its own, the predictions stay)
    inputs = tmp_path / "test.jsonl"
    inputs.write_text("".join(json.dumps({"id": d.doc_id, "text": d.text}) + "\n"
                              for d in docs), encoding="utf-8")
    preds = tmp_path / "preds.jsonl"
    proc = predict_cli(out / "best", "--input", inputs, "--output", preds)
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["documents"] == len(docs) and summary["errors"] == 0
    assert_same_predictions(evaluated, read_jsonl(preds))
    again = tmp_path / "again.jsonl"
    predict_cli(out / "best", "--input", inputs, "--output", again, "--batch-size", "3")
    for a, b in zip(sorted(read_jsonl(preds), key=lambda r: r["index"]),
                    sorted(read_jsonl(again), key=lambda r: r["index"])):
        assert a["pred"] == b["pred"]
        np.testing.assert_allclose(a["probs"], b["probs"], atol=2e-6)


def test_eval_only_run_writes_the_same_predictions(imdb_run, tmp_path):
    """eval_only (a separate run from best/) and predict agree document for document."""
    data, out = imdb_run
    ev = tmp_path / "eval"
    finetune_task("imdb", data, ev, out / "best", "eval_only=true",
                  f"init_checkpoint={out / 'best'}", "test_splits=[test]", "eval_batch_size=2")
    docs = load_reader("imdb").read(str(data), "test", {})
    assert_same_predictions(read_jsonl(ev / "predictions_test.jsonl"),
                            Pipeline.from_pretrained(str(out))(docs))


def test_pipeline_drops_rows_left_idle(imdb_run, monkeypatch):
    """Once the documents ran out, the rows they leave idle are dropped for good: the model
    reads the live rows alone (their memories gathered), and every record stays as the full
    batch, or a batch of as many rows as documents, gives it."""
    data, out = imdb_run
    docs = load_reader("imdb").read(str(data), "test", {})[:5]
    pipe = Pipeline.from_pretrained(str(out), batch_size=4)
    lengths = [len(pipe._passes(d, 0)) for d in docs]
    live = (schedule_rows(lengths, 4).doc >= 0).sum(axis=1).tolist()   # rows reading per step
    assert lengths == [6, 6, 10, 8, 6] and live == [4] * 6 + [3, 3, 2, 2, 1, 1]
    seen = []
    forward = pipe.task.forward

    def spy(model, batch, carry):
        seen.append(int(batch["input_ids"].shape[0]))
        return forward(model, batch, carry)

    monkeypatch.setattr(pipe.task, "forward", spy)
    records = pipe(docs)
    assert seen == live
    seen.clear()
    pipe.compact = False
    assert pipe(docs) == records and seen == [4] * len(live)
    assert Pipeline.from_pretrained(str(out), batch_size=len(docs))(docs) == records


def test_a_carry_without_batch_axes_keeps_every_row(imdb_run, monkeypatch):
    """A kind whose carry holds a tensor it names no batch axis for (Task.carry_axes; a
    third-party kind's own state) is read with every row kept, as before rows were dropped:
    no KeyError once the documents ran out, the same records."""
    data, out = imdb_run
    docs = load_reader("imdb").read(str(data), "test", {})[:5]
    pipe = Pipeline.from_pretrained(str(out), batch_size=4)
    expected = pipe(docs)
    seen = []
    forward = pipe.task.forward

    def with_own_state(model, batch, carry):
        seen.append(int(batch["input_ids"].shape[0]))
        out, new = forward(model, batch, carry)
        return out, dict(new, positions=paddle.zeros([batch["input_ids"].shape[0], 3]))

    monkeypatch.setattr(pipe.task, "forward", with_own_state)
    assert pipe(docs) == expected
    assert seen == [4] * 12   # nothing dropped


# How this run reads differs from the packaged IMDB config's (T 512, stride = memory_len,
# mean of the segments): T 16, stride 5, the last segment decides, documents cut at 30 tokens.
# Its model has room for 512 positions, so reading as the packaged config says runs quietly;
# large initial weights make its probabilities change with what it reads.
TRAINED_READING = ("max_seq_len=16", "stride=5", "doc_prediction=last", "max_doc_tokens=30",
                   "model_overrides.max_position_embeddings=512",
                   "model_overrides.initializer_range=1.0")


@pytest.fixture(scope="module")
def read_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("read")
    data = imdb_tsv(tmp)
    out = tmp / "out"
    finetune_task("imdb", data, out, vocab_dir(tmp / "vocab", WORDS), *TRAINED_READING)
    return data, out / "best"


def evaluate_folder(data, best, out, *given):
    """The README's evaluation command: the packaged config, the folder, test_splits=[test]
    → the run's log (stdout)."""
    from tools.finetune import command
    return in_process(command, [str(ROOT / "tasks" / "imdb" / "config.yaml"), "--set",
                                f"data_dir={data}", "eval_only=true", f"init_checkpoint={best}",
                                "test_splits=[test]", f"output_dir={out}", "progress=false",
                                *given]).stdout


@pytest.mark.parametrize("given", ["best", "run", "weights"])
def test_eval_only_of_a_fine_tuned_folder_reads_as_it_was_trained(read_run, tmp_path, given):
    """eval_only from the packaged config reads with the folder's task.json settings, so its
    predictions and metrics are predict's; one line says the config's values were replaced.
    The run's OUTPUT_DIR is its best/; the weights file in best/ reads as best/ does."""
    data, best = read_run
    checkpoint = {"best": best, "run": best.parent, "weights": best / "model.safetensors"}
    log = evaluate_folder(data, checkpoint[given], tmp_path / "eval")
    assert "T=16 " in log and "stride=5 " in log, log
    line, = [x for x in log.splitlines() if "reading as" in x]
    assert line.endswith(f"eval_only: reading as {best} was trained (its task.json), not as "
                         f"{ROOT / 'tasks' / 'imdb' / 'config.yaml'} says: max_seq_len 16 "
                         f"(config 512), stride 5 (config null), doc_prediction \"last\" "
                         f"(config \"mean\"), max_doc_tokens 30 (config 0)"), line
    assert_evaluated_as_predicted(data, best, tmp_path / "eval")


def assert_evaluated_as_predicted(data, best, out):
    """eval_only's predictions and accuracy in `out` are those predict gives with `best`."""
    docs = load_reader("imdb").read(str(data), "test", {})
    predicted = Pipeline.from_pretrained(str(best))(docs)
    evaluated = read_jsonl(out / "predictions_test.jsonl")
    by_id = {r["doc_id"]: r for r in evaluated}
    assert sorted(by_id) == sorted(r["doc_id"] for r in predicted)
    for r in predicted:
        assert r["pred"] == by_id[r["doc_id"]]["pred"]
        np.testing.assert_allclose(r["probs"], by_id[r["doc_id"]]["probs"], atol=1e-5)
    results = json.loads((out / "test_results.json").read_text())
    labels = {d.doc_id: d.label for d in docs}
    assert results["accuracy"] == pytest.approx(
        np.mean([r["pred"] == labels[r["doc_id"]] for r in predicted]))


def test_eval_only_with_the_training_commands_tokenizer_train_reads_the_folders(read_run,
                                                                                tmp_path):
    """The README's from-scratch command with eval_only=true added keeps `tokenizer=train`:
    evaluation trains no tokenizer (a new one's ids are not the model's, and IMDB scored
    0.50 instead of 0.85 in silence); it reads with the folder's, as predict does."""
    data, best = read_run
    log = evaluate_folder(data, best, tmp_path / "eval", "tokenizer=train")
    assert "training a SentencePiece tokenizer" not in log, log
    assert f'eval_only: tokenizer "train" reads with the tokenizer {best} was trained with ' \
           "(the folder's own); evaluation trains none" in log, log
    assert_evaluated_as_predicted(data, best, tmp_path / "eval")
    # a folder without task.json (a save_pretrained one): nothing says which tokenizer it
    # learned, and training a new one is refused in one line, before anything is written
    bare = tmp_path / "bare"
    shutil.copytree(best, bare)
    (bare / "task.json").unlink()
    from tools.finetune import command
    proc = in_process(command, [str(ROOT / "tasks" / "imdb" / "config.yaml"), "--set",
                                f"data_dir={data}", "eval_only=true", f"init_checkpoint={bare}",
                                "test_splits=[test]", f"output_dir={tmp_path / 'e2'}",
                                "tokenizer=train"], expect=2)
    assert proc.stderr.strip().endswith(
        f'tokenizer "train" with eval_only would train a new tokenizer, whose ids are not the '
        f'ones {bare} learned; give the tokenizer it was trained with (tokenizer="": the '
        "checkpoint's own, or a directory)"), proc.stderr
    assert not (tmp_path / "e2").exists()


def test_eval_only_of_a_model_of_another_vocabulary_is_one_line(read_run, tmp_path):
    """The IMDB folder (20 token ids) evaluated on longdep's pre-tokenized ids (32): one line
    before anything is written (it was the model's ValueError, a traceback, mid-evaluation)."""
    data, best = read_run
    from tools.finetune import command
    proc = in_process(command, [str(ROOT / "tasks" / "imdb" / "config.yaml"), "--set",
                                "task=longdep", "kind=classification", f"data_dir={data}",
                                "eval_only=true", f"init_checkpoint={best}", "test_splits=[test]",
                                f"output_dir={tmp_path / 'e'}", "progress=false"], expect=2)
    assert proc.stderr.strip().endswith(
        f"task longdep's token ids reach 31 but the model's vocabulary ({best}) has 20: a model "
        "of another vocabulary"), proc.stderr
    assert not (tmp_path / "e").exists()


def test_eval_only_settings_given_win_over_the_folder_with_one_line(read_run, tmp_path):
    data, best = read_run
    log = evaluate_folder(data, best, tmp_path / "eval", "stride=3", "max_seq_len=16")
    assert "T=16 " in log and "stride=3 " in log, log
    line, = [x for x in log.splitlines() if "differ from" in x]
    assert line.endswith(f"eval_only: the values given differ from how {best} was trained "
                         f"(its task.json) and are used: stride 3 (trained with 5)"), line


def test_eval_only_evaluates_only_the_splits_it_names(read_run, tmp_path):
    """test_splits=[test] alone: the test split is read once (IMDB's dev would be test.txt
    again); eval_splits given too: both."""
    data, best = read_run
    evaluate_folder(data, best, tmp_path / "eval")
    assert sorted(p.name for p in (tmp_path / "eval").glob("*_results.json")) == [
        "eval_results.json", "test_results.json"]
    assert json.loads((tmp_path / "eval" / "eval_results.json").read_text())["split"] == "test"
    evaluate_folder(data, best, tmp_path / "both", "eval_splits=[dev]")
    assert sorted(p.name for p in (tmp_path / "both").glob("*_results.json")) == [
        "dev_results.json", "eval_results.json", "test_results.json"]


def thucnews_data(folder, labels, rng):
    """THUCNews' layout: label.txt (the label list, in id order) and labelled lines."""
    folder.mkdir()
    (folder / "label.txt").write_text("\n".join(labels) + "\n", encoding="utf-8")
    for name, n in (("train.txt", 12), ("val.txt", 9), ("test.txt", 6)):
        lines = [f"{labels[i % 3]}\t{text(rng, THUC, int(rng.integers(8, 30)), sep='')}"
                 for i in range(n)]
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def evaluate_thucnews(data, run, out, expect=0):
    """eval_only of `run` on THUCNews data from the packaged config, dev alone."""
    from tools.finetune import command
    return in_process(command, [str(ROOT / "tasks" / "thucnews" / "config.yaml"), "--set",
                                f"data_dir={data}", "eval_only=true", f"init_checkpoint={run}",
                                "eval_splits=[dev]", f"output_dir={out}", "progress=false"],
                      expect)


def test_eval_only_reads_the_labels_in_the_models_order(tmp_path, capsys):
    """A copy of the data whose label.txt lists the labels in another order: output i is still
    task.json's labels[i], so pred, probs and accuracy are predict's (the packaged
    test_splits are not scored: dev alone is named). A label the model was not trained on is
    one line naming it, before anything is written."""
    rng = np.random.default_rng(3)
    labels = ["体育", "财经", "游戏"]
    data = thucnews_data(tmp_path / "thucnews", labels, rng)
    run = tmp_path / "run"
    finetune_task("thucnews", data, run, vocab_dir(tmp_path / "vocab", THUC),
                  "model_overrides.initializer_range=1.0", "test_splits=[]")
    assert json.loads((run / "best" / "task.json").read_text())["labels"] == labels
    copy = tmp_path / "copy"
    shutil.copytree(data, copy)
    (copy / "label.txt").write_text("\n".join(labels[1:] + labels[:1]) + "\n", encoding="utf-8")
    evaluate_thucnews(copy, run, tmp_path / "eval")
    docs = load_reader("thucnews").read(str(data), "dev", {})
    predicted = {r["doc_id"]: r for r in Pipeline.from_pretrained(str(run))(docs)}
    assert len({r["pred"] for r in predicted.values()}) > 1   # the order shows
    evaluated = read_jsonl(tmp_path / "eval" / "predictions_dev.jsonl")
    assert sorted(predicted) == sorted(r["doc_id"] for r in evaluated)
    for r in evaluated:
        assert r["pred"] == predicted[r["doc_id"]]["pred"], (r, predicted[r["doc_id"]])
        np.testing.assert_allclose(r["probs"], predicted[r["doc_id"]]["probs"], atol=1e-5)
    results = json.loads((tmp_path / "eval" / "dev_results.json").read_text())
    gold = {d.doc_id: d.label for d in docs}
    assert results["accuracy"] == pytest.approx(
        np.mean([r["pred"] == gold[r["doc_id"]] for r in predicted.values()]))
    assert not (tmp_path / "eval" / "test_results.json").exists()
    # a label the model has no output for
    (copy / "label.txt").write_text("\n".join(labels + ["科技"]) + "\n", encoding="utf-8")
    from tools.finetune import main
    exits(2, lambda: main([str(ROOT / "tasks" / "thucnews" / "config.yaml"), "--set",
                           f"data_dir={copy}", "eval_only=true", f"init_checkpoint={run}",
                           "eval_splits=[dev]", f"output_dir={tmp_path / 'refused'}"]))
    one_error_line(capsys, f"{copy}: label '科技' is not one of the 3 labels {run / 'best'} "
                           "was trained on (its task.json: 体育, 财经, 游戏): the model has no "
                           "output for it")
    assert not (tmp_path / "refused").exists()


def test_eval_only_reads_the_text_with_the_runs_reader_options(tmp_path):
    """IFLYTEK trained with reader.remove_spaces=false (its words keep their spaces): eval_only
    through the packaged config (reader: {}) reads the text as the run did, as predict does,
    and says so; the user's reader.remove_spaces wins with its own line. Where the data is
    (reader.files) stays the config's."""
    rng = np.random.default_rng(2)
    data = iflytek_json(tmp_path / "iflytek", (("train.json", 12), ("dev.json", 8)),
                        lambda i: str(i % 3), lambda: text(rng, WORDS, int(rng.integers(4, 20))))
    (data / "other.json").write_text((data / "dev.json").read_text())
    run = tmp_path / "run"
    finetune_task("iflytek", data, run, vocab_dir(tmp_path / "vocab", WORDS),
                  "reader.remove_spaces=false", "model_overrides.initializer_range=1.0")
    from tools.finetune import command

    def evaluate(out, *given):
        return in_process(command, [str(ROOT / "tasks" / "iflytek" / "config.yaml"), "--set",
                                    f"data_dir={data}", "eval_only=true",
                                    f"init_checkpoint={run}", "eval_splits=[dev]",
                                    f"output_dir={out}", "progress=false", *given]).stdout
    log = evaluate(tmp_path / "eval", "reader.files.dev=other.json")
    line, = [x for x in log.splitlines() if "reading as" in x]
    assert line.endswith(f"eval_only: reading as {run / 'best'} was trained (its task.json), "
                         f"not as {ROOT / 'tasks' / 'iflytek' / 'config.yaml'} says: "
                         "max_seq_len 16 (config 512), reader.remove_spaces false (config not "
                         "set)"), line
    assert (yaml_values(tmp_path / "eval" / "run_config.yaml")["reader"] ==
            {"files": {"dev": "other.json"}, "remove_spaces": False})
    docs = load_reader("iflytek").read(str(data), "dev", {"remove_spaces": False})
    predicted = {r["doc_id"]: r for r in Pipeline.from_pretrained(str(run))(docs)}
    evaluated = read_jsonl(tmp_path / "eval" / "predictions_dev.jsonl")
    assert sorted(predicted) == sorted(r["doc_id"] for r in evaluated)
    for r in evaluated:
        assert r["pred"] == predicted[r["doc_id"]]["pred"]
        np.testing.assert_allclose(r["probs"], predicted[r["doc_id"]]["probs"], atol=1e-5)
    # the user's value wins, with its line; the text then differs (its words run together)
    log = evaluate(tmp_path / "given", "reader.remove_spaces=true")
    line, = [x for x in log.splitlines() if "differ from" in x]
    assert line.endswith("and are used: reader.remove_spaces true (trained with false)"), line
    glued = read_jsonl(tmp_path / "given" / "predictions_dev.jsonl")
    assert any(not np.allclose(r["probs"], predicted[r["doc_id"]]["probs"], atol=1e-3)
               for r in glued)


def test_span_predict_equals_evaluation(tmp_path):
    data, out = cmrc_run(tmp_path)
    docs = load_reader("cmrc2018").read(str(data), "dev", {})
    # the fields a user sends: question and context (no answers)
    inputs = [{"id": d.doc_id, "question": d.fields["question"],
               "context": d.fields["context"]} for d in docs]
    # task.json holds every option as the run resolved it, the ones the config left out
    # (answer_unit, empty_answer, …) included: a later default must not change this model
    from ernie_doc.kinds.span import SpanTask
    from ernie_doc.run_config import load_config
    given = load_config(None, ["task=cmrc2018"]).task_options
    assert {"answer_unit", "empty_answer", "unreferenced", "loss_positions"}.isdisjoint(given)
    saved = json.loads((out / "best" / "task.json").read_text())["config"]["task_options"]
    assert saved == dict(SpanTask.option_defaults, max_query_len=6, max_answer_len=8,
                         n_best_pool="context")
    records = Pipeline.from_pretrained(str(out))(inputs)
    assert_same_predictions(read_jsonl(out / "predictions_dev.jsonl"), records)
    for r in records:
        context = next(d.fields["context"] for d in docs if d.doc_id == r["doc_id"])
        assert r["pred"] in context


def test_choice_predict_equals_evaluation(tmp_path):
    data = c3_data(tmp_path, (("train", 8), ("dev", 5), ("test", 2)))
    out = tmp_path / "out"
    # T=32: the default (PaddleNLP's) C3 window leaves no context at T=16
    finetune_task("c3", data, out, vocab_dir(tmp_path / "vocab", ZH), "stride=4",
                  "batch_size=2", "grad_accum_steps=1", "max_seq_len=32",   # 2 questions: 8 rows
                  "model_overrides.max_position_embeddings=32")
    # task.json holds every task option as the run resolved it, defaults included, so a
    # later change of a default does not change how this model reads
    from ernie_doc.kinds.choice import MultipleChoiceTask
    saved = json.loads((out / "best" / "task.json").read_text())["config"]["task_options"]
    assert saved == MultipleChoiceTask.option_defaults
    docs = load_reader("c3").read(str(data), "dev", {})
    inputs = [{"id": d.doc_id, "context": d.fields["context"], "question": d.fields["question"],
               "choices": d.fields["choices"]} for d in docs]
    # batch_size counts questions (PaddleNLP's unit): 2 questions are 8 rows, in training and
    # in prediction; predict's own batch size counts rows
    assert "(8 rows/rank x 1 ranks x 1 accumulation)" in (out / "train.log").read_text()
    pipe = Pipeline.from_pretrained(str(out))
    assert pipe.rows == 8
    seen = []
    forward = pipe.task.forward

    def spy(model, batch, carry):
        seen.append(int(batch["input_ids"].shape[0]))
        return forward(model, batch, carry)

    pipe.task.forward = spy
    records = pipe(inputs)
    assert_same_predictions(read_jsonl(out / "predictions_dev.jsonl"), records)
    for r, d in zip(records, docs):
        assert len(r["probs"]) == len(d.fields["choices"])
    # the last question reads alone once the others are done: its group of 4 rows, memories
    # gathered, gives the records the full batch of 8 gives
    assert seen[0] == 8 and seen[-1] == 4
    pipe.compact = False
    assert pipe(inputs) == records
    with pytest.raises(PipelineError, match="batch size 6 must be a positive multiple of 4"):
        Pipeline.from_pretrained(str(out), batch_size=6)


def test_pair_matching_and_keyphrase_predict_equal_evaluation(tmp_path):
    data = cail_data(tmp_path, (("train", 8), ("valid", 5), ("test", 2)))
    out = tmp_path / "cail-out"
    finetune_task("cail2019_scm", data, out, vocab_dir(tmp_path / "zh", ZH), "stride=4",
                  "batch_size=2", "grad_accum_steps=1")   # 2 triplets: 4 rows
    docs = load_reader("cail2019_scm").read(str(data), "dev", {})   # valid.json
    inputs = [{"id": d.doc_id, **{k: d.fields[k] for k in "ABC"}} for d in docs]
    assert_same_predictions(read_jsonl(out / "predictions_dev.jsonl"),
                            Pipeline.from_pretrained(str(out))(inputs))

    from test_openkp import fixture_docs, openkp_file
    rng = np.random.default_rng(7)
    data = tmp_path / "openkp"
    data.mkdir()
    openkp_file(data / "OpenKPTrain.jsonl", fixture_docs(rng, 8, "t"))
    openkp_file(data / "OpenKPDev.jsonl", fixture_docs(rng, 4, "d"))
    out = tmp_path / "kp-out"
    finetune_task("openkp", data, out, vocab_dir(tmp_path / "en", WORDS), "stride=8")
    docs = load_reader("openkp").read(str(data), "dev", {})
    records = Pipeline.from_pretrained(str(out))(
        [{"id": d.doc_id, "text": " ".join(d.fields["words"])} for d in docs])
    assert_same_predictions(read_jsonl(out / "predictions_dev.jsonl"), records)


def test_hotpotqa_two_stages_equal_the_two_runs(tmp_path):
    """Stage 1's selection feeds stage 2 inside the pipeline as the stage-2 run read stage 1's
    predictions_dev.jsonl: the answers are the stage-2 run's."""
    from test_hotpotqa import finetune_stage, hotpot_data
    from test_hotpotqa import tokenizer as hotpot_tokenizer
    data = hotpot_data(tmp_path)
    vocab, _ = hotpot_tokenizer(tmp_path)
    first, second = tmp_path / "evidence", tmp_path / "answer"
    finetune_stage(data, first, vocab, "test_splits=[]")
    finetune_stage(data, second, vocab, stage="answer", evidence=first)
    docs = load_reader("hotpotqa").read(str(data), "dev", {})
    inputs = [{"id": d.doc_id, "question": d.fields["question"],
               "paragraphs": d.fields["paragraphs"]} for d in docs]   # no answers, no facts
    evidence = Pipeline.from_pretrained(str(first))(inputs)
    assert_same_predictions(read_jsonl(first / "predictions_dev.jsonl"), evidence)
    records = pipeline(str(first), answer_model=str(second))(inputs)
    assert [r["index"] for r in records] == list(range(len(docs)))
    assert_same_predictions(read_jsonl(second / "predictions_dev.jsonl"), records)
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in inputs), encoding="utf-8")
    predict_cli(first, "--answer-model", second, "--input", path, "--output",
                tmp_path / "p.jsonl")
    assert_same_predictions(read_jsonl(second / "predictions_dev.jsonl"),
                            read_jsonl(tmp_path / "p.jsonl"))
    with pytest.raises(PipelineError, match="an evidence model then an answer model"):
        pipeline(str(second), answer_model=str(first))


def test_exported_model_predicts_like_dygraph(imdb_run, tmp_path):
    """ernie-doc export of best/ carries task.json and the tokenizer; engine inference (fp32,
    oneDNN) gives dygraph's predictions; bf16 runs where the CPU has it, else is refused."""
    data, out = imdb_run
    export = tmp_path / "export"
    from tools.export_model import command
    in_process(command, ["--config", str(out / "best"), "--head", "sequence_classification",
                         "--output", str(export / "model")])
    assert {"task.json", "vocab.txt", "model.meta.json"} <= set(os.listdir(export))
    docs = load_reader("imdb").read(str(data), "test", {})
    dygraph = Pipeline.from_pretrained(str(out))(docs)
    engine = Pipeline.from_pretrained(str(export))   # auto: an export runs on inference
    assert type(engine.model).__name__ == "ExportedModel"
    exported = engine(docs)
    for a, b in zip(dygraph, exported):
        assert a["pred"] == b["pred"] and a["segments"] == b["segments"]
        np.testing.assert_allclose(a["probs"], b["probs"], atol=1e-5)
    # an export of a fixed batch reads every step at that batch: no idle row is dropped
    in_process(command, ["--config", str(out / "best"), "--head", "sequence_classification",
                         "--output", str(tmp_path / "fixed" / "model"), "--batch-size", "2"])
    fixed = Pipeline.from_pretrained(str(tmp_path / "fixed"), batch_size=2)
    assert not fixed.compact and engine.compact
    assert fixed(docs) == exported
    from ernie_doc.predict.engine import BF16_CPU_FLAGS, cpu_flags
    if set(BF16_CPU_FLAGS) & cpu_flags():
        bf16 = Pipeline.from_pretrained(str(export), precision="bf16")(docs)
        agree = np.mean([a["pred"] == b["pred"] for a, b in zip(dygraph, bf16)])
        assert agree >= 0.75, agree   # 8 near-tied documents of a tiny model
    else:
        with pytest.raises(PipelineError, match="avx512_bf16 or amx_bf16"):
            Pipeline.from_pretrained(str(export), precision="bf16")
    with pytest.raises(PipelineError, match="engine inference needs an exported model"):
        Pipeline.from_pretrained(str(out), engine="inference")
    with pytest.raises(PipelineError, match="the dygraph engine runs fp32"):
        Pipeline.from_pretrained(str(out), precision="bf16")


def test_benchmark_predict_reports_every_engine(imdb_run, tmp_path):
    from benchmarks import predict as benchmark_predict
    data, out = imdb_run
    docs = load_reader("imdb").read(str(data), "test", {})
    inputs = tmp_path / "in.jsonl"
    inputs.write_text("".join(json.dumps({"id": d.doc_id, "text": d.text}) + "\n"
                              for d in docs), encoding="utf-8")
    report = tmp_path / "bench.json"
    assert benchmark_predict.main([str(out), "--input", str(inputs), "--limit", "6",
                                   "--warmup", "2", "--output", str(report)]) == 0
    engines = json.loads(report.read_text())["engines"]
    for name in ("dygraph", "inference"):
        e = engines[name]
        assert e["documents"] == 6 and e["tokens"] > 0 and e["model_calls"] > 0
        assert 0 < e["model_seconds"] <= e["seconds"]
        # the times are rounded to 1 ms: the ratio lies between the bounds they allow
        low = (e["model_seconds"] - 5e-4) / (e["seconds"] + 5e-4)
        high = (e["model_seconds"] + 5e-4) / max(e["seconds"] - 5e-4, 1e-9)
        assert low - 5e-4 <= e["end_to_end_over_forward"] <= high + 5e-4, e
    assert engines["inference"]["agreement_with_dygraph"]["same_prediction"] == 1.0
    assert engines["inference"]["agreement_with_dygraph"]["max_prob_diff"] <= 1e-5
    speedup = engines["inference"]["speedup_over_dygraph"]
    for key in ("tokens_per_sec", "forward_tokens_per_sec"):
        assert speedup[key] == pytest.approx(
            engines["inference"][key] / engines["dygraph"][key], rel=0.01)
    bf16 = engines["inference-bf16"]
    if "skipped" in bf16:
        assert "avx512_bf16" in bf16["skipped"]
    else:   # compared with both earlier engines, inference fp32 included
        assert set(bf16) >= {"agreement_with_dygraph", "agreement_with_inference",
                             "speedup_over_dygraph", "speedup_over_inference"}
        assert bf16["agreement_with_inference"]["documents"] == 6
        assert 0 < bf16["agreement_with_inference"]["max_prob_diff"] < 0.1   # bf16 ran, close


def test_benchmark_predict_reads_one_long_document(saved, tmp_path, capsys):
    """--long-document: one document of the input's texts joined, in a process of its own,
    with its tokens, time, the model's share, resident memory and prediction; --compare-with
    is checked before anything runs."""
    from benchmarks import predict as benchmark_predict
    inputs = write_jsonl(tmp_path / "in.jsonl", [{"id": str(i), "text": " ".join(WORDS[i:])}
                                                 for i in range(4)])
    report = tmp_path / "bench.json"
    assert benchmark_predict.main([str(saved[0]), "--input", str(inputs), "--long-document",
                                   "100", "--threads", "1", "--output", str(report)]) == 0
    run = json.loads(report.read_text())["long_document"]["100"]["this"]
    assert 100 <= run["tokens"] < 115 and run["segments"] == -(-(run["tokens"] - 14) // 8) + 1
    assert run["model_calls"] == 2 * run["segments"] and 0 < run["model_share"] < 1
    assert run["peak_rss_mib"] >= run["rss_at_end_mib"] > 0 and run["prediction"]["pred"]
    assert run["ernie_doc"] == str(ROOT)
    exits(2, lambda: benchmark_predict.main([str(saved[0]), "--input", str(inputs),
                                             "--compare-with", str(tmp_path)]))
    assert "--compare-with and --long-timeout go with --long-document" in capsys.readouterr().err
    exits(2, lambda: benchmark_predict.main([str(saved[0]), "--input", str(inputs),
                                             "--long-document", "100", "--compare-with",
                                             str(tmp_path)]))
    one_error_line(capsys, f"--compare-with {tmp_path}: no ernie_doc/ there")


def test_bad_documents_get_an_error_line_or_stop_the_run(imdb_run, tmp_path):
    _, out = imdb_run
    inputs = tmp_path / "in.jsonl"
    with open(inputs, "wb") as f:
        f.write(json.dumps({"id": "a", "text": "good movie"}).encode() + b"\n")
        f.write(json.dumps({"id": "empty", "text": ""}).encode() + b"\n")
        f.write(b'{"id": "latin1", "text": "caf\xe9"}\n')          # not UTF-8
        f.write(json.dumps({"id": "nofield", "title": "x"}).encode() + b"\n")
        f.write(b"{not json\n")
        f.write(json.dumps({"id": "a", "text": "again"}).encode() + b"\n")   # duplicate id
        f.write(json.dumps({"id": "b", "text": "bad plot " * 50}).encode() + b"\n")
        # a gold label, even one the model never saw, is not read
        f.write(json.dumps({"id": "c", "text": "fine", "label": "zzz"}).encode() + b"\n")
    preds = tmp_path / "preds.jsonl"
    proc = predict_cli(out, "--input", inputs, "--output", preds)
    records = {r["doc_id"]: r for r in read_jsonl(preds)}
    assert json.loads(proc.stdout.strip().splitlines()[-1])["errors"] == 5
    assert "pred" in records["a"] and "pred" in records["b"] and records["b"]["segments"] > 3
    assert records["c"]["pred"] in ("0", "1")
    errors = {k: r["error"] for k, r in records.items() if "error" in r}
    # an item without a usable id is named "#<input index>", a repeated id "<id>#<index>"
    assert set(errors) == {"empty", "#2", "nofield", "#4", "a#5"}
    assert errors["#2"].startswith(f"{inputs}:3: not UTF-8")
    assert errors["#4"].startswith(f"{inputs}:5: invalid JSON")
    assert "text" in errors["nofield"]
    assert errors["a#5"] == "duplicate document id (first given by input item 1)"
    # --on-error fail: one line naming the document, exit 2; what came before it stays
    strict = tmp_path / "strict.jsonl"
    proc = predict_cli(out, "--input", inputs, "--output", strict, "--on-error", "fail",
                       expect=2)
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error: document 'empty' (input item 2)") and "Traceback" \
        not in proc.stderr
    assert [r["doc_id"] for r in read_jsonl(strict)] in ([], ["a"])


def test_resume_skips_what_is_written_and_repairs_a_cut_line(imdb_run, tmp_path):
    data, out = imdb_run
    inputs = tmp_path / "in.jsonl"
    docs = load_reader("imdb").read(str(data), "test", {})
    inputs.write_text("".join(json.dumps({"id": d.doc_id, "text": d.text}) + "\n"
                              for d in docs), encoding="utf-8")
    full = tmp_path / "full.jsonl"
    predict_cli(out, "--input", inputs, "--output", full)
    lines = full.read_text(encoding="utf-8").splitlines(keepends=True)
    part = tmp_path / "part.jsonl"
    part.write_text("".join(lines[:3]) + lines[3][:10], encoding="utf-8")   # a cut-short line
    # the sidecar says which model wrote it: --resume continues only that model's file
    shutil.copy(str(full) + ".meta.json", str(part) + ".meta.json")
    origin = provenance(model_directory(str(out)))
    assert completed_ids(str(part), origin) == [json.loads(x)["doc_id"] for x in lines[:3]]
    assert part.read_text(encoding="utf-8") == "".join(lines[:3])   # repaired
    part.write_text("".join(lines[:3]) + lines[3][:10], encoding="utf-8")
    proc = predict_cli(out, "--input", inputs, "--output", part, "--resume")
    assert json.loads(proc.stdout.strip().splitlines()[-1])["skipped"] == 3
    assert sorted(read_jsonl(part), key=lambda r: r["doc_id"]) == \
        sorted(read_jsonl(full), key=lambda r: r["doc_id"])
    # an existing output is never replaced without being asked
    proc = predict_cli(out, "--input", inputs, "--output", full, expect=2)
    assert "exists; --resume continues it, --overwrite replaces it" in proc.stderr
    assert sorted(read_jsonl(full), key=lambda r: r["doc_id"]) == \
        sorted(read_jsonl(part), key=lambda r: r["doc_id"])


def test_input_formats(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "b.txt").write_text("second", encoding="utf-8")
    (folder / "a.txt").write_text("first\nline two", encoding="utf-8")
    (folder / "skip.md").write_text("not a document", encoding="utf-8")
    assert list(read_inputs(str(folder))) == [{"id": "a.txt", "text": "first\nline two"},
                                              {"id": "b.txt", "text": "second"}]
    tsv = tmp_path / "in.tsv"
    tsv.write_text("id\tquestion\tcontext\nq1\twho\tsomeone\nq2\tonly two\n", encoding="utf-8")
    items = list(read_inputs(str(tsv)))
    assert items[0] == {"id": "q1", "question": "who", "context": "someone"}
    assert "2 columns, the header has 3" in items[1].message
    one = tmp_path / "doc.txt"
    one.write_text("a whole document", encoding="utf-8")
    assert list(read_inputs(str(one))) == [{"id": "doc.txt", "text": "a whole document"}]


def test_documents_stream_in_bounded_memory(imdb_run):
    """Predictions come out while the input is still being read: an endless input yields its
    first records, holding at most the batch rows' documents."""
    _, out = imdb_run
    pipe = Pipeline.from_pretrained(str(out), batch_size=2)
    endless = ({"id": str(i), "text": "good movie " * (1 + i % 7)} for i in itertools.count())
    first = list(itertools.islice(pipe.stream(endless), 20))
    assert len({r["doc_id"] for r in first}) == 20


# A long document: memory flat in its length, predictions those of evaluation's reading.
LONG_DOCS = """
import json, resource, sys, threading, time
import numpy as np
from ernie_doc.predict.pipeline import Pipeline
rows, short, long = 16, 400, 4000
pipe = Pipeline.from_pretrained(sys.argv[1], batch_size=rows)
rng = np.random.default_rng(0)
def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
def read(n):   # `rows` documents of n token ids, one a row → (peak RSS while read, segments)
    docs = [{"id": str(i), "ids": rng.integers(5, 20, n).tolist()} for i in range(rows)]
    peak, done = [rss()], threading.Event()
    def sample():   # what a document holds lives until it ends: sampled, it is seen
        while not done.wait(0.005):
            peak[0] = max(peak[0], rss())
    watch = threading.Thread(target=sample)
    watch.start()
    records = list(pipe.stream(docs))
    done.set()
    watch.join()
    return max(peak[0], rss()), records[0]["segments"]
read(5)   # the first steps build paddle's kernels and caches
with open("/proc/self/status") as f:   # a leak ends in a MemoryError, not a swapping machine
    size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (size + (1 << 30), resource.RLIM_INFINITY))
(before, few), (after, many) = read(short), read(long)
print(json.dumps({"growth": after - before, "tokens": rows * (long - short),
                  "segments": [few, many], "peak": after}))
"""


def test_memory_is_flat_in_document_length(saved):
    """What a document in a row holds grows only with its token ids (16 bytes a token: the
    input's list and its int64 copy), not with its segments. The tiny model's windows advance
    8 tokens, so 4,000 tokens are 500 segments (as many as 63,000 tokens at stride 126), and
    16 documents read side by side put 8,000 segments through the pipeline in 1,000 steps:
    the resident memory of a separate process, sampled while 16 × 4,000 tokens are read,
    peaks above its peak for 16 × 400 by at most their ids and 2 MiB (it was about 10 MiB
    more: every segment of both
    passes built up front, each row output keeping its batch's tensor, a leaked list per
    paddle.to_tensor). At 1M tokens this bound is 16 MiB, 5 % of a ~350 MiB process. The
    address space is capped at 1 GiB over the warmed-up process's, so a leak fails cleanly."""
    proc = subprocess.run([sys.executable, "-c", LONG_DOCS, str(saved[0])], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["segments"] == [50, 500]
    assert out["growth"] <= 16 * out["tokens"] + (2 << 20), out


def test_a_long_document_is_predicted_as_evaluation_reads_it(pipe, monkeypatch):
    """A 1,200-token document (150 segments, two passes): the pipeline's streamed record
    equals what evaluation's path gives with every segment built up front (DocumentSplit's
    batches, to_tensor, collect_row_outputs into lists), probabilities bit for bit."""
    from collections import defaultdict

    from ernie_doc.data.document import Document
    from ernie_doc.data.segment import reading_passes
    from ernie_doc.data.splits import DocumentSplit, collect_row_outputs
    from ernie_doc.metrics.classification import aggregate_segments
    task, cfg = pipe.task, pipe.cfg
    streamed = {}
    original = task.predict_document
    monkeypatch.setattr(task, "predict_document",
                        lambda d, r, s: streamed.update(rows=r) or original(d, r, s))
    ids = np.random.default_rng(3).integers(5, 20, 1200).tolist()
    [record] = pipe.stream([{"id": "long", "ids": ids}])
    doc = Document("long", ids=ids)
    steps = list(task.document_segments(doc, 0, pipe.tokenizer))
    passes = [list(reading_passes(steps, cfg.retro_feed, cfg.train_skim))]
    split = DocumentSplit("eager", [doc], passes, 1, pipe.rows, cfg.max_seq_len, pipe.pad_id)
    rows, carry = defaultdict(list), {}
    for _, batch in split.batches():
        tensors = {k: paddle.to_tensor(v) for k, v in batch.items()}
        with paddle.no_grad():
            out, carry = task.forward(pipe.model, tensors, carry)
        collect_row_outputs(task, batch, tensors, out, 1, rows)
    assert len(rows[0]) == 150 and record["segments"] == 150
    assert {k: v for k, v in record.items() if k != "index"} == task.predict([doc], rows,
                                                                             passes)[0]
    assert np.array_equal(aggregate_segments(streamed["rows"]), aggregate_segments(rows[0]))


def test_model_directory_errors(tmp_path, imdb_run):
    _, out = imdb_run
    with pytest.raises(PipelineError, match="no task.json here or in best/ or final/"):
        Pipeline.from_pretrained(str(tmp_path))
    proc = predict_cli(tmp_path, "--input", tmp_path / "none.jsonl", "--output",
                       tmp_path / "p.jsonl", expect=2)
    assert "none.jsonl: no such file or directory" in proc.stderr


# predict's input rules and its bad model folders: a bad input line is an error record and the
# run goes on (exit 2 with --on-error fail); `ids` must be token ids of the model; `ids` and
# `text` together are an error; a UTF-8 byte-order mark is dropped; a bad option, task.json or
# export sidecar is one `error:` line naming it, never a traceback.
#
# One tiny saved classifier (trained for one step) and one export of it serve every case;
# tools run in-process (main(argv), stderr through capsys), one subprocess checks the exit
# status and stderr of the installed command.


DEEP = "[" * 100_000 + "]" * 100_000   # json.loads recurses once per level
BOM = b"\xef\xbb\xbf"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(run directory, export folder) of one tiny classifier."""
    root = tmp_path_factory.mktemp("saved")
    run = tiny_classifier(root)
    return run, tiny_export(run / "best", root / "export" / "model")


@pytest.fixture(scope="module")
def pipe(saved):
    return pipeline(str(saved[0]))


@pytest.mark.skipif(denormals_flushed() is None,
                    reason="reads the x86-64 MXCSR through glibc's fenv")
@pytest.mark.parametrize("which", ["run", "export"])
def test_prediction_flushes_denormals_as_the_run_did(saved, which):
    """A saved model predicts with denormal floats flushed, as its run trained
    (flush_denormals defaults to true): a CPU step over denormals is several times slower."""
    before = denormals_flushed()
    flush_denormals(False)
    try:
        pipeline(str(saved[0] if which == "run" else saved[1]))
        assert denormals_flushed() is True
    finally:
        flush_denormals(before)


def write_jsonl(path, items):
    """Lines: JSON objects, or raw str/bytes lines as given."""
    with open(path, "wb") as f:
        for item in items:
            line = item if isinstance(item, bytes) else \
                item.encode() if isinstance(item, str) else json.dumps(item).encode()
            f.write(line + b"\n")
    return path


def records(path):
    return {r["doc_id"]: r for r in map(json.loads, path.read_text().splitlines())}


def predicted(model, inputs, output, *options):
    """The records (by doc_id) of `ernie-doc predict MODEL --input INPUTS --output OUTPUT`,
    which must exit 0."""
    assert predict.main([str(model), "--input", str(inputs), "--output", str(output),
                         "--no-progress", *options]) == 0
    return records(output)


# -- input lines ---------------------------------------------------------------------------------
BAD_IDS = {   # id → (ids, what the error record says)
    "big": ([5, 6, 20], "'ids' item 2 is 20: token ids lie in [0, 20)"),
    "huge": ([10 ** 30], "'ids' item 0 is beyond int64"),
    "negative": ([5, -3], "'ids' item 1 is -3"),
    "string": ("5 6 7", "'ids' must be a list of token ids, got str"),
    "float": ([5, 6.0], "'ids' item 1 must be an integer token id, got float"),
    "bool": ([True, 5], "'ids' item 0 must be an integer token id, got bool"),
    "nested": ([[5, 6]], "'ids' item 0 must be an integer token id, got list"),
    "quoted": ([5, "6"], "'ids' item 1 must be an integer token id, got str"),
    "object": ({"a": 1}, "'ids' must be a list of token ids, got dict"),
    "both": ([5, 6], "give either ids or text, not both"),
}


def test_bad_ids_and_ids_with_text_are_error_records(pipe):
    """Each bad `ids` is an error record naming what is wrong, checked against the model's
    vocab_size (20) before any tensor is built; the good documents around them predict."""
    docs = [{"id": "first", "text": "good movie"}]
    docs += [{"id": k, "ids": ids, **({"text": "bad plot"} if k == "both" else {})}
             for k, (ids, _) in BAD_IDS.items()]
    docs += [{"id": "ids", "ids": [5, 6, 19]}, {"id": "last", "text": "bad plot"}]
    out = {r["doc_id"]: r for r in pipe(docs)}
    for key, (_, message) in BAD_IDS.items():
        assert message in out[key].get("error", ""), (key, out[key])
    for key in ("first", "ids", "last"):
        assert out[key]["pred"] in ("0", "1") and "error" not in out[key]
    assert pipe.vocab_size == 20   # the bound: the model's embedding rows
    pipe.on_error = "fail"   # the shared pipeline: restored below
    try:
        with pytest.raises(PipelineError, match=r"document 'big' \(input item 1\): 'ids' item "
                                                r"2 is 20"):
            pipe([{"id": "big", "ids": [5, 6, 20]}])
    finally:
        pipe.on_error = "record"


def test_what_a_model_reads_decides_which_fields_are_errors():
    """ids to a model that reads text (a language model, span kinds) and text to a model
    with no tokenizer (a pre-tokenized task's) are errors, never silently ignored."""
    from ernie_doc.predict.documents import document_problem
    ids, text = to_document(0, {"ids": [1, 2]}), to_document(0, {"text": "a b"})
    assert document_problem(ids, None) == "this model reads text, not token ids ('ids')"
    assert document_problem(ids, 10, reads_text=False) is None
    assert document_problem(text, 10, reads_text=False) == \
        "this model reads token ids ('ids'), not text"
    assert to_document(3, {"id": ["x"], "text": "a"}).message == \
        "'id' must be a string or an integer, got list"


def test_a_deeply_nested_line_is_an_error_record_and_the_run_goes_on(saved, tmp_path,
                                                                       capsys):
    run, _ = saved
    inputs = write_jsonl(tmp_path / "in.jsonl", [
        {"id": "a", "text": "good movie"}, DEEP, {"id": "deep", "ids": json.loads(
            "[" * 50 + "5" + "]" * 50)}, {"id": "big", "ids": [5, 99]},
        {"id": "b", "text": "bad plot"}])
    preds = tmp_path / "preds.jsonl"
    assert predict.main([str(run), "--input", str(inputs), "--output", str(preds),
                         "--no-progress"]) == 0
    out = records(preds)
    assert out["#1"]["error"] == f"{inputs}:2: JSON nested too deeply"
    assert "'ids' item 0 must be an integer token id, got list" in out["deep"]["error"]
    assert "'ids' item 1 is 99" in out["big"]["error"]
    assert "pred" in out["a"] and "pred" in out["b"]
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["errors"] == 3
    strict = tmp_path / "strict.jsonl"
    exits(2, lambda: predict.main([str(run), "--input", str(inputs), "--output", str(strict),
                                   "--no-progress", "--on-error", "fail"]))
    one_error_line(capsys, f"document '#1' (input item 2): {inputs}:2: JSON nested too "
                           f"deeply")


def test_deep_json_in_reader_files_is_one_line(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text(DEEP)
    with pytest.raises(DataError, match=r"deep.json: JSON nested too deeply"):
        read_json_file(path)
    with pytest.raises(DataError, match=r"x.jsonl:7: JSON nested too deeply"):
        parse_json_line(DEEP, "x.jsonl", 7)


def test_a_json_key_given_twice_is_refused_naming_it(saved, tmp_path, capsys):
    """json.loads keeps the last of two values under one key without a word: a task.json
    listing its labels twice (the second list reversed) predicted with swapped label names,
    and an input line giving 'text' twice predicted the second. Now: one line naming the
    task.json and the key (exit 2); an error record naming the input line; a reader's JSON
    file, one line."""
    model = copy_of(saved[0] / "best", tmp_path)
    task = (model / "task.json").read_text()
    labels = json.dumps(json.loads(task)["labels"])
    (model / "task.json").write_text(task.replace('"labels":', '"labels": %s, "labels":'
                                                  % labels, 1))
    message = 'the key "labels" appears twice in one object'
    with pytest.raises(PipelineError, match=f"^{re.escape(str(model / 'task.json'))}: "
                                            f"{message}$"):
        pipeline(str(model))
    inputs = write_jsonl(tmp_path / "in.jsonl", [
        {"id": "a", "text": "good"}, '{"id": "b", "text": "good", "text": "bad plot"}'])
    exits(2, lambda: predict.main([str(model), "--input", str(inputs), "--output",
                                   str(tmp_path / "p.jsonl")]))
    one_error_line(capsys, f"{model / 'task.json'}: {message}")
    out = predicted(saved[0], inputs, tmp_path / "preds.jsonl")
    assert out["#1"]["error"] == f'{inputs}:2: the key "text" appears twice in one object'
    assert "pred" in out["a"]
    path = tmp_path / "reader.json"
    path.write_text('[{"id": 1, "label": "a",\n "label": "b"}]')
    with pytest.raises(DataError, match=f'^{path}: the key "label" appears twice'):
        read_json_file(path)
    with pytest.raises(DataError, match=r'^x.jsonl:7: the key "id" appears twice'):
        parse_json_line('{"id": 1, "id": 2}', "x.jsonl", 7)


def test_a_byte_order_mark_is_dropped(tmp_path):
    """Before a TSV header, a JSON line or a text file: the column is `id`, the line is JSON,
    the text has no U+FEFF (the documents are named by their ids, not by position)."""
    (tmp_path / "in.tsv").write_bytes(BOM + b"id\ttext\nq1\tgood movie\n")
    (tmp_path / "in.jsonl").write_bytes(BOM + b'{"id": "q2", "text": "bad"}\n')
    (tmp_path / "doc.txt").write_bytes(BOM + b"fine plot")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_bytes(BOM + b"good")
    assert list(read_inputs(str(tmp_path / "in.tsv"))) == [{"id": "q1", "text": "good movie"}]
    assert list(read_inputs(str(tmp_path / "in.jsonl"))) == [{"id": "q2", "text": "bad"}]
    assert list(read_inputs(str(tmp_path / "doc.txt"))) == [{"id": "doc.txt",
                                                             "text": "fine plot"}]
    assert list(read_inputs(str(tmp_path / "docs"))) == [{"id": "a.txt", "text": "good"}]
    # the task readers' TSV (the IMDB reader's official format) alike
    (tmp_path / "train.tsv").write_bytes(BOM + b"qid\tlabel\ttext_a\n1\t0\tgood\n")
    header, rows = read_tsv(tmp_path / "train.tsv", ("qid", "label", "text_a"))
    assert header == ["qid", "label", "text_a"] and rows == [(2, {"qid": "1", "label": "0",
                                                                  "text_a": "good"})]


# -- the Python API and options ------------------------------------------------------------------
def test_stream_skip_none_skips_nothing(pipe):
    got = list(pipe.stream([{"id": "a", "text": "good"}, "bad"], skip=None))
    assert sorted(r["doc_id"] for r in got) == ["1", "a"]
    assert [r["doc_id"] for r in pipe.stream(["good", "bad"], skip=[0])] == ["1"]
    with pytest.raises(PipelineError, match="skip: expected a collection of document ids, "
                                            "got a string"):
        list(pipe.stream(["good"], skip="a"))


def test_format_dir_on_a_file_is_one_line(saved, tmp_path, capsys):
    inputs = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "text": "good"}])
    exits(2, lambda: predict.main([str(saved[0]), "--input", str(inputs), "--output",
                                   str(tmp_path / "p.jsonl"), "--format", "dir"]))
    one_error_line(capsys, f"--format dir: {inputs} is not a directory")
    folder = tmp_path / "docs"
    folder.mkdir()
    exits(2, lambda: predict.main([str(saved[0]), "--input", str(folder), "--output",
                                   str(tmp_path / "q.jsonl"), "--format", "jsonl"]))
    one_error_line(capsys, f"--format jsonl: {folder} is a directory")


def test_the_gpu_is_refused_where_there_is_none(monkeypatch):
    """The decision is inference_settings's: no CUDA build, or no visible device, is one
    line naming the device, before any model is loaded."""
    from ernie_doc.predict.pipeline import check_device
    monkeypatch.setattr(paddle, "is_compiled_with_cuda", lambda: False)
    with pytest.raises(PipelineError, match="device 'gpu': this paddle is not compiled with "
                                            "CUDA"):
        check_device("gpu")
    monkeypatch.setattr(paddle, "is_compiled_with_cuda", lambda: True)
    monkeypatch.setattr(paddle.device.cuda, "device_count", lambda: 0)
    with pytest.raises(PipelineError, match="device 'gpu': paddle is compiled with CUDA but "
                                            "sees no GPU"):
        check_device("gpu")
    assert check_device("cpu") == "cpu"
    with pytest.raises(PipelineError, match=r"device must be one of \('cpu', 'gpu'\), got "
                                            r"'tpu'"):
        check_device("tpu")


@pytest.mark.skipif(paddle.is_compiled_with_cuda(), reason="checks a paddle without CUDA")
def test_device_gpu_without_a_gpu_exits_2_with_one_line(saved, tmp_path):
    inputs = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "text": "good"}])
    proc = subprocess.run([sys.executable, "-m", "ernie_doc.cli", "predict", str(saved[0]),
                           "--input", str(inputs), "--output", str(tmp_path / "p.jsonl"),
                           "--device", "gpu", "--no-progress"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("error: device 'gpu': this paddle is not compiled with CUDA")
    assert not (tmp_path / "p.jsonl").exists()


# -- the model folder ---------------------------------------------------------------------------
def copy_of(folder, tmp_path, name="model"):
    return shutil.copytree(folder, tmp_path / name)


@pytest.mark.parametrize("record, message", [
    ([{"task": "imdb"}], "expected a JSON object (task, kind, labels, config), got list"),
    ("imdb", "expected a JSON object (task, kind, labels, config), got str"),
    ({"task": "imdb", "kind": "classification", "config": {}}, "'labels' must be a list"),
    ({"task": "imdb", "kind": "classification", "labels": [0, 1], "config": {}},
     "'labels' must be a list of strings"),
])
def test_a_bad_task_json_is_one_line_naming_it(saved, tmp_path, capsys, record, message):
    model = copy_of(saved[0] / "best", tmp_path)
    (model / "task.json").write_text(json.dumps(record))
    with pytest.raises(PipelineError) as info:
        pipeline(str(model))
    assert str(info.value) == f"{model / 'task.json'}: {message}"
    inputs = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "text": "good"}])
    exits(2, lambda: predict.main([str(model), "--input", str(inputs), "--output",
                                   str(tmp_path / "p.jsonl")]))
    one_error_line(capsys, str(model / "task.json"), message)


def edit_sidecar(export, tmp_path, change):
    model = copy_of(export, tmp_path)
    meta = json.loads((model / "model.meta.json").read_text())
    change(meta)
    (model / "model.meta.json").write_text(json.dumps(meta))
    return model


def memory_len_everywhere(meta):
    """memory_len 4 in the config, memory_shape and both memories specs: the sidecar agrees
    with itself; only the program (memory_len 8) can tell."""
    for spec in meta["inputs"] + meta["outputs"]:
        if spec["name"] == "memories":
            spec["shape"][2] = 4
    meta["memory_shape"][2] = 4
    meta["config"]["memory_len"] = 4


@pytest.mark.parametrize("change, key", [
    (lambda m: m["config"].update(hidden_size=32),
     "config.hidden_size 32 disagrees with model.pdiparams"),
    (lambda m: m["config"].update(vocab_size=50),
     "config.vocab_size 50 disagrees with model.pdiparams (no embedding table [50, 16])"),
    (lambda m: m.update(memory_shape=[1, -1, 4, 16]),
     "memory_shape [1, -1, 4, 16] disagrees with the memories input [1, -1, 8, 16]"),
    (lambda m: m["config"].update(num_hidden_layers=2),
     "config.num_hidden_layers 2 disagrees with model.pdiparams (it holds 1 layers)"),
], ids=["hidden_size", "vocab_size", "memory_shape", "layers"])
def test_an_edited_sidecar_is_one_line_naming_it_and_the_key(saved, tmp_path, change, key):
    """Checked against the parameters file and the sidecar's own input shapes when the
    pipeline is built, before anything runs."""
    model = edit_sidecar(saved[1], tmp_path, change)
    with pytest.raises(PipelineError) as info:
        pipeline(str(model))
    assert str(info.value).startswith(f"{model / 'model.meta.json'}: {key}")
    assert "\n" not in str(info.value)


def test_a_sidecar_edited_consistently_fails_on_its_first_run_in_one_line(saved, tmp_path):
    model = edit_sidecar(saved[1], tmp_path, memory_len_everywhere)
    pipe = pipeline(str(model))
    with pytest.raises(PipelineError) as info:
        pipe(["good movie"])
    message = str(info.value)
    assert "paddle.inference cannot run the export" in message and "\n" not in message
    assert f"does {model / 'model.meta.json'} still describe it?" in message


def test_an_export_whose_tokenizer_outgrows_its_vocabulary_is_refused(saved, tmp_path):
    model = copy_of(saved[1], tmp_path)
    with open(model / "vocab.txt", "a", encoding="utf-8") as f:
        f.write("extra\nwords\n")
    with pytest.raises(PipelineError, match=r"the tokenizer has 22 tokens but the export's "
                                            r"vocab_size is 20"):
        pipeline(str(model))


# -- names: unique, decided in input order, safe to write ---------------------------------------
def lines_of(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_strings_that_are_not_unicode_are_error_records_and_the_run_goes_on(saved, tmp_path,
                                                                           capsys):
    """A lone surrogate (JSON's "\\ud800") in an id or a field, or a file name that is not
    UTF-8, can never be written as UTF-8: the item is an error record with a name that can
    be, and --resume of the file goes on past it."""
    inputs = write_jsonl(tmp_path / "sur.jsonl", [
        {"id": "a", "text": "good"}, rb'{"id": "\ud800", "text": "bad"}',
        rb'{"id": "t", "text": "x \udcff y"}', rb'{"id": "q", "text": "x", "more": ["\ud83d"]}',
        {"id": "c", "text": "bad plot"}])
    preds = tmp_path / "preds.jsonl"
    assert predict.main([str(saved[0]), "--input", str(inputs), "--output", str(preds),
                         "--no-progress"]) == 0
    out = records(preds)
    assert out["#1"]["error"] == "'id' '\\ud800' is not valid Unicode (a lone surrogate)"
    assert out["t"]["error"] == "'text' holds a string that is not valid Unicode (a lone " \
                                "surrogate)"
    assert out["q"]["error"].startswith("'more[0]' holds a string that is not valid Unicode")
    assert "pred" in out["a"] and "pred" in out["c"] and len(out) == 5
    capsys.readouterr()
    # a directory holding a file whose name is not UTF-8 (bytes 0xff)
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_text("good movie")
    with open(os.path.join(os.fsencode(folder), b"b\xff.txt"), "wb") as f:
        f.write(b"bad plot")
    dir_preds = tmp_path / "dir.jsonl"
    out = predicted(saved[0], folder, dir_preds)
    assert out["#1"]["error"] == f"{folder}/b\\xff.txt: the file name is not UTF-8"
    assert "pred" in out["a.txt"]
    assert predict.main([str(saved[0]), "--input", str(folder), "--output", str(dir_preds),
                         "--no-progress", "--resume"]) == 0
    assert records(dir_preds) == out and len(lines_of(dir_preds)) == 2


def test_a_record_no_check_caught_is_still_written():
    """The writer's last line of defence: a record still holding a lone surrogate is written
    with JSON escapes; every other record as UTF-8 text, as before."""
    from ernie_doc.predict.records import record_line
    assert record_line({"doc_id": "é", "pred": "ü"}) == '{"doc_id": "é", "pred": "ü"}\n'
    line = record_line({"doc_id": "x\ud800", "probs": np.float32(0.5)})
    assert line.encode("utf-8") and json.loads(line) == {"doc_id": "x\ud800", "probs": 0.5}


DUPLICATES = [{"id": "a", "text": "good movie"}, {"id": "b", "text": "bad plot"},
              {"id": "a", "text": "again"}, "not json", {"id": "c", "text": "fine"},
              {"id": 1.5, "text": "bad id"}, {"id": "0", "text": "good"},
              {"text": "no id"}, {"id": "7", "text": "named 7"}]


def comparable(path):
    """The records of a predictions file, without the input path an error message names."""
    return sorted(json.dumps(dict(r, error=r["error"].rsplit(":", 1)[-1]) if "error" in r
                             else r, sort_keys=True) for r in lines_of(path))


def test_resume_gives_what_an_uninterrupted_run_gives(saved, tmp_path, capsys):
    """Records come out as documents finish, so a run stopped after any of them and resumed
    (with the input path typed another way) must name every item as the whole run did: the
    first item giving an id owns it, a repeat is "<id>#<index>", an item with no usable id
    "#<index>", and a position never takes an id given later (nor the reverse)."""
    inputs = write_jsonl(tmp_path / "dup.jsonl", DUPLICATES)
    full = tmp_path / "full.jsonl"
    assert predict.main([str(saved[0]), "--input", str(inputs), "--output", str(full),
                         "--no-progress"]) == 0
    out = records(full)
    assert sorted(out) == ["#3", "#5", "0", "7", "7#8", "a", "a#2", "b", "c"]
    assert out["a#2"]["error"] == "duplicate document id (first given by input item 1)"
    assert out["#5"]["error"] == "'id' must be a string or an integer, got float"
    assert "pred" in out["a"] and "pred" in out["0"] and "pred" in out["7#8"]
    lines = full.read_text(encoding="utf-8").splitlines(keepends=True)
    typed_otherwise = str(tmp_path / "." / "dup.jsonl")
    for n in range(1, len(lines)):
        part = tmp_path / f"part{n}.jsonl"
        part.write_text("".join(lines[:n]), encoding="utf-8")
        shutil.copy(f"{full}.meta.json", f"{part}.meta.json")
        assert predict.main([str(saved[0]), "--input", typed_otherwise, "--output", str(part),
                             "--no-progress", "--resume"]) == 0
        assert comparable(part) == comparable(full), n
    capsys.readouterr()


def test_a_position_never_takes_the_id_of_a_document(pipe):
    """The Python API alike: a document without an id (named by its position, "0") and one
    with a bad id do not leave a later document that gives "0" as a duplicate."""
    out = {r["doc_id"]: r for r in pipe(["good", {"id": "0", "text": "good movie"}])}
    assert sorted(out) == ["0", "0#1"] and all("pred" in r for r in out.values())
    out = {r["doc_id"]: r for r in pipe([{"id": 1.5, "text": "x"}, {"id": "0", "text": "y"}])}
    assert "error" in out["#0"] and "pred" in out["0"]


def test_a_bare_string_is_one_document(pipe):
    got = list(pipe.stream("some text"))
    assert [r["doc_id"] for r in got] == ["0"] and "pred" in got[0]
    assert [r["doc_id"] for r in pipe({"id": "q", "text": "good"})] == ["q"]


# -- input files ---------------------------------------------------------------------------------
def test_a_directory_input_reports_every_entry_it_cannot_read(pipe, tmp_path):
    """A FIFO, a link to a device, a link loop and a folder are error records (never read,
    never blocking), counted by count_inputs as read_inputs yields them; a file that is not
    a .txt is not a document."""
    from ernie_doc.predict.documents import count_inputs
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_text("good movie")
    (folder / "notes.md").write_text("not a document")
    os.mkfifo(folder / "fifo.txt")
    os.symlink("/dev/zero", folder / "zero.txt")
    os.symlink("loop.txt", folder / "loop.txt")
    (folder / "more").mkdir()
    items = list(read_inputs(str(folder)))
    assert count_inputs(str(folder)) == len(items) == 5
    out = {r["doc_id"]: r for r in pipe(items)}
    assert "pred" in out["a.txt"]
    assert out["fifo.txt"]["error"] == f"{folder}/fifo.txt: input document is a FIFO, not a " \
                                       f"regular file"
    assert "is a character device" in out["zero.txt"]["error"]
    assert "unreadable (Too many levels of symbolic links)" in out["loop.txt"]["error"]
    assert out["more"]["error"].endswith("a folder (only the .txt files directly in the input "
                                         "folder are read)")


def test_counting_the_input_never_blocks_on_a_fifo(tmp_path):
    """--input checked as a file, then swapped for a FIFO: the count opens it as every read
    does (non-blocking, checked on the open descriptor)."""
    import signal

    from ernie_doc.predict.documents import count_inputs
    fifo = tmp_path / "in.jsonl"
    os.mkfifo(fifo)

    def stop(*_):
        raise TimeoutError("count_inputs blocked on a FIFO")
    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, 5)
    try:
        with pytest.raises(PipelineError, match=r"in.jsonl: --input is a FIFO, not a regular "
                                                r"file"):
            count_inputs(str(fifo))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_tsv_header_naming_a_column_twice_is_one_line(saved, tmp_path, capsys):
    inputs = tmp_path / "in.tsv"
    inputs.write_text("id\ttext\tid\nq1\tgood movie\tq2\n")
    preds = tmp_path / "p.jsonl"
    exits(2, lambda: predict.main([str(saved[0]), "--input", str(inputs), "--output",
                                   str(preds), "--no-progress"]))
    one_error_line(capsys, f"{inputs}:1: the header names column 'id' twice")
    assert not preds.exists()


# what each input without documents is, and the end of its one line
NO_DOCUMENTS = {
    "in.tsv": (b"", "the file is empty"),
    "in.jsonl": (b"", "the file is empty"),
    "header.tsv": (b"\xef\xbb\xbfid\ttext\r\n\r\n  \n", "the file holds only a header row"),
    "blank.jsonl": (b"\n \t\n\r\n", "the file holds only blank lines"),
    "docs": (None, "the folder holds no .txt files"),
    "-": (b"", "standard input is empty (or holds only blank lines)"),
    "-tsv": (b"id\ttext\n", "standard input is empty (or holds only a header row and blank "
                            "lines)"),
}


def no_documents_input(tmp_path, monkeypatch, name):
    """NO_DOCUMENTS[name] as predict's arguments (standard input set for `-`)."""
    data, _ = NO_DOCUMENTS[name]
    if name.startswith("-"):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
        return ["-"] + (["--format", "tsv"] if name == "-tsv" else [])
    path = tmp_path / "in" / name
    path.parent.mkdir(exist_ok=True)
    if data is None:
        path.mkdir()
        (path / "notes.md").write_text("not a document")   # not read: no document
    else:
        path.write_bytes(data)
    return [str(path)]


@pytest.mark.parametrize("name", sorted(NO_DOCUMENTS))
def test_an_input_without_documents_is_one_line_and_writes_nothing(saved, tmp_path, capsys,
                                                                   monkeypatch, name):
    """An empty file or folder, a TSV with only its header, blank lines, empty standard input:
    one line naming the input and why, exit 2, no predictions file and no sidecar;
    --allow-empty writes the empty output (and its sidecar) and exits 0."""
    given = no_documents_input(tmp_path, monkeypatch, name)
    out = tmp_path / "out"
    out.mkdir()
    argv = [str(saved[0]), "--input", *given, "--output", str(out / "p.jsonl"), "--no-progress"]
    exits(2, lambda: predict.main(argv))
    one_error_line(capsys, f"error: --input {given[0]}: no documents: {NO_DOCUMENTS[name][1]} "
                           f"(--allow-empty writes an empty --output instead)")
    assert os.listdir(out) == []
    if name.startswith("-"):   # standard input was read: give it again
        no_documents_input(tmp_path, monkeypatch, name)
    assert predict.main(argv + ["--allow-empty"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["documents"] == 0
    assert sorted(os.listdir(out)) == ["p.jsonl", "p.jsonl.meta.json"]
    assert (out / "p.jsonl").read_bytes() == b""


def test_an_empty_input_leaves_the_output_it_would_replace_or_resume(saved, tmp_path, capsys):
    """--overwrite and --resume onto an input now empty: refused before anything is touched
    (the cut-short last line --resume would repair stays); --allow-empty --resume: nothing
    to add, exit 0."""
    inputs = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "text": "good movie"},
                                                 {"id": "b", "text": "bad plot"}])
    preds = tmp_path / "p.jsonl"
    assert predict.main([str(saved[0]), "--input", str(inputs), "--output", str(preds),
                         "--no-progress"]) == 0
    with open(preds, "ab") as f:
        f.write(b'{"doc_id": "c", "pr')   # an interrupted run's last line
    before = {p: p.read_bytes() for p in (preds, tmp_path / "p.jsonl.meta.json")}
    inputs.write_bytes(b"")
    capsys.readouterr()
    for option in ("--overwrite", "--resume"):
        exits(2, lambda: predict.main([str(saved[0]), "--input", str(inputs), "--output",
                                       str(preds), option, "--no-progress"]))
        one_error_line(capsys, f"--input {inputs}: no documents: the file is empty")
        assert {p: p.read_bytes() for p in before} == before
    assert predict.main([str(saved[0]), "--input", str(inputs), "--output", str(preds),
                         "--resume", "--allow-empty", "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (summary["documents"], summary["skipped"]) == (0, 2)


def test_a_task_split_without_documents_is_one_line(saved, tmp_path, capsys, monkeypatch):
    """--format task: the task's reader refuses a file without examples itself (imdb's line);
    a reader that read none would meet the same rule as a file (--allow-empty included)."""
    import ernie_doc.predict.pipeline as pipeline_module
    data = tmp_path / "imdb"
    data.mkdir()
    (data / "test.txt").write_text("qid\tlabel\tscore\ttext_a\n")
    out = tmp_path / "out"
    out.mkdir()
    argv = [str(saved[0]), "--format", "task", "--output", str(out / "p.jsonl"), "--no-progress"]
    exits(2, lambda: predict.main(argv + ["--input", str(data / "test.txt")]))
    one_error_line(capsys, f"error: {data / 'test.txt'}: no examples")
    monkeypatch.setattr(pipeline_module, "task_documents", lambda *args: [])
    exits(2, lambda: predict.main(argv + ["--input", str(data)]))
    one_error_line(capsys, f"error: --input {data}: no documents: the imdb reader read none "
                           f"(split test) (--allow-empty writes an empty --output instead)")
    assert os.listdir(out) == []
    assert predict.main(argv + ["--input", str(data), "--allow-empty"]) == 0
    assert (out / "p.jsonl").read_bytes() == b""


def test_an_empty_txt_file_is_one_empty_document(saved, tmp_path, capsys, monkeypatch):
    """A .txt input (and standard input read as txt) is one document, whatever it holds: an
    empty one is an empty document, an error record (as `{"text": ""}` on a JSON line), not
    an input without documents. Its run predicted nothing: exit 1 with one line naming the
    output, which keeps the record (it exited 0, as if it had done its job)."""
    (tmp_path / "empty.txt").write_bytes(b"")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"")))
    for given, name in (([str(tmp_path / "empty.txt")], "empty.txt"),
                        (["-", "--format", "txt"], "stdin")):
        preds = tmp_path / f"{name}.jsonl"
        exits(1, lambda: predict.main([str(saved[0]), "--input", *given, "--output",
                                       str(preds), "--no-progress"]))
        summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert (summary["documents"], summary["errors"]) == (0, 1)
        assert [(r["doc_id"], r["error"]) for r in read_jsonl(preds)] == [(name, "empty text")]


def test_a_run_that_predicts_nothing_exits_1_and_keeps_its_error_records(saved, tmp_path,
                                                                         capsys):
    """Every document an error record (a folder of empty .txt files, JSON lines without
    text): one line naming the output, how many records and the first reason, exit 1; the
    records stay (the reasons are the useful part), --allow-empty included, and --output -
    says standard output. One prediction among errors is a run that did its job: exit 0, as
    a --resume whose earlier records hold a prediction; a --resume onto error records alone
    is the same failed run."""
    folder = tmp_path / "docs"
    folder.mkdir()
    for name in ("a.txt", "b.txt"):
        (folder / name).write_bytes(b"")
    preds = tmp_path / "p.jsonl"
    argv = [str(saved[0]), "--input", str(folder), "--output", str(preds), "--no-progress"]
    line = (f"error: no document could be predicted: {preds} holds 2 error records and no "
            f"prediction (the first, document 'a.txt': empty text)")
    for extra in ([], ["--overwrite", "--allow-empty"]):
        exits(1, lambda: predict.main(argv + extra))
        assert one_error_line(capsys, line) == line
        assert [r["error"] for r in read_jsonl(preds)] == ["empty text", "empty text"]
    assert sorted(os.listdir(tmp_path)) == ["docs", "p.jsonl", "p.jsonl.meta.json"]
    exits(1, lambda: predict.main(argv[:-3] + ["--output", "-", "--no-progress"]))
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == line.replace(str(preds), "standard output")
    (folder / "c.txt").write_text("good movie")
    assert predict.main(argv + ["--overwrite"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (summary["documents"], summary["errors"]) == (1, 2)
    # --resume: the records kept decide with this run's
    inputs = write_jsonl(tmp_path / "in.jsonl", [{"id": "x", "text": "good"},
                                                 {"id": "y", "title": "no text"}])
    part = tmp_path / "part.jsonl"
    resume = [str(saved[0]), "--input", str(inputs), "--output", str(part), "--no-progress"]
    assert predict.main(resume) == 0
    lines = {json.loads(line)["doc_id"]: line for line in part.read_text().splitlines()}
    part.write_text(lines["x"] + "\n")   # x, predicted: y is left to --resume
    assert predict.main(resume + ["--resume"]) == 0
    assert [("error" in r) for r in read_jsonl(part)] == [False, True]
    part.write_text(lines["y"] + "\n" + lines["y"].replace('"y"', '"x"') + "\n")   # errors
    capsys.readouterr()
    exits(1, lambda: predict.main(resume + ["--resume"]))
    one_error_line(capsys, f"error: no document could be predicted: {part} holds 2 error "
                           f"records and no prediction")


def test_python_reads_an_empty_input_as_no_documents(pipe, tmp_path):
    """The Python door: read_inputs of an input without documents yields none (as an empty
    list given to a pipeline returns none); only the command refuses it."""
    for data, name in ((b"", "a.tsv"), (b"id\ttext\n", "b.tsv"), (b"\n\n", "c.jsonl")):
        (tmp_path / name).write_bytes(data)
        assert list(read_inputs(str(tmp_path / name))) == []
    assert pipe([]) == [] and list(pipe.stream([])) == []


COUNTED = [
    ("rows.tsv", b"id\ttext\nq1\tgood\nq2\tbad\nq3\tfine\n", 3),        # was 4: the header
    ("crlf.tsv", b"\xef\xbb\xbf\r\nid\ttext\r\nq1\tgood\r\n\r\nq2\tbad", 2),   # was 4
    ("short.tsv", b"id\ttext\nq1\tgood\nq2\n", 2),      # a row of too few columns: an item
    ("lines.jsonl", b'{"text": "a"}\n\n  \n{"text": "b"}\n{"text": "c"}', 3),   # was 4
    ("bytes.jsonl", b'{"text": "a"}\n\xff\n\xe3\x80\x80\n', 2),   # not UTF-8: an item; U+3000
]


@pytest.mark.parametrize("name, data, items", COUNTED, ids=[case[0] for case in COUNTED])
def test_the_progress_total_counts_documents(tmp_path, name, data, items):
    """count_inputs (the progress bar's total) is the number of items read_inputs yields: not
    a TSV's header row, not blank lines (Unicode spaces too), the last line without its
    newline."""
    from ernie_doc.predict.documents import count_inputs
    path = tmp_path / name
    path.write_bytes(data)
    assert count_inputs(str(path)) == len(list(read_inputs(str(path)))) == items


def test_inputs_are_read_in_bounded_memory(tmp_path):
    """A 320 MiB JSON line, a .txt entry linking to a 320 MiB file and a 320 MiB task.json
    (sparse files) under an address-space limit 256 MiB above what the process maps: each
    is refused by its size (MAX_ITEM_BYTES, MAX_TASK_FILE_BYTES), never read whole, and the
    items around them are read."""
    big = 320 << 20
    lines = tmp_path / "big.jsonl"
    lines.write_bytes(b'{"id": "a", "text": "good"}\n')
    os.truncate(lines, 28 + big)
    with open(lines, "ab") as f:
        f.write(b'\n{"id": "b", "text": "bad"}\n')
    huge = tmp_path / "huge.bin"
    huge.touch()
    os.truncate(huge, big)
    folder = tmp_path / "docs"
    folder.mkdir()
    os.symlink(huge, folder / "a.txt")
    (folder / "b.txt").write_text("fine")
    model = tmp_path / "model"
    model.mkdir()
    os.symlink(huge, model / "task.json")
    script = f"""
import json, resource
from ernie_doc.predict import documents as io
from ernie_doc.predict.model_folder import read_task_record
from ernie_doc.resources import _status_bytes
resource.setrlimit(resource.RLIMIT_AS, (_status_bytes("VmSize") + (256 << 20),) * 2)
def show(items):
    return [i.message if isinstance(i, io.InputProblem) else i for i in items]
out = {{}}
for name, call in (("line", lambda: show(io.read_inputs({str(lines)!r}))),
                   ("count", lambda: io.count_inputs({str(lines)!r})),
                   ("txt", lambda: show(io.read_inputs({str(folder)!r}))),
                   ("task", lambda: read_task_record({str(model)!r}))):
    try:
        out[name] = call()
    except BaseException as e:
        out[name] = type(e).__name__ + ": " + str(e)
print(json.dumps(out))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    over = "over the 64 MiB one document may hold"
    assert out["line"][0] == {"id": "a", "text": "good"} and out["line"][2] == \
        {"id": "b", "text": "bad"}
    assert out["line"][1] == f"{lines}:2: a line longer than the 64 MiB one document may " \
                             f"hold (not read)"
    assert out["count"] == 3
    assert out["txt"][0] == f"{folder}/a.txt: {big:,} bytes, {over}"
    assert out["txt"][1] == {"id": "b.txt", "text": "fine"}
    assert out["task"] == f"PipelineError: {model}/task.json: over 16 MiB; a task.json " \
                          f"holds a task, its kind, labels and config"


# -- the model folder: sizes bounded before anything is allocated -------------------------------
def test_available_memory_respects_the_process_limit():
    """`ulimit -v` (RLIMIT_AS) and RLIMIT_DATA bound what the estimate may promise: what the
    limit leaves beyond the process's mappings, not the machine's free memory."""
    script = """
import resource
from ernie_doc.resources import _status_bytes, available_memory
used = _status_bytes("VmSize")
resource.setrlimit(resource.RLIMIT_AS, (used + (300 << 20), resource.RLIM_INFINITY))
print(used, available_memory("cpu"))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    used, free = map(int, proc.stdout.split())
    assert 250 << 20 < free <= 300 << 20


def test_absurd_layer_counts_are_refused_under_a_memory_limit(saved, tmp_path):
    """Under a 4 GB address-space limit: an export whose sidecar claims 10**6 layers (its
    config, memory_shape and memories input agreeing) against a parameters file of one, and
    a task.json asking for 10**6 layers of a tiny hidden size (14 GiB of weights, and some
    120 GiB of layer objects and minutes of building): each is one line, exit 2."""
    def million(meta):
        meta["config"]["num_hidden_layers"] = meta["memory_shape"][0] = 10 ** 6
        for spec in meta["inputs"] + meta["outputs"]:
            if spec["name"] == "memories":
                spec["shape"][0] = 10 ** 6
    export = edit_sidecar(saved[1], tmp_path, million)
    model = shutil.copytree(saved[0] / "best", tmp_path / "deep")
    task = json.loads((model / "task.json").read_text())
    task["config"].setdefault("model_overrides", {})["num_hidden_layers"] = 10 ** 6
    (model / "task.json").write_text(json.dumps(task))
    inputs = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "text": "good movie"}])
    script = f"""
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (4_000_000_000, resource.RLIM_INFINITY))
from ernie_doc.cli.predict import command
for i, model in enumerate(({str(export)!r}, {str(model)!r})):
    try:
        command([model, "--input", {str(inputs)!r}, "--output", f"{tmp_path}/o{{i}}.jsonl",
                 "--no-progress"])
    except SystemExit as e:
        print("exit", e.code, flush=True)
        print("--", file=sys.stderr, flush=True)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=90, cwd=ROOT)
    assert proc.stdout.count("exit 2") == 2, proc.stderr[-3000:]
    first, second = [[line for line in part.splitlines() if line.strip()]
                     for part in proc.stderr.split("--\n")[:2]]
    assert first == [f"error: {export}/model.meta.json: config.num_hidden_layers 1000000 "
                     f"disagrees with model.pdiparams (it holds 1 layers) (was the sidecar "
                     f"edited? export again)"]
    assert len(second) == 1 and second[0].startswith(f"error: {model}/task.json: ") and \
        "layer objects" in second[0] and "but the memory available is" in second[0]
    assert not (tmp_path / "o0.jsonl").exists() and not (tmp_path / "o1.jsonl").exists()


def test_a_sidecar_format_version_of_true_is_refused(saved, tmp_path):
    model = edit_sidecar(saved[1], tmp_path, lambda m: m.update(format_version=True))
    with pytest.raises(PipelineError, match=r"model.meta.json: unsupported export format True"):
        pipeline(str(model))


def test_task_json_kind_must_be_the_kind_its_config_builds(saved, tmp_path):
    model = copy_of(saved[0] / "best", tmp_path)
    record = json.loads((model / "task.json").read_text())
    record["kind"] = "span"
    (model / "task.json").write_text(json.dumps(record))
    with pytest.raises(PipelineError) as info:
        pipeline(str(model))
    assert str(info.value) == f"{model / 'task.json'}: 'kind' 'span' disagrees with " \
                              f"config.kind 'classification'"


def test_the_load_report_is_printed_once(saved, tmp_path, capsys, monkeypatch):
    """As in a fresh `ernie-doc predict` process: the run logger has no handler of its own
    (a fine-tuning run earlier in this process gave it one)."""
    from ernie_doc.training.runlog import logger
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(logger, "propagate", True)
    inputs = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "text": "good"}])
    assert predict.command([str(saved[0]), "--input", str(inputs), "--output",
                            str(tmp_path / "p.jsonl"), "--no-progress"]) == 0
    assert capsys.readouterr().out.count("loaded 36 tensors") == 1
