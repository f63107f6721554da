"""tools/pretrain.py end to end on a tiny corpus: logs and results, the final model loads and
fine-tunes, exact resume, and two fleetrun ranks equal one process on the union of their rows."""
import json
import os

import numpy as np
import pytest
from helpers import (ROOT, assert_two_ranks_equal_one_process, in_process, launch_two_ranks,
                     train_and_dump)

WORDS = [f"w{i}" for i in range(60)]


def write_corpus(root, docs=24, seed=0):
    """Plain text, documents separated by blank lines, 20..220 words each."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    vocab = root / "vocab"
    vocab.mkdir()
    specials = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]
    (vocab / "vocab.txt").write_text("\n".join(specials + WORDS) + "\n", encoding="utf-8")
    texts = []
    for _ in range(docs):
        n = int(rng.integers(20, 220))
        # something to learn: a document mostly repeats its own two words
        topic = rng.choice(len(WORDS), size=2, replace=False)
        ids = [int(rng.choice(topic)) if rng.random() < 0.8 else int(rng.integers(len(WORDS)))
               for _ in range(n)]
        texts.append(" ".join(WORDS[i] for i in ids))
    (root / "corpus").mkdir()
    half = len(texts) // 2
    for name, part in (("a.txt", texts[:half]), ("b.txt", texts[half:])):
        (root / "corpus" / name).write_text("\n\n".join(part) + "\n", encoding="utf-8")
    return root / "corpus", vocab


def tiny(corpus, vocab, out, *extra):
    return ["task=pretrain", "kind=pretraining", f"data_dir={corpus}", f"tokenizer={vocab}",
            "model=ernie-doc-small",
            "model_overrides={num_hidden_layers: 2, hidden_size: 32, num_attention_heads: 2, "
            "memory_len: 16, max_position_embeddings: 32}",
            "max_seq_len=16", "batch_size=4", "max_steps=12", "learning_rate=0.002",
            "warmup_steps=2", "logging_steps=0", "progress=false", "reader.shuffle_buffer=4",
            f"output_dir={out}", *extra]


def pretrain(args, resume=None, expect=0):
    """tools/pretrain.py, in this process."""
    from tools.pretrain import command
    argv = ["--resume", str(resume)] if resume else []
    argv += ["--set", *args] if args else []
    return in_process(command, argv, expect)


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("pretrain"))


@pytest.fixture(scope="module")
def finished_run(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "out"
    pretrain(tiny(*corpus, out, "max_steps=150", "save_steps=50", "batch_size=8",
                  "max_seq_len=32", "learning_rate=0.003"))
    return out


def test_pretrain_writes_logs_results_and_a_loadable_model(finished_run):
    out = finished_run
    log = read_jsonl(out / "train_log.jsonl")
    assert [r["step"] for r in log] == list(range(1, 151))
    assert all({"lr", "tokens_per_sec_per_rank"} <= set(r) for r in log)
    # retro feed: steps where every row only skims have no loss
    log = [r for r in log if "mlm_loss" in r]
    assert len(log) >= 100
    for r in log:
        assert {"mlm_accuracy", "loss"} <= set(r) and 0.0 <= r["mlm_accuracy"] <= 1.0
    reorder = [r for r in log if "reorder_loss" in r]
    assert len(reorder) >= 5 and all(0.0 <= r["reorder_accuracy"] <= 1.0 for r in reorder)
    first = np.mean([r["mlm_loss"] for r in log[:10]])
    last = np.mean([r["mlm_loss"] for r in log[-10:]])
    assert first > np.log(65) - 0.3 and last < first - 0.35, (first, last)   # it learns
    results = json.loads((out / "results.json").read_text())
    assert results["step"] == 150 and results["train"]["mlm_accuracy"] > 0.05
    assert (out / "curves.png").stat().st_size > 10000
    assert any(name.startswith("vdlrecords") for name in os.listdir(out / "vdl"))
    from ernie_doc.training.outdir import foreign_entries
    assert foreign_entries(out) == []   # a re-run may remove every name this run wrote

    from ernie_doc.heads import ErnieDocForPretraining, ErnieDocForSequenceClassification
    model = ErnieDocForPretraining.from_pretrained(out / "final")
    assert model.reorder_head.weight.shape == [32, 33]
    assert sorted(os.listdir(out / "checkpoints")) == ["latest", "step-150"]
    state = np.load(out / "checkpoints" / "latest" / "rank-0.npz")
    assert "stream" in state.files and "memories" in state.files
    clf = ErnieDocForSequenceClassification.from_pretrained(out / "final", num_labels=2)
    np.testing.assert_array_equal(clf.ernie_doc.embeddings.word_emb.weight.numpy(),
                                  model.ernie_doc.embeddings.word_emb.weight.numpy())


def test_pretrained_model_fine_tunes_with_finetune_py(finished_run, tmp_path):
    out = tmp_path / "ft"
    from tools.finetune import command
    proc = in_process(command, [
        os.path.join(ROOT, "tasks", "longdep", "config.yaml"), "--set",
        f"init_checkpoint={finished_run / 'final'}", f"output_dir={out}", "max_seq_len=16",
        "stride=14", "model_overrides={}",
        "reader={num_docs: {train: 16, dev: 8, test: 8}, segment_tokens: 14}",
        "batch_size=4", "epochs=1", "progress=false", "logging_steps=0"])
    assert "loaded" in proc.stdout and "mask_lm" not in proc.stderr
    results = json.loads((out / "eval_results.json").read_text())
    assert 0.0 <= results["accuracy"] <= 1.0


def test_fine_tuning_loads_every_encoder_tensor_and_drops_the_pretraining_heads(finished_run):
    """What init_checkpoint=OUTPUT_DIR/final carries into a task: every encoder tensor with its
    value, the classifier new, the MLM and reordering heads reported and left out."""
    from ernie_doc.heads import ErnieDocForPretraining, ErnieDocForSequenceClassification
    pre = ErnieDocForPretraining.from_pretrained(finished_run / "final")
    clf = ErnieDocForSequenceClassification.from_pretrained(finished_run / "final", num_labels=2)
    report = clf.load_report
    encoder = {k: v for k, v in pre.state_dict().items() if k.startswith("ernie_doc.")}
    assert sorted(report.missing) == ["linear.bias", "linear.weight"]
    assert report.other_head == "ErnieDocForPretraining"
    assert {k.split(".")[0] for k in report.unexpected} == {"lm_head", "reorder_head"}
    assert sorted(report.loaded) == sorted(encoder)   # nothing of the encoder missing
    mine = clf.state_dict()
    for key, value in encoder.items():
        np.testing.assert_array_equal(mine[key].numpy(), value.numpy(), err_msg=key)
    assert "unexpected 7 (the ErnieDocForPretraining head, not used): lm_head" \
        in report.summary()


def test_warm_start_from_a_checkpoint(corpus, finished_run, tmp_path):
    out = tmp_path / "warm"
    proc = pretrain(tiny(*corpus, out, f"init_checkpoint={finished_run / 'final'}",
                         "max_steps=8", "batch_size=8", "max_seq_len=32", "learning_rate=1e-5"))
    assert "loaded" in proc.stdout
    warm = [r["mlm_loss"] for r in read_jsonl(out / "train_log.jsonl") if "mlm_loss" in r]
    cold = [r["mlm_loss"] for r in read_jsonl(finished_run / "train_log.jsonl")
            if "mlm_loss" in r]
    # the pretrained model starts where the first run ended, far below a fresh model
    assert np.mean(warm) < np.mean(cold[:8]) - 0.3, (warm, cold[:8])


def test_resume_reproduces_the_uninterrupted_run(corpus, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    extra = ("max_steps=14", "grad_accum_steps=2", "reader.shuffle_buffer=3")
    pretrain(tiny(*corpus, full, *extra))
    pretrain(tiny(*corpus, part, *extra, "stop_at_step=9"))
    assert len(read_jsonl(part / "train_log.jsonl")) == 9
    pretrain(["stop_at_step=0"], resume=part)
    a, b = read_jsonl(full / "train_log.jsonl"), read_jsonl(part / "train_log.jsonl")
    assert len(a) == len(b) == 14
    for ra, rb in zip(a, b):
        ra.pop("tokens_per_sec"), rb.pop("tokens_per_sec")
        ra.pop("tokens_per_sec_per_rank"), rb.pop("tokens_per_sec_per_rank")
        assert ra == rb
    from ernie_doc.heads import ErnieDocForPretraining
    pa = ErnieDocForPretraining.from_pretrained(full / "final").state_dict()
    pb = ErnieDocForPretraining.from_pretrained(part / "final").state_dict()
    for k in pa:
        np.testing.assert_array_equal(pa[k].numpy(), pb[k].numpy(), err_msg=k)


@pytest.mark.two_ranks
def test_two_ranks_equal_one_process_on_the_union_of_their_rows(corpus, tmp_path):
    # no dropout: the ranks draw their own dropout masks, one process draws others. A large
    # Adam epsilon: with the usual 1e-6, Adam turns the rounding differences of near-zero
    # gradients (summed in another order across ranks) into full ±lr steps (seen on paddle
    # 2.6.2: 2e-3 apart after 6 steps); with 1e-2 the update stays linear in the gradient,
    # so the comparison measures the gradients themselves
    common = ("max_steps=6", "grad_accum_steps=2", "save_steps=0", "adam_epsilon=0.01",
              "model_overrides.hidden_dropout_prob=0.0",
              "model_overrides.attention_probs_dropout_prob=0.0",
              "model_overrides.relu_dropout=0.0")
    dp, single = tmp_path / "dp", tmp_path / "single"
    proc, logs = launch_two_ranks(tmp_path, [os.path.join("tests", "dp_worker.py"), str(dp),
                                             *tiny(*corpus, dp, *common)])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + logs
    single.mkdir()
    train_and_dump(single, tiny(*corpus, single, *common, "batch_size=8", "reader.data_shards=2"))
    # the ranks' rows are the single process's rows 0-3 and 4-7: so are their memories,
    # and the logged losses (over both ranks) are the single process's
    a, b = assert_two_ranks_equal_one_process(dp, single)
    assert len(a) == len(b) == 6 and sum("mlm_loss" in r for r in a) >= 3
    for ra, rb in zip(a, b):
        keys = {k for k in ra if not k.startswith("tokens_per_sec")}
        assert keys == {k for k in rb if not k.startswith("tokens_per_sec")}
        for key in keys:
            assert ra[key] == pytest.approx(rb[key], rel=1e-4, abs=1e-6), (key, ra, rb)


@pytest.mark.parametrize("extra, message", [
    (("task_options.max_chunks=5",), "153 reorder classes but the head has 33"),
    (("reader.format=pages",), "reader.format: 'pages' is not one of"),
    (("max_steps=0",), "max_steps: pretraining streams its corpus"),
    (("task_options.mask_prob=0",), "mask_prob: must be in (0, 1]"),
])
def test_bad_config_is_one_error_line(corpus, tmp_path, extra, message):
    out = tmp_path / "bad"
    proc = pretrain(tiny(*corpus, out, *extra), expect=2)
    assert message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert not out.exists()


@pytest.mark.two_ranks
def test_bad_corpus_fails_on_every_rank_without_a_hang(corpus, tmp_path):
    bad = tmp_path / "bad_corpus"
    bad.mkdir()
    (bad / "good.txt").write_text("w1 w2 w3 w4 w5\n", encoding="utf-8")
    (bad / "latin1.txt").write_bytes("w1 caf\xe9 w2\n".encode("latin-1"))
    out = tmp_path / "out"
    proc, _ = launch_two_ranks(tmp_path, ["tools/pretrain.py", "--set",
                                          *tiny(bad, corpus[1], out)], timeout=120)
    assert proc.returncode != 0
    logs = [(tmp_path / "log" / f"workerlog.{rank}").read_text() for rank in (0, 1)]
    # every rank checks the corpus before any collective call; the launcher ends the other
    # ranks as soon as one exits, so a rank still starting may be stopped before it logs
    assert any("latin1.txt:1: invalid UTF-8" in log for log in logs), logs[0][-2000:]
    for log in logs:
        assert "latin1.txt:1: invalid UTF-8" in log or "SIGTERM" in log, log[-2000:]
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = pretrain(tiny(empty, corpus[1], tmp_path / "out2"), expect=2)
    assert "empty corpus" in proc.stderr


@pytest.mark.parametrize("name, layers, hidden, steps, global_batch", [
    ("small", 6, 256, 500000, 2560), ("base", 12, 768, 400000, 2560),
    ("large", 24, 1024, 100000, 3920)])
def test_paper_configs_hold_the_appendix_hyper_parameters(name, layers, hidden, steps,
                                                          global_batch):
    from ernie_doc.config import ErnieDocConfig
    from ernie_doc.kinds import build_task
    from ernie_doc.run_config import load_config
    cfg = load_config(os.path.join(ROOT, "configs", "pretrain", f"{name}.yaml"),
                      ["data_dir=README.md"])
    task = build_task(cfg)
    config = ErnieDocConfig.from_any(cfg.model, **cfg.model_overrides)
    assert (config.num_hidden_layers, config.hidden_size) == (layers, hidden)
    assert config.memory_len == 128 and cfg.max_seq_len == 512
    assert config.hidden_dropout_prob == 0.1
    assert cfg.max_steps == steps and cfg.warmup_steps == 4000
    assert cfg.learning_rate == 1e-4 and cfg.adam_epsilon == 1e-6 and cfg.weight_decay == 0.01
    assert cfg.lr_schedule == "linear" and cfg.retro_feed
    # the comment's GPU count times batch_size x grad_accum_steps is the paper's batch
    text = open(os.path.join(ROOT, "configs", "pretrain", f"{name}.yaml")).read()
    gpus = int(text.split(" GPUs")[0].rsplit("x ", 1)[1])
    assert cfg.batch_size * cfg.grad_accum_steps * gpus == global_batch
    assert task.options["max_chunks"] == 4 and task.options["reorder_classes"] == 33


@pytest.mark.parametrize("whole_word", [True, False])
def test_whole_word_masking_masks_every_piece_of_a_word(tmp_path, whole_word):
    from ernie_doc.kinds import build_task
    from ernie_doc.pretraining.corpus import CorpusDocument
    from ernie_doc.run_config import load_config
    from ernie_doc.tokenization import load_tokenizer
    vocab = tmp_path / "vocab"
    vocab.mkdir()
    stems = [f"s{i}" for i in range(30)]
    (vocab / "vocab.txt").write_text("\n".join(
        ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"] + stems + ["##a", "##b", "##c"]) + "\n")
    tokenizer = load_tokenizer(vocab)
    cfg = load_config(None, ["task=pretrain", "kind=pretraining", f"data_dir={tmp_path}",
                             "max_steps=1", "max_seq_len=64", "retro_feed=false",
                             f"task_options.whole_word_mask={str(whole_word).lower()}"])
    task = build_task(cfg)
    task.setup({"cls": 1, "sep": 2, "pad": 0}, 64, None, tokenizer)
    rng = np.random.default_rng(0)
    split_words = 0
    for d in range(20):   # words of 1-3 pieces: s7, s7##a, s7##a##b
        text = " ".join(stems[rng.integers(30)] + "".join(rng.choice(["a", "b", "c"],
                                                                     rng.integers(0, 3)))
                        for _ in range(40))
        for seg in task.document_steps(CorpusDocument(f"d:{d}", text, "d", d), 0, d):
            pieces = tokenizer.convert_ids_to_tokens(
                [int(i) if lab < 0 else int(lab)
                 for i, lab in zip(seg.input_ids, seg.targets["mlm_labels"])])
            labelled = seg.targets["mlm_labels"] >= 0
            word = -1
            words = []
            for piece in pieces:
                word += not piece.startswith("##")
                words.append(word)
            for w in set(words):
                at = [labelled[i] for i in range(len(pieces)) if words[i] == w]
                split_words += 0 < sum(at) < len(at)
    # whole words: never part of a word (pieces a window edge cuts off count as their own
    # group here, and are all masked or all kept as well)
    assert (split_words == 0) if whole_word else (split_words > 10), split_words


def test_training_mlm_logits_only_for_the_rows_that_train():
    """While gradients are recorded, the MLM head reads the masked tokens of the rows that
    train only (a skim pass's rows have weight 0); the loss and metrics are those of every
    row's logits with the skim rows weighted 0. Evaluation (no gradients) reads every row."""
    import paddle
    from helpers import tiny_config

    from ernie_doc.heads import ErnieDocForPretraining
    from ernie_doc.kinds.pretraining import OBJECTIVE_DEFAULTS, PretrainingTask
    task = PretrainingTask.__new__(PretrainingTask)   # the methods under test read these
    task.cfg = type("Cfg", (), {"loss_segments": "all"})()
    task.options, task.seq_len = dict(OBJECTIVE_DEFAULTS), 8
    rng = np.random.default_rng(0)
    labels = np.full([3, 8], -1, dtype=np.int64)
    labels[:, 2:6] = rng.integers(5, 60, [3, 4])
    batch = {"input_ids": paddle.to_tensor(rng.integers(5, 60, [3, 8])),
             "target_mlm_labels": paddle.to_tensor(labels),
             "target_reorder_label": paddle.to_tensor(np.array([[1], [0], [2]])),
             "has_loss": paddle.to_tensor(np.array([True, False, True])),
             "is_last": paddle.to_tensor(np.array([True, True, False]))}
    weight = paddle.to_tensor(np.array([1.0, 0.0, 1.0], dtype="float32"))
    paddle.seed(0)
    model = ErnieDocForPretraining(tiny_config(max_position_embeddings=8))
    model.eval()   # no dropout: both readings see the same model
    results = []
    for grad in (True, False):
        with paddle.set_grad_enabled(grad):
            positions = task.model_inputs(batch)["masked_positions"].numpy()
            out = model(batch["input_ids"], masked_positions=paddle.to_tensor(positions))
            loss, metrics = task.train_loss(out, batch, weight)
        results.append((positions, float(loss), metrics))
    (train_pos, train_loss, train_metrics), (all_pos, all_loss, all_metrics) = results
    assert sorted(set(train_pos // 8)) == [0, 2] and len(train_pos) == 8
    assert sorted(set(all_pos // 8)) == [0, 1, 2] and len(all_pos) == 12
    np.testing.assert_allclose(train_loss, all_loss, rtol=1e-6)
    assert train_metrics.keys() == all_metrics.keys()
    for name, (total, count) in train_metrics.items():
        np.testing.assert_allclose([total, count], all_metrics[name], rtol=1e-6)
