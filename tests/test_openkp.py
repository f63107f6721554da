"""OpenKP keyphrase extraction: n-gram labels per window, the loss, ranking and F1@k, the head's
save/load, and run.sh end to end on fixtures in the official JSON-lines format (the dataset is
not redistributable, so none is stored here)."""
import json

import numpy as np
import paddle
import pytest
from helpers import ROOT, tiny_config
from test_tasks import finetune_task, run_task, vocab_dir

WORDS = ["cheap", "flights", "to", "paris", "hotel", "deals", "the", "best", "travel", "guide",
         "city", "tour", "museum", "river", "food", "night", "book", "now", "online", "price"]


class PieceTokenizer:
    """Word "wK" → id 10+K, except words in `split` → two pieces (10+K, 20+K)."""
    unk_token_id = 3

    def __init__(self, split=()):
        self.split = set(split)

    def encode_word(self, word, after_space=True):
        assert after_space
        if word == "":
            return []
        k = int(word[1:])
        return [10 + k, 20 + k] if word in self.split else [10 + k]


# -- segments and labels -------------------------------------------------------------------

def test_ngram_labels_across_two_windows():
    from tasks.openkp.task import KeyphraseSegmenter, tokenize_words
    words = [f"w{k}" for k in range(7)]
    tokens = tokenize_words(words, PieceTokenizer(split={"w1", "w4"}))
    # tokens: w0 | w1 w1' | w2 | w3 | w4 w4' | w5 | w6  → 9 tokens
    assert tokens.ids.tolist() == [10, 11, 21, 12, 13, 14, 24, 15, 16]
    assert tokens.word_starts.tolist() == [0, 1, 3, 4, 5, 7, 8]
    # T = 8: windows of 6 tokens advancing by 3 → tokens [0, 6) and [3, 9); tokens 0-4 have
    # their max context in the first (token 4 ties, the first wins), 5-8 in the second
    gold = [[1, 2], [4, 5], [6, 6], [3, 5], [0, 5]]   # [0, 5] has 6 words: never scored
    segs = KeyphraseSegmenter(8, 3, cls_id=1, sep_id=2, pad_id=0)(tokens, gold, doc_index=7)
    assert len(segs) == 2 and [s.doc_index for s in segs] == [7, 7]
    first, second = segs
    assert first.input_ids.tolist() == [1, 10, 11, 21, 12, 13, 14, 2]
    assert second.input_ids.tolist() == [1, 12, 13, 14, 24, 15, 16, 2]

    # window 1: words w0..w4 start in it (w4 is cut after its first sub-token)
    assert first.meta == {"first_word": 0, "num_words": 5}
    assert first.targets["word_index"].tolist() == [1, 2, 4, 5, 6, 0, 0, 0]
    counted = np.zeros((8, 5), dtype=bool)
    counted[[0, 1, 2, 3], 0] = True          # unigrams w0..w3 (w4's context is better later)
    counted[[0, 1, 2, 3], 1] = True          # bigrams w0w1 .. w3w4
    counted[[0, 1, 2], 2] = True
    counted[[0, 1], 3] = True
    counted[[0], 4] = True
    np.testing.assert_array_equal(first.targets["counted"], counted)
    gold1 = np.zeros((8, 5), dtype=bool)
    gold1[1, 1] = True                       # w1 w2
    np.testing.assert_array_equal(first.targets["gold"], gold1)

    # window 2: words w2..w6; only w4, w5, w6 start n-grams here
    assert second.meta == {"first_word": 2, "num_words": 5}
    assert second.targets["word_index"].tolist() == [1, 2, 3, 5, 6, 0, 0, 0]
    counted = np.zeros((8, 5), dtype=bool)
    counted[[2, 3, 4], 0] = True             # w4, w5, w6
    counted[[2, 3], 1] = True                # w4w5, w5w6
    counted[[2], 2] = True                   # w4w5w6
    np.testing.assert_array_equal(second.targets["counted"], counted)
    gold2 = np.zeros((8, 5), dtype=bool)
    gold2[2, 1] = True                       # w4 w5
    gold2[4, 0] = True                       # w6
    gold2[1, 2] = True                       # w3 w4 w5: labelled, but counted nowhere (its
    np.testing.assert_array_equal(second.targets["gold"], gold2)  # first word's window ends)
    assert not second.targets["counted"][1, 2]


