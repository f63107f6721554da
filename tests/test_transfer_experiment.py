"""tools/transfer_experiment.py: the pretraining corpus holds no dev or test document (by id
and by text), the table's numbers, and the whole command on tiny synthetic datasets, run twice
(the second run finds every step finished)."""
import json
import os
import random
import sys

import pytest
from helpers import in_process, write
from test_readers import articles_xml, truth_xml

from tools import transfer_experiment as tx

WORDS = [f"w{i}" for i in range(60)] + ["good", "bad", "film", "the", "a", "story"]


def text(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def datasets(root):
    """imdb/ (40 reviews, one text under five ids) and hyperpartisan/ (12 articles; id 3 is in
    train and test, article 8 has article 10's text, article 7 is article 12 nearly), and two
    WikiText articles."""
    rng = random.Random(0)
    same = text(rng, 30)
    rows = [f"{i}\t{i % 2}\t0\t{same if i < 5 else text(rng, rng.randint(20, 60))}"
            for i in range(40)]
    bodies = {i: text(rng, rng.randint(10, 30)) for i in range(1, 13)}
    bodies[8] = bodies[10]
    # article 7: test article 12 again, a word changed and a site's boilerplate added
    bodies[7] = bodies[12].replace(bodies[12].split()[4], "changed", 1) + \
        " subscribe to our newsletter for the top stories every morning"
    wiki = "".join(f" = Title {k} = \n\n {text(rng, 50)} \n\n" for k in range(2))
    write(root, {
        "imdb/imdb_test_sample5k.tsv": "qid\tlabel\tscore\ttext_a\n" + "\n".join(rows) + "\n",
        "hyperpartisan/articles-x.xml": articles_xml(
            [(f"{i:07d}", f"<p>{b}</p>") for i, b in bodies.items()]),
        "hyperpartisan/ground-truth-x.xml": truth_xml(
            [(f"{i:07d}", "true" if i % 3 else "false") for i in bodies]),
        "hyperpartisan/hp-splits.json": json.dumps(
            {"train": list(range(1, 9)), "dev": [9, 10], "test": [3, 11, 12]}),
        "wikitext103/wiki.valid.tokens": wiki, "wikitext103/wiki.test.tokens": wiki,
    })
    return root


def corpus_ids(out):
    ids = []
    for part in ("train", "heldout"):
        with open(os.path.join(out, "corpus", f"{part}.jsonl"), encoding="utf-8") as f:
            ids += [json.loads(line)["id"] for line in f]
    return ids


def test_the_corpus_holds_no_dev_or_test_document(tmp_path):
    data = datasets(tmp_path / "data")
    manifest = tx.build_corpus(str(data), str(tmp_path / "out"))
    splits = tx.task_documents(str(data))
    dev_imdb = {d.doc_id for d in splits["imdb"]["dev"]}
    shared = {"0", "1", "2", "3", "4"}
    assert dev_imdb & shared and shared - dev_imdb   # the shared text is on both sides
    ids = corpus_ids(tmp_path / "out")
    # Hyperpartisan: 3 (also a test id), 8 (a dev article's text) and 7 (a test article's text
    # nearly) are left out
    assert sorted(i for i in ids if i.startswith("hyp/")) == \
        [f"hyp/{i:07d}" for i in (1, 2, 4, 5, 6)]
    assert manifest["left_out"]["hyp"] == {"id in a dev/test split": ["0000003"],
                                           "text in a dev/test split": ["0000008"],
                                           "near-duplicate of a dev/test text": [
                                               "0000007 (hyp/0000012, 0.74 of 8-grams)"]}
    # IMDB: the train reviews, except those sharing the text of a dev review (0-4 share one)
    train_imdb = [d.doc_id for d in splits["imdb"]["train"]]
    assert sorted(i for i in ids if i.startswith("imdb/")) == \
        sorted(f"imdb/{i}" for i in train_imdb if int(i) >= 5)
    assert sorted(manifest["left_out"]["imdb"]["text in a dev/test split"]) == \
        sorted(i for i in train_imdb if int(i) < 5)
    # WikiText: each article once (the test file repeats the validation one)
    assert sorted(i.split(":")[0] for i in ids if i.startswith("wikitext103/")) == \
        ["wikitext103/wiki.valid.tokens"] * 2
    assert manifest["checked_against_dev_and_test"] == len(ids) == sum(
        manifest["documents"].values())


def test_a_dev_document_in_the_corpus_is_refused(tmp_path):
    data = datasets(tmp_path / "data")
    tx.build_corpus(str(data), str(tmp_path / "out"))
    splits = tx.task_documents(str(data))
    path = tmp_path / "out" / "corpus" / "train.jsonl"
    good = path.read_text()
    leak = splits["hyp"]["test"][1]
    words = leak.text.split()
    near = " ".join(words[:-1] + ["changed", "read", "more"])
    for record, by in ((dict(id=f"hyp/{leak.doc_id}", text="new words"), "id in"),
                       (dict(id="imdb/999", text=" " + leak.text.upper()), "text in"),
                       (dict(id="imdb/998", text=near),
                        f"near-duplicate of a dev/test text: hyp/{leak.doc_id}, 0.")):
        path.write_text(good + json.dumps(record) + "\n")
        with pytest.raises(ValueError, match=rf"train.jsonl: {record['id']} is a dev or test "
                                             rf"document \({by}"):
            tx.check_corpus([str(path)], tx.HeldOut(splits))


def summary(best, last, test=None):
    return {"best_dev": best, "last_dev": last, "test": test or {}}


def test_the_table_gives_every_seed_and_the_mean_and_sd(tmp_path, monkeypatch):
    for seed, (best, f1) in {1: (0.70, 0.60), 2: (0.80, 0.80)}.items():
        run = tmp_path / "imdb" / f"mlm-s{seed}"
        write(run, {"eval_results.json": json.dumps({"accuracy": best, "f1": f1, "step": 9}),
                    "eval_history.jsonl": json.dumps({"split": "dev", "accuracy": 0.1, "step": 4})
                    + "\n" + json.dumps({"split": "dev", "accuracy": best, "step": 9}) + "\n"})
    table = tx.finetune_table(str(tmp_path), {"imdb": [1, 2, 3]})
    row = table["imdb"]["mlm"]
    assert sorted(row["seeds"]) == [1, 2]   # seed 3 has not run: left out, not a zero
    assert row["dev accuracy"] == pytest.approx([0.75, 0.0707107], rel=1e-5)
    assert row["dev F1"] == pytest.approx([0.70, 0.1414214], rel=1e-5)
    assert table["imdb"]["scratch"] == {"seeds": {}}
    text = tx.markdown({}, table)
    assert "| mlm | 0.750 ± 0.071 | 0.700 ± 0.141 | s1 0.700, s2 0.800 |" in text
    assert "| scratch | – | – | – |" in text and "same label" not in text
    # a kept model that gave every dev document one label is starred: its score is a guess's
    pred = [{"doc_id": str(i), "pred": "1", "label": str(i % 2)} for i in range(3)]
    write(tmp_path / "imdb" / "mlm-s2", {"predictions_dev.jsonl": "".join(
        json.dumps(p) + "\n" for p in pred)})
    text = tx.markdown({}, tx.finetune_table(str(tmp_path), {"imdb": [1, 2, 3]}))
    assert "| s1 0.700, s2 0.800\\* |" in text and text.endswith(
        "| mlm_sro | – | – | – |\n\n\\* the kept model gave every dev document the same label\n")
    write(tmp_path / "imdb" / "mlm-s1", {"predictions_dev.jsonl": "".join(
        json.dumps(dict(p, pred=p["label"])) + "\n" for p in pred)})   # both labels: no star
    assert "| s1 0.700, s2 0.800\\* |" in tx.markdown({}, tx.finetune_table(str(tmp_path),
                                                                          {"imdb": [1, 2]}))
    # one seed: its value, and no standard deviation (not a zero one)
    table = tx.finetune_table(str(tmp_path), {"imdb": [2]})
    assert table["imdb"]["mlm"]["dev accuracy"] == pytest.approx([0.80, None])
    assert "| mlm | 0.800 (one seed) | 0.800 (one seed) | s2 0.800\\* |" in tx.markdown({}, table)
    # Hyperpartisan keeps its best dev epoch and shows its last one beside it
    write(tmp_path / "hyp" / "mlm-s1", {
        "eval_results.json": json.dumps({"f1": 0.9, "step": 4}),
        "eval_history.jsonl": json.dumps({"split": "dev", "f1": 0.9, "step": 4}) + "\n"
        + json.dumps({"split": "test", "f1": 0.1, "step": 8}) + "\n"
        + json.dumps({"split": "dev", "f1": 0.5, "step": 8}) + "\n"})
    hyp = tx.finetune_table(str(tmp_path), {"hyp": [1]})["hyp"]["mlm"]
    assert (hyp["dev F1 (best)"], hyp["dev F1 (last)"]) == ([0.9, None], [0.5, None])
    # no pretraining run yet: a row of zeros, not a traceback
    assert tx.pretrain_summary(str(tmp_path))["mlm"] == {"steps": 0, "positions": 0,
                                                         "seconds": None, "heldout": {}}
    # without matplotlib: the table, and a line instead of the curves
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    args = tx.parse_args(["--data", "-", "--output-dir", str(tmp_path), "--tasks", "imdb",
                          "--imdb-seeds", "1", "2"])
    assert tx.write_table(args).endswith("not drawn: matplotlib is not installed)\n")
    assert "| mlm | 0.750 ± 0.071 |" in (tmp_path / "transfer_results.md").read_text()


def test_the_whole_experiment_on_tiny_data(tmp_path, capfd):
    data, out = datasets(tmp_path / "data"), tmp_path / "out"
    argv = ["--data", str(data), "--output-dir", str(out), "--tasks", "hyp",
            "--hyp-seeds", "1", "--vocab-size", "40",
            "--pretrain-set", "max_steps=3", "batch_size=2", "max_seq_len=16",
            "model_overrides.num_hidden_layers=1", "model_overrides.hidden_size=16",
            "model_overrides.num_attention_heads=1", "model_overrides.memory_len=8",
            "reader.eval_docs=2", "warmup_steps=0", "eval_steps=0", "logging_steps=1",
            "--finetune-set", "epochs=1", "batch_size=4", "max_seq_len=32", "logging_steps=1"]
    assert tx.main(argv) == 0
    first = capfd.readouterr().out
    results = json.loads((out / "transfer_results.json").read_text())
    assert sorted(results["pretraining"]) == ["mlm", "mlm_sro"]
    assert results["pretraining"]["mlm_sro"]["steps"] == 3
    assert results["pretraining"]["mlm_sro"]["positions"] == 3 * 2 * 16
    # MLM only reads every document whole: one chunk, and no reordering loss
    mlm_cfg = (out / "pretrain" / "mlm" / "run_config.yaml").read_text()
    assert "max_chunks: 1" in mlm_cfg and "reorder_weight: 0" in mlm_cfg
    # its reordering head was never trained: no reorder accuracy is reported for it
    assert "mlm_accuracy" in results["pretraining"]["mlm"]["heldout"]
    assert not any(k.startswith("reorder") for k in results["pretraining"]["mlm"]["heldout"])
    assert "reorder_accuracy" in results["pretraining"]["mlm_sro"]["heldout"]
    rows = results["finetuning"]["hyp"]
    assert sorted(rows) == ["mlm", "mlm_sro", "scratch"]
    for start in tx.STARTS:
        assert set(rows[start]["seeds"]["1"]["test"]) >= {"f1", "accuracy"}, start
    # scratch has the pretrained model's shape and new weights; the others load the encoder
    assert "/pretrain/mlm_sro/final/model.safetensors" not in \
        (out / "hyp" / "scratch-s1.log").read_text()
    for start in ("mlm", "mlm_sro"):
        log = (out / "hyp" / f"{start}-s1.log").read_text()
        assert f"pretrain/{start}/final/model.safetensors" in log and "missing 2 " in log
    assert (out / "transfer_curves.png").stat().st_size > 1000
    # the best start's model is a self-contained directory: predict runs on it as it is
    model = results["models"]["hyp"]["model"]
    assert model.startswith(str(out / "hyp")) and model.endswith("-s1/best")
    from ernie_doc.cli.predict import command as predict
    write(tmp_path, {"docs/a.txt": "w1 w2 good film", "docs/b.txt": "bad story w3"})
    in_process(predict, [model, "--input", str(tmp_path / "docs"), "--output",
                         str(tmp_path / "p.jsonl"), "--no-progress"])
    assert [json.loads(line)["doc_id"] for line in open(tmp_path / "p.jsonl")] == \
        ["a.txt", "b.txt"]
    assert "| hyp | dev F1 (best), mean ± sd |" in first
    # a second run finds every run finished: nothing is trained again
    assert tx.main(argv) == 0
    second = capfd.readouterr().out
    assert second.count("not run again") == 5 and "started" not in second


def test_bad_data_or_overrides_are_one_line_and_exit_2(tmp_path, capsys):
    from ernie_doc.cli import run_command  # what the script's __main__ runs
    data, out = datasets(tmp_path / "data"), str(tmp_path / "out")
    (data / "hyperpartisan" / "hp-splits.json").unlink()
    cases = [
        (["--data", str(tmp_path / "none")], f"{tmp_path / 'none' / 'imdb'}: data directory "
                                             f"does not exist"),
        (["--data", str(data)], f"{data / 'hyperpartisan'}: no hp-splits.json"),
        # the corpus was checked against these splits: fine-tuning may not change them
        (["--data", str(data), "--finetune-set", "reader.dev_ratio=0.3"],
         "--finetune-set reader.dev_ratio=0.3: reader.dev_ratio is set by the experiment"),
        (["--data", str(data), "--pretrain-set", "max_step=3"], "unknown key 'max_step'"),
        (["--data", str(data), "--finetune-set", "epochs=abc"], "epochs: must be a positive"),
    ]
    for argv, message in cases:
        assert run_command(tx.main, argv + ["--output-dir", out, "--steps", "corpus"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err


def test_a_tokenizer_of_another_vocabulary_size_is_refused(tmp_path):
    import sentencepiece

    from ernie_doc.errors import ConfigError
    out = tmp_path / "out"
    tx.build_corpus(str(datasets(tmp_path / "data")), str(out))
    (out / "tokenizer").mkdir()
    sentencepiece.SentencePieceTrainer.train(
        input=str(out / "corpus" / "tokenizer.txt"), model_prefix=str(out / "tokenizer" / "spm"),
        vocab_size=40, minloglevel=2)
    tx.train_tokenizer(str(out), 40)   # the same size: kept, nothing run
    with pytest.raises(ConfigError, match=r"spm.model: has 40 pieces, not --vocab-size 41"):
        tx.train_tokenizer(str(out), 41)


def test_the_corpus_does_not_change_under_the_runs_made_from_it(tmp_path):
    from ernie_doc.errors import DataError
    data, out = datasets(tmp_path / "data"), tmp_path / "out"
    tx.build_corpus(str(data), str(out))
    train = out / "corpus" / "train.jsonl"
    before = train.stat().st_ino
    tx.build_corpus(str(data), str(out))   # the same corpus: the files are left as they are
    assert train.stat().st_ino == before
    tsv = data / "imdb" / "imdb_test_sample5k.tsv"
    tsv.write_text(tsv.read_text() + "40\t1\t0\ta new review of a new film\n")
    (out / "tokenizer").mkdir()   # the tokenizer was trained on the old corpus
    with pytest.raises(DataError, match=r"train.jsonl: the corpus built from --data now "
                                        r"differs from this one"):
        tx.build_corpus(str(data), str(out))
    (out / "tokenizer").rmdir()   # nothing made from it yet: written anew
    tx.build_corpus(str(data), str(out))
    assert train.stat().st_ino != before


def test_a_fine_tuning_older_than_its_pretrained_model_runs_again(tmp_path):
    write(tmp_path, {f"pretrain/{n}/final/config.json": "{}" for n in ("mlm", "mlm_sro")})
    write(tmp_path, {f"hyp/{s}-s{seed}.done.json": "{}" for s in tx.STARTS for seed in (1, 2)})
    # a run stopped part-way (its checkpoint would be resumed) is forgotten as well
    write(tmp_path, {f"hyp/{s}-s1.started.json": "{}" for s in ("mlm", "mlm_sro")})
    for n, age in (("mlm", 0), ("mlm_sro", 100)):   # mlm_sro pretrained again since
        os.utime(tmp_path / "pretrain" / n / "final" / "config.json", (2e9 + age, 2e9 + age))
    for path in (tmp_path / "hyp").iterdir():
        os.utime(path, (2e9 + 50, 2e9 + 50))
    names = [f"{s}-s{seed}" for s in tx.STARTS for seed in (1, 2)]
    assert tx.forget_stale(str(tmp_path), "hyp", names) == \
        ["scratch-s1", "scratch-s2", "mlm_sro-s1", "mlm_sro-s2"]   # scratch: its shape
    assert sorted(p.name for p in (tmp_path / "hyp").iterdir()) == \
        ["mlm-s1.done.json", "mlm-s1.started.json", "mlm-s2.done.json"]
    assert tx.forget_stale(str(tmp_path), "hyp", names) == []


def test_the_corpus_is_checked_against_the_fine_tuning_splits(tmp_path, monkeypatch):
    from tasks.imdb import reader as imdb
    data = datasets(tmp_path / "data")
    config, folder, _ = tx.TASKS["imdb"]
    own = ["reader.file=imdb_test_sample5k.tsv", "reader.dev_ratio=0.5"]
    monkeypatch.setitem(tx.TASKS, "imdb", (config, folder, own))   # what the runs read
    dev = tx.task_documents(str(data))["imdb"]["dev"]
    expected = imdb.read(str(data / "imdb"), "dev", {"file": "imdb_test_sample5k.tsv",
                                                     "dev_ratio": 0.5})
    assert [d.doc_id for d in dev] == [d.doc_id for d in expected] and len(dev) > 8


def test_the_few_labels_runs_and_their_table(tmp_path, monkeypatch):
    """The `why` step: every start at each learning rate and IMDB seed, from WHY_REVIEWS train
    reviews, one evaluation at the end; its table in transfer_results.md and .json."""
    data, out = datasets(tmp_path / "data"), tmp_path / "out"
    calls, forgotten = [], []
    monkeypatch.setattr(tx, "ablation", lambda *a: calls.append(a))
    monkeypatch.setattr(tx, "forget_stale", lambda *a: forgotten.append(a))
    argv = ["--data", str(data), "--output-dir", str(out), "--imdb-seeds", "1", "2",
            "--finetune-set", "learning_rate=9e-9", "epochs=7"]
    assert tx.main(argv + ["--steps", "why"]) == 0
    (config, folder, jobs, common, variants), = calls
    assert config == "tasks/imdb/config.yaml" and folder == str(out / "why" / "imdb-300")
    # the step's own settings win over --finetune-set; the rest is IMDB's fine-tuning
    assert common[-3:] == ["max_examples.train=300", "epochs=2", "eval_every_epoch=false"]
    assert common[:-3] == tx.finetune_common(tx.parse_args(argv), "imdb")
    final = str(out / "pretrain" / "mlm" / "final")
    assert variants["mlm-lr1e-4-s2"] == [f"init_checkpoint={final}", "learning_rate=1e-4",
                                         "seed=2"]
    # a run older than its pretrained model runs again, as the main fine-tuning's do
    assert forgotten == [(str(out), os.path.join("why", "imdb-300"), list(variants))]
    assert len(variants) == 3 * 2 * 2 and \
        all(v[-2] == "learning_rate=" + k.split("-lr")[1].rsplit("-s", 1)[0]
            for k, v in variants.items())
    # without IMDB there is nothing to run, and IMDB's config does not judge the overrides
    calls.clear()
    assert tx.main(argv + ["--steps", "why", "--tasks", "hyp", "--finetune-set",
                           "max_examples.test=5"]) == 0 and calls == []
    for (start, rate, seed), acc in {("mlm", "1e-4", 1): 0.6, ("mlm", "1e-4", 2): 0.8,
                                     ("scratch", "3e-4", 2): 0.7}.items():
        write(out / "why" / "imdb-300" / f"{start}-lr{rate}-s{seed}",
              {"eval_results.json": json.dumps({"accuracy": acc, "step": 64}),
               "predictions_dev.jsonl": "".join(json.dumps({"pred": str(i % 2 * seed)}) + "\n"
                                                for i in range(4))})
    few = tx.why_table(str(out), [1, 2])
    assert few["mlm"]["1e-4"]["dev accuracy"] == pytest.approx([0.7, 0.1414214], rel=1e-5)
    assert few["mlm"]["3e-4"] == {"seeds": {}, "one_label": []}
    text = tx.write_table(tx.parse_args(argv + ["--tasks", "imdb"]))
    assert "| IMDB from 300 train reviews, 2 epochs: dev accuracy | lr 3e-4, mean ± sd | " \
           "lr 1e-4, mean ± sd | every seed |" in text
    assert "| mlm | – | 0.700 ± 0.141 | 1e-4: s1 0.600, s2 0.800 |" in text
    assert "| scratch | 0.700 (one seed) | – | 3e-4: s2 0.700 |" in text
    assert "same label" not in text
    write(out / "why" / "imdb-300" / "mlm-lr1e-4-s1", {"predictions_dev.jsonl": "{\"pred\": 1}\n"})
    assert "| mlm | – | 0.700 ± 0.141 | 1e-4: s1 0.600\\*, s2 0.800 |\n| mlm_sro | – | – | – |" \
        "\n\n\\* the kept model gave every dev document the same label\n" in \
        tx.write_table(tx.parse_args(argv + ["--tasks", "imdb"]))
    assert "| mlm_sro | – | – | – |" in text
    saved = json.loads((out / "transfer_results.json").read_text())
    assert saved["few_labels"]["mlm"]["1e-4"]["seeds"] == {"1": 0.6, "2": 0.8}
