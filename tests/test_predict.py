"""ernie-doc predict and ernie_doc.predict.pipeline: a fine-tuned run's model on new documents.

The models are tiny runs of the tasks (what their run.sh runs, in-process) on fixtures in the
official formats; the predictions must equal, field for field, what the trainer's evaluation
(eval_only's code) wrote for the same documents."""
import itertools
import json
import os
import shutil

import numpy as np
import pytest
from helpers import in_process
from test_span_tasks import HANZI as ZH
from test_span_tasks import SPAN_COMMON, c3_data, cail_data, squad_json, zh_questions
from test_tasks import WORDS, finetune_task, imdb_tsv, vocab_dir

from ernie_doc.errors import PipelineError
from ernie_doc.kinds.base import load_reader
from ernie_doc.predict.inputs import completed_ids, model_directory, provenance
from ernie_doc.predict.pipeline import Pipeline, pipeline, read_inputs


def predict_cli(*args, expect=0):
    """tools/predict.py, in this process."""
    from tools.predict import command
    return in_process(command, [str(a) for a in args] + ["--no-progress"], expect)


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


def test_span_predict_equals_evaluation(tmp_path):
    data = tmp_path / "cmrc2018"
    data.mkdir()
    squad_json(data / "cmrc2018_train.json", zh_questions(12, 0))
    squad_json(data / "cmrc2018_dev.json", zh_questions(6, 1))
    out = tmp_path / "out"
    finetune_task("cmrc2018", data, out, vocab_dir(tmp_path / "vocab", ZH), *SPAN_COMMON)
    docs = load_reader("cmrc2018").read(str(data), "dev", {})
    # the fields a user sends: question and context (no answers)
    inputs = [{"id": d.doc_id, "question": d.fields["question"],
               "context": d.fields["context"]} for d in docs]
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
                  "batch_size=8", "max_seq_len=32", "model_overrides.max_position_embeddings=32")
    # task.json holds every task option as the run resolved it, defaults included, so a
    # later change of a default does not change how this model reads
    from ernie_doc.kinds.choice import MultipleChoiceTask
    saved = json.loads((out / "best" / "task.json").read_text())["config"]["task_options"]
    assert saved == MultipleChoiceTask.option_defaults
    docs = load_reader("c3").read(str(data), "dev", {})
    inputs = [{"id": d.doc_id, "context": d.fields["context"], "question": d.fields["question"],
               "choices": d.fields["choices"]} for d in docs]
    records = Pipeline.from_pretrained(str(out))(inputs)
    assert_same_predictions(read_jsonl(out / "predictions_dev.jsonl"), records)
    for r, d in zip(records, docs):
        assert len(r["probs"]) == len(d.fields["choices"])
    with pytest.raises(PipelineError, match="batch size 6 must be a positive multiple of 4"):
        Pipeline.from_pretrained(str(out), batch_size=6)


def test_pair_matching_and_keyphrase_predict_equal_evaluation(tmp_path):
    data = cail_data(tmp_path, (("train", 8), ("valid", 5), ("test", 2)))
    out = tmp_path / "cail-out"
    finetune_task("cail2019_scm", data, out, vocab_dir(tmp_path / "zh", ZH), "stride=4",
                  "batch_size=4")
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
        assert e["end_to_end_over_forward"] == pytest.approx(e["model_seconds"] / e["seconds"],
                                                              abs=0.02)   # rounded times
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


def test_model_directory_errors(tmp_path, imdb_run):
    _, out = imdb_run
    with pytest.raises(PipelineError, match="no task.json here or in best/ or final/"):
        Pipeline.from_pretrained(str(tmp_path))
    proc = predict_cli(tmp_path, "--input", tmp_path / "none.jsonl", "--output",
                       tmp_path / "p.jsonl", expect=2)
    assert "none.jsonl: no such file or directory" in proc.stderr