def test_a_word_without_tokens_becomes_unk():
    from tasks.openkp.task import tokenize_words
    tokens = tokenize_words(["w1", "", "w2"], PieceTokenizer(), unk_id=3)
    assert tokens.ids.tolist() == [11, 3, 12] and tokens.word_starts.tolist() == [0, 1, 2]


# -- loss ----------------------------------------------------------------------------------

class _Out:
    """A head output with fixed logits."""

    def __init__(self, logits):
        self.logits = paddle.to_tensor(logits, dtype="float32")


def test_loss_is_the_mean_bce_over_counted_ngrams_of_training_rows():
    from tasks.openkp.task import KeyphraseTask
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 6, 5)).astype("float32")
    gold = rng.random((3, 6, 5)) < 0.2
    counted = rng.random((3, 6, 5)) < 0.6
    batch = {"target_word_index": paddle.zeros([3, 6], dtype="int32"),
             "target_gold": paddle.to_tensor(gold), "target_counted": paddle.to_tensor(counted)}
    weight = np.array([1.0, 0.0, 1.0], dtype="float32")
    task = KeyphraseTask.__new__(KeyphraseTask)
    loss = float(task.loss(_Out(logits), batch, paddle.to_tensor(weight)))
    p = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
    bce = -(gold * np.log(p) + (~gold) * np.log(1 - p))
    keep = counted & (weight[:, None, None] > 0)
    assert loss == pytest.approx(bce[keep].mean(), rel=1e-5)
    # no training row: 0, not NaN
    zero = float(task.loss(_Out(logits), batch, paddle.zeros([3])))
    assert zero == 0.0
    np.testing.assert_allclose(task.row_outputs(_Out(logits)), logits)
    # the word positions reach the head's forward
    assert task.model_inputs(batch)["word_index"] is batch["target_word_index"]


# -- ranking and evaluation ----------------------------------------------------------------

def test_a_phrase_scores_its_best_occurrence_and_repeats_are_one_phrase():
    from tasks.openkp.task import rank_phrases
    words = ["Paris", "hotel", "paris", "Hotel", "deals"]
    counted = np.zeros((6, 5), dtype=bool)
    counted[:5, 0] = True
    counted[:4, 1] = True
    logits = np.full((6, 5), -5.0)
    logits[0, 1] = 1.0      # "Paris hotel"
    logits[2, 1] = 3.0      # "paris Hotel": the same phrase, better
    logits[4, 0] = 2.0      # "deals"
    logits[1, 0] = 2.0      # "hotel" ties with "deals": the earlier word first
    ranked = rank_phrases(words, [(0, counted, logits)], top_k=3)
    assert [(" ".join(p), s) for p, s in ranked] == [("paris Hotel", 3.0), ("hotel", 2.0),
                                                     ("deals", 2.0)]
    # an n-gram not counted in a window is never ranked from it
    counted[2, 1] = False
    assert " ".join(rank_phrases(words, [(0, counted, logits)], top_k=1)[0][0]) == "hotel"


def openkp_file(path, docs):
    with open(path, "w", encoding="utf-8") as f:
        for url, words, phrases in docs:
            record = {"url": url, "text": " ".join(words), "VDOM": "[]"}
            if phrases is not None:
                record["KeyPhrases"] = phrases
            f.write(json.dumps(record) + "\n")


def fixture_docs(rng, n, prefix, min_words=20, max_words=60):
    docs = []
    for i in range(n):
        words = list(rng.choice(WORDS, size=int(rng.integers(min_words, max_words))))
        start = int(rng.integers(0, len(words) - 2))
        phrase = words[start:start + int(rng.integers(1, 3))]
        docs.append((f"http://{prefix}{i}.example.com/", words, [phrase]))
    return docs


def build_openkp_task(data_dir, tokenizer):
    """The task of tasks/openkp/config.yaml set up for T = 12, stride 4."""
    from ernie_doc.kinds import build_task
    from ernie_doc.run_config import load_config
    cfg = load_config(str(ROOT / "tasks" / "openkp" / "config.yaml"), [f"data_dir={data_dir}"])
    task = build_task(cfg)
    task.setup({"cls": 1, "sep": 2, "pad": 0}, 12, 4, tokenizer)
    return task


def test_perfect_logits_score_f1_at_1_of_one(tmp_path):
    from ernie_doc.data.segment import reading_passes

    # single-keyphrase documents "wK ..." long enough for several windows of 10 tokens
    rng = np.random.default_rng(5)
    docs = []
    for i in range(4):
        words = [f"w{int(k)}" for k in rng.integers(0, 9, size=30)]
        words[5 + 4 * i:7 + 4 * i] = ["w98", "w99"]     # the keyphrase, once per document
        docs.append((f"http://d{i}.org", words, [["W98", "w99"]]))
    docs.append(("http://d4.org", ["w1", "w2", "w97"], [["w97"], ["w50"]]))  # 1 of 2 present
    openkp_file(tmp_path / "OpenKPDev.jsonl", docs)
    tokenizer = PieceTokenizer(split={"w3"})
    task = build_openkp_task(tmp_path, tokenizer)
    split = task.read("dev")
    passes = [reading_passes(task.document_segments(d, i, tokenizer), retro_feed=True)
              for i, d in enumerate(split)]
    assert all(len(p) >= 6 for p in passes[:4])             # skim + retrospective, ≥ 3 each
    rows = {i: [(s.seg_index, np.where(s.targets["gold"], 10.0, -10.0)) for s in p if s.final]
            for i, p in enumerate(passes)}
    metrics, predictions = task.evaluate(split, rows, passes)
    # four documents: P@1 = R = 1; the last: its one findable phrase of two (R@1 = 1/2)
    assert metrics["f1@1"] == pytest.approx((4 * 1.0 + 2 / 3) / 5)
    assert metrics["p@1"] == pytest.approx(1.0)
    # at 3 and 5 the other predictions are misses: F1@3 = 2·(1/3)·1/(4/3) = 1/2
    assert metrics["f1@3"] == pytest.approx((4 * 0.5 + 2 * (1 / 3) * 0.5 / (1 / 3 + 0.5)) / 5)
    assert [p["pred"][0] for p in predictions] == ["w98 w99"] * 4 + ["w97"]
    assert len(predictions[0]["pred"]) == 5 and predictions[0]["doc_id"] == "http://d0.org"
    assert predictions[0]["references"] == ["W98 w99"]


def test_unlabelled_eval_documents_are_predicted_but_not_scored(tmp_path):
    from ernie_doc.data.segment import reading_passes
    openkp_file(tmp_path / "OpenKPEvalPublic.jsonl",
                [("http://e.org", ["w1", "w2", "w3"], None)])
    tokenizer = PieceTokenizer()
    task = build_openkp_task(tmp_path, tokenizer)
    split = task.read("test")
    passes = [reading_passes(task.document_segments(split[0], 0, tokenizer), retro_feed=False)]
    rows = {0: [(0, np.zeros((12, 5)))]}
    metrics, predictions = task.evaluate(split, rows, passes)
    assert metrics["f1@3"] == 0.0 and len(predictions[0]["pred"]) == 5
    assert predictions[0]["references"] == []


# -- head ----------------------------------------------------------------------------------

def test_head_scores_words_and_round_trips_through_save_pretrained(tmp_path):
    from tasks.openkp.head import ErnieDocForKeyphrase
    model = ErnieDocForKeyphrase(tiny_config(hidden_size=16))
    model.eval()
    ids = paddle.to_tensor(np.random.default_rng(0).integers(5, 60, size=(2, 10)))
    word_index = paddle.to_tensor([[1, 2, 4, 7, 0, 0, 0, 0, 0, 0]] * 2, dtype="int32")
    out = model(ids, word_index=word_index)
    assert out.logits.shape == [2, 10, 5] and out.memories is not None
    assert model(ids).logits is None
    # the n-grams read the sequence output at word_index: gathering by hand gives the same
    seq = paddle.randn([2, 10, 16])
    by_hand = paddle.to_tensor(seq.numpy()[:, word_index.numpy()[0]])
    np.testing.assert_allclose(model.score_words(seq, word_index).numpy(),
                               model.score_words(by_hand, paddle.arange(10).expand([2, 10]))
                               .numpy(), rtol=1e-5, atol=1e-6)
    model.save_pretrained(str(tmp_path / "kp"))
    loaded = ErnieDocForKeyphrase.from_pretrained(str(tmp_path / "kp"))
    assert not loaded.load_report.missing and not loaded.load_report.unexpected
    loaded.eval()
    np.testing.assert_allclose(loaded(ids, word_index=word_index).logits.numpy(),
                               out.logits.numpy(), rtol=1e-5, atol=1e-6)


# -- run.sh --------------------------------------------------------------------------------

@pytest.mark.two_ranks
@pytest.mark.parametrize("nproc", [1, 2])   # 2: the n-gram layers run inside forward, as
def test_openkp_run_sh_end_to_end(tmp_path, nproc):  # data parallelism requires
    rng = np.random.default_rng(7)
    data = tmp_path / "openkp"
    data.mkdir()
    openkp_file(data / "OpenKPTrain.jsonl", fixture_docs(rng, 12, "t"))
    dev = fixture_docs(rng, 4, "d")
    dev[0][1].append("http://www.example.com/skip")   # a URL word the reader drops
    openkp_file(data / "OpenKPDev.jsonl", dev)
    out = tmp_path / "out"
    if nproc > 1:   # the run.sh launch (fleetrun); one process: the same run in this one
        proc = run_task("openkp", data, out, vocab_dir(tmp_path / "vocab", WORDS), "stride=8",
                        nproc=nproc)
    else:
        proc = finetune_task("openkp", data, out, vocab_dir(tmp_path / "vocab", WORDS),
                             "stride=8")
    log = proc.stdout + proc.stderr
    if nproc > 1:
        log = (tmp_path / "out.launch" / "workerlog.0").read_text()
        assert (tmp_path / "out.launch" / "workerlog.1").is_file()
    assert "retro_feed=True" in log
    results = json.loads((out / "eval_results.json").read_text())
    assert results["main_metric"] == "f1@3" and 0.0 <= results["f1@3"] <= 1.0
    assert {"f1@1", "f1@5", "p@3", "r@3", "loss"} <= set(results)
    preds = [json.loads(line) for line in open(out / "predictions_dev.jsonl")]
    assert [p["doc_id"] for p in preds] == [url for url, _, _ in dev]
    assert all(len(p["pred"]) == 5 and all(p["pred"]) for p in preds)
    assert not any("http" in phrase for p in preds for phrase in p["pred"])
    from tasks.openkp.head import ErnieDocForKeyphrase
    best = ErnieDocForKeyphrase.from_pretrained(str(out / "best"))
    assert not best.load_report.missing


@pytest.mark.parametrize("line, message", [
    ('{"url": "http://b.org", "text": "cheap flights", "KeyPhrases": [["cheap"]]', "invalid JSON"),
    ('{"url": "http://b.org", "text": "  ", "KeyPhrases": [["cheap"]]}', "empty text"),
])
def test_bad_openkp_line_is_one_error_line_and_exit_2(tmp_path, line, message):
    data = tmp_path / "openkp"
    data.mkdir()
    good = json.dumps({"url": "http://a.org", "text": "cheap flights to paris",
                       "KeyPhrases": [["cheap", "flights"]]})
    (data / "OpenKPTrain.jsonl").write_text(good + "\n" + line + "\n")
    (data / "OpenKPDev.jsonl").write_text(good + "\n")
    out = tmp_path / "out"
    proc = finetune_task("openkp", data, out, vocab_dir(tmp_path / "vocab", WORDS), expect=2)
    assert proc.stderr.startswith("error: ") and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "OpenKPTrain.jsonl:2:" in proc.stderr and message in proc.stderr
    assert not out.exists()
