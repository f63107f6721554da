"""The span kind (word offsets, windows with the question, gold targets, max context, n-best
decoding, the summed-probability loss), the multi-row kinds (multiple choice, pair matching:
rows in lockstep, each its own memory) and the QA tasks' run.sh on official-format fixtures."""
import json

import numpy as np
import paddle
import pytest
from test_tasks import check_results, finetune_task, run_task, vocab_dir

from ernie_doc.data.segment import step_members
from ernie_doc.data.span import (SpanSegmenter, best_spans, context_words, max_context_flags,
                                 tokenize_with_offsets)
from ernie_doc.kinds.span import span_nll
from ernie_doc.tokenization.wordpiece import WordPieceTokenizer

HANZI = list("北京大学是中国的一所著名高校位于海淀区清华在旁边谁哪里什么")


def zh_tokenizer(tmp_path, extra=()):
    d = vocab_dir(tmp_path / "vocab", HANZI + ["2018", "年", "，", "。", "ab", "##c"] + list(extra))
    return WordPieceTokenizer(d / "vocab.txt")


def test_context_words_split_cjk_and_punctuation():
    text = "北京，2018年 abc.  x"
    spans = context_words(text)
    assert [text[a:b] for a, b in spans] == ["北", "京", "，", "2018", "年", "abc", ".", "x"]


def test_offsets_survive_unknown_characters(tmp_path):
    tok = zh_tokenizer(tmp_path)
    text = "臺北大学在海淀"          # 臺 is not in the vocabulary: one [UNK], offsets intact
    ctx = tokenize_with_offsets(text, tok)
    assert len(ctx) == len(text)
    assert ctx.ids[0] == tok.unk_token_id
    first, last = ctx.token_span(text.index("大学"), text.index("大学") + 2)
    assert text[ctx.starts[first]:ctx.ends[last]] == "大学"
    abc = tokenize_with_offsets("x abc", tok)  # "abc" → ab ##c: both pieces map to the word
    assert abc.starts.tolist()[-2:] == [2, 2] and abc.ends.tolist()[-2:] == [5, 5]


def test_max_context_flags_pick_one_window_per_token():
    spans = [(0, 4), (2, 6), (4, 8)]
    flags = max_context_flags(spans)
    owner = {}
    for w, ((a, b), f) in enumerate(zip(spans, flags)):
        for t in np.arange(a, b)[f]:
            assert t not in owner
            owner[int(t)] = w
    assert sorted(owner) == list(range(8))
    assert owner[3] == 1 and owner[0] == 0 and owner[7] == 2   # centre of its window wins


def test_span_segmenter_layout_and_gold_targets(tmp_path):
    tok = zh_tokenizer(tmp_path)
    text = "北京大学是中国的一所著名高校位于海淀区"
    ctx = tokenize_with_offsets(text, tok)
    question = tok.encode("北京大学在哪里")
    seg = SpanSegmenter(seq_len=16, stride=3, cls_id=tok.cls_token_id, pad_id=tok.pad_token_id,
                        open_id=tok.sep_token_id, close_id=tok.sep_token_id, max_query_len=4)
    start = text.index("海淀")
    segments = seg(ctx, question, [(start, start + 2)], doc_index=7)
    window = 16 - 4 - 3
    assert len(segments) == len(range(0, len(text) - window, 3)) + 1
    s0 = segments[0]
    assert s0.input_ids[0] == tok.cls_token_id
    assert s0.input_ids[1:window + 1].tolist() == ctx.ids[:window].tolist()
    assert s0.input_ids[window + 1] == tok.sep_token_id
    assert s0.input_ids[window + 2:window + 6].tolist() == question[:4]
    assert s0.input_ids[window + 6] == tok.sep_token_id and s0.attention_mask.sum() == 16
    assert s0.targets["allowed"].tolist() == [1.0] * (window + 1) + [0.0] * (16 - window - 1)
    # the answer (chars 16, 17) is outside the first window: gold = [CLS]
    assert s0.targets["start_gold"][0] == 1.0 and s0.targets["start_gold"].sum() == 1
    last = segments[-1]
    a, b = last.meta["window"]
    assert a <= start < b
    assert last.targets["start_gold"][start - a + 1] == 1.0
    assert last.targets["end_gold"][start + 1 - a + 1] == 1.0
    assert last.targets["start_gold"][0] == 0.0


def test_every_gold_occurrence_is_a_target(tmp_path):
    """Distant supervision (TriviaQA) and repeated answers: all occurrences inside a window
    are gold starts / ends of that window."""
    tok = zh_tokenizer(tmp_path)
    text = "海淀是海淀"
    ctx = tokenize_with_offsets(text, tok)
    seg = SpanSegmenter(16, 8, tok.cls_token_id, tok.pad_token_id, tok.sep_token_id,
                        tok.sep_token_id, 4)
    (only,) = seg(ctx, tok.encode("在哪里"), [(0, 2), (3, 5), (3, 5)], doc_index=0)
    assert np.nonzero(only.targets["start_gold"])[0].tolist() == [1, 4]
    assert np.nonzero(only.targets["end_gold"])[0].tolist() == [2, 5]


def test_best_spans_decodes_across_segments_with_max_context():
    # two windows over 6 tokens (chars 2t .. 2t+2); window 1 = tokens 2..5
    metas = [{"window": (0, 4), "starts": np.arange(0, 8, 2), "ends": np.arange(2, 10, 2),
              "max_context": np.array([True, True, True, False])},
             {"window": (2, 6), "starts": np.arange(4, 12, 2), "ends": np.arange(6, 14, 2),
              "max_context": np.array([False, True, True, True])}]
    lg0 = np.zeros((8, 2))
    lg1 = np.zeros((8, 2))
    lg0[4, 0] = 9.0          # token 3 as a start in window 0: not its max-context window
    lg1[2, 0], lg1[3, 1] = 5.0, 4.0    # tokens 3..4 from window 1: chars 6..10
    lg0[1, 0], lg0[2, 1] = 3.0, 3.0    # tokens 0..1 from window 0: chars 0..4, score 6
    cands = best_spans(metas, [lg0, lg1], n_best=4, max_answer_len=3)
    assert cands[0] == (9.0, 6, 10)
    assert (6.0, 0, 4) in cands
    assert all(b - a <= 6 for _, a, b in cands)   # at most 3 tokens of 2 chars


def test_span_loss_is_the_negative_log_of_summed_gold_probability():
    logits = np.array([[[0.0, 1.0], [1.0, 0.0], [2.0, 0.0], [5.0, 5.0]]], dtype=np.float32)
    batch = {"target_allowed": paddle.to_tensor([[1.0, 1.0, 1.0, 0.0]]),
             "target_start_gold": paddle.to_tensor([[0.0, 1.0, 1.0, 0.0]]),
             "target_end_gold": paddle.to_tensor([[1.0, 0.0, 0.0, 0.0]])}
    got = float(span_nll(paddle.to_tensor(logits), batch)[0])
    s = logits[0, :3, 0]
    e = logits[0, :3, 1]
    p_start = (np.exp(s[1]) + np.exp(s[2])) / np.exp(s).sum()   # position 3 is not allowed
    p_end = np.exp(e[0]) / np.exp(e).sum()
    assert got == pytest.approx(-(np.log(p_start) + np.log(p_end)) / 2, rel=1e-5)


# -- end to end through run.sh, on official-format fixtures -------------------------------------

SPAN_COMMON = ["stride=4", "max_seq_len=24", "model_overrides.max_position_embeddings=32",
               "task_options.max_query_len=6", "task_options.max_answer_len=8", "batch_size=4"]


def squad_json(path, questions):
    """questions: [(qid, context, question, answer, start)] → SQuAD-v1 file."""
    paragraphs = [{"context": c, "qas": [{"id": q, "question": qq,
                                          "answers": [{"text": a, "answer_start": s}]}]}
                  for q, c, qq, a, s in questions]
    path.write_text(json.dumps({"version": "v1", "data": [{"title": "t", "paragraphs":
                                                           paragraphs}]}, ensure_ascii=False),
                    encoding="utf-8")


def cmrc_run(tmp_path):
    """A tiny CMRC2018 run on fixture questions (12 train, 6 dev) → (data_dir, OUTPUT_DIR)."""
    from test_tasks import finetune_task, vocab_dir
    data = tmp_path / "cmrc2018"
    data.mkdir()
    squad_json(data / "cmrc2018_train.json", zh_questions(12, 0))
    squad_json(data / "cmrc2018_dev.json", zh_questions(6, 1))
    out = tmp_path / "out"
    finetune_task("cmrc2018", data, out, vocab_dir(tmp_path / "vocab", HANZI), *SPAN_COMMON)
    return data, out


def zh_questions(n, seed):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        words = [str(x) for x in rng.choice(HANZI[:18], size=int(rng.integers(20, 40)))]
        context = "".join(words)
        start = int(rng.integers(0, len(context) - 3))
        out.append((f"q{seed}-{i}", context, "谁在哪里", context[start:start + 2], start))
    return out


@pytest.mark.two_ranks
@pytest.mark.parametrize("task,files,nproc", [
    ("cmrc2018", {"train": "cmrc2018_train.json", "dev": "cmrc2018_dev.json"}, 1),
    ("cmrc2018", {"train": "cmrc2018_train.json", "dev": "cmrc2018_dev.json"}, 2),
    ("drcd", {"train": "DRCD_training.json", "dev": "DRCD_dev.json", "test": "DRCD_test.json"},
     1)])
def test_chinese_span_tasks_run_sh(tmp_path, task, files, nproc):
    """(NPROC=2: the span head leaves the pooler out of the loss; data parallel must cope.)"""
    data = tmp_path / task
    data.mkdir()
    for k, (split, name) in enumerate(files.items()):
        squad_json(data / name, zh_questions(12 if split == "train" else 6, k))
    tok = vocab_dir(tmp_path / "vocab", HANZI)
    out = tmp_path / "out"
    if nproc > 1:   # the run.sh launch (fleetrun); one process: the same run in this one
        run_task(task, data, out, tok, *SPAN_COMMON, nproc=nproc)
    else:
        finetune_task(task, data, out, tok, *SPAN_COMMON)
    results = json.loads((out / "eval_results.json").read_text())
    assert results["main_metric"] == "f1" and 0.0 <= results["f1"] <= 100.0
    preds = [json.loads(x) for x in open(out / "predictions_dev.jsonl", encoding="utf-8")]
    assert len(preds) == 6
    contexts = {q: c for q, c, *_ in zh_questions(6, 1)}
    for p in preds:   # every prediction is a piece of its own context
        assert p["pred"] in contexts[p["doc_id"]] and p["segments"] >= 2
    if "test" in files:
        assert (out / "test_results.json").is_file()


@pytest.mark.parametrize("case,message", [
    ("empty_context", "empty context"),
    ("bad_json", "invalid JSON"),
    ("no_answer_in_context", "no answer found in context")])
def test_span_bad_input(tmp_path, case, message):
    """Bad QA data: one line naming the file and the question and exit 2 before anything is
    written, or (an answer not in its context) a counted skip and the run goes on."""
    data = tmp_path / "cmrc"
    data.mkdir()
    train = zh_questions(8, 0)
    if case == "empty_context":
        train[3] = (train[3][0], " ", *train[3][2:])
    if case == "no_answer_in_context":
        train[2] = (train[2][0], train[2][1], train[2][2], "清华北京", 0)
    squad_json(data / "cmrc2018_train.json", train)
    squad_json(data / "cmrc2018_dev.json", zh_questions(4, 1))
    if case == "bad_json":
        (data / "cmrc2018_dev.json").write_text('{"data": [', encoding="utf-8")
    out = tmp_path / "out"
    tok = vocab_dir(tmp_path / "vocab", HANZI)
    if case == "no_answer_in_context":
        proc = finetune_task("cmrc2018", data, out, tok, *SPAN_COMMON)
        assert message in proc.stdout and "skipped 1 of 8 questions" in proc.stdout
        assert (out / "eval_results.json").is_file()
        return
    proc = finetune_task("cmrc2018", data, out, tok, *SPAN_COMMON, expect=2)
    line = proc.stderr.strip()
    assert "\n" not in line and line.startswith("error: ") and message in line, line
    assert "cmrc2018_" in line and not out.exists()


def test_dureader_on_raw_dureader_lines(tmp_path):
    from test_readers_span import duread, duread_doc, lines
    rng = np.random.default_rng(4)
    data = tmp_path / "dureader"
    data.mkdir()
    for split, n in (("train", 10), ("dev", 4)):
        records = []
        for i in range(n):
            words = [str(w) for w in rng.choice(HANZI[:18], size=int(rng.integers(15, 40)))]
            k = int(rng.integers(0, len(words) - 2))
            docs = [duread_doc([list(rng.choice(HANZI[:18], size=5))], False, 0),
                    duread_doc([words], True, 0)]
            records.append(duread(f"{split}{i}", docs, spans=[[k, k + 1]], answer_doc=1,
                                  fake="".join(words[k:k + 2]), question="谁 在 哪里",
                                  answers=("".join(words[k:k + 2]),)))
        (data / f"search.{split}.json").write_text(lines(*records), encoding="utf-8")
    out = tmp_path / "out"
    finetune_task("dureader", data, out, vocab_dir(tmp_path / "vocab", HANZI), *SPAN_COMMON)
    results = json.loads((out / "eval_results.json").read_text())
    assert results["main_metric"] == "f1" and {"em", "f1", "avg"} <= set(results)
    preds = [json.loads(x) for x in open(out / "predictions_dev.jsonl", encoding="utf-8")]
    assert len(preds) == 4 and all(len(p["references"]) == 1 for p in preds)


def test_triviaqa_on_the_original_format(tmp_path):
    rng = np.random.default_rng(3)
    words = ["river", "city", "king", "north", "south", "battle", "year", "song", "film", "team"]
    data = tmp_path / "tqa"
    (data / "qa").mkdir(parents=True)
    (data / "evidence" / "wikipedia").mkdir(parents=True)
    for split, n in (("train", 10), ("dev", 4)):
        records = []
        for i in range(n):
            name = f"Page_{split}_{i}"
            answer = f"Zorb{i}"
            body = " ".join(rng.choice(words, size=60))
            text = body[:100] + f" {answer} " + body[100:] + f" the {answer} again."
            (data / "evidence" / "wikipedia" / f"{name}.txt").write_text(text)
            records.append({"QuestionId": f"{split}{i}", "Question": "which river is it",
                            "Answer": {"Aliases": [answer], "NormalizedAliases": [answer.lower()],
                                       "Value": answer, "NormalizedValue": answer.lower(),
                                       "Type": "WikipediaEntity"},
                            "EntityPages": [{"Filename": f"{name}.txt", "Title": name,
                                             "DocSource": "TagMe"}]})
        (data / "qa" / f"wikipedia-{split}.json").write_text(json.dumps(
            {"Data": records, "Domain": "Wikipedia", "Split": split, "Version": 1.0}))
    out = tmp_path / "out"
    finetune_task("triviaqa", data, out, "train", *SPAN_COMMON, "max_seq_len=32",
                  "tokenizer_vocab_size=50")
    results = json.loads((out / "eval_results.json").read_text())
    assert {"em", "f1"} <= set(results) and results["main_metric"] == "f1"
    preds = [json.loads(x) for x in open(out / "predictions_dev.jsonl")]
    assert len(preds) == 4 and all(p["references"] for p in preds)


def c3_data(tmp_path, sizes=(("train", 8), ("dev", 4), ("test", 4))):
    """C3 files in the official layout: questions with 2 or 3 choices over random contexts."""
    rng = np.random.default_rng(5)
    data = tmp_path / "c3"
    data.mkdir()
    for split, n in sizes:
        entries = []
        for i in range(n):
            ctx = "".join(rng.choice(HANZI, size=int(rng.integers(10, 40))))
            choices = ["北京", "中国", "海淀"][: 2 + i % 2]
            entries.append([[ctx], [{"question": "在哪里", "choice": choices,
                                     "answer": choices[i % len(choices)]}], f"{split}-{i}"])
        (data / f"c3-m-{split}.json").write_text(json.dumps(entries, ensure_ascii=False),
                                                 encoding="utf-8")
    return data


def test_c3_run_sh_rows_per_choice(tmp_path):
    data = c3_data(tmp_path)
    out = tmp_path / "out"
    # T=32: PaddleNLP's window (the default) subtracts all four question + choice pairs
    # (16 or 18 tokens here) and leaves no context at T=16
    run_task("c3", data, out, vocab_dir(tmp_path / "vocab", HANZI), "stride=4", "batch_size=2",
             "grad_accum_steps=1", "max_seq_len=32", "model_overrides.max_position_embeddings=32",
             nproc=2)   # each rank holds whole questions: 2 of 4 rows each
    check_results(out, "accuracy", 4)
    preds = [json.loads(x) for x in open(out / "predictions_dev.jsonl")]
    # the padded choices of a 2-choice question get no probability (doc ids: m-dev-i-0)
    for p in preds:
        i = int(p["doc_id"].split("-")[2])
        # each probability is rounded to 6 decimals: their sum is 1 within 3 × 0.5e-6
        assert len(p["probs"]) == 2 + i % 2 and sum(p["probs"]) == pytest.approx(1.0, abs=2e-6)
    proc = finetune_task("c3", data, tmp_path / "bad", vocab_dir(tmp_path / "vocab", HANZI),
                         "batch_unit=rows", "batch_size=6", expect=2)
    assert "batch_size 6 must be a multiple of 4" in proc.stdout + proc.stderr


def cail_data(tmp_path, sizes=(("train", 8), ("valid", 4), ("test", 4))):
    """CAIL2019-SCM files in the official layout: (A, B, C) triples labelled B or C."""
    rng = np.random.default_rng(6)
    data = tmp_path / "cail"
    data.mkdir()
    for split, n in sizes:
        with open(data / f"{split}.json", "w", encoding="utf-8") as f:
            for i in range(n):
                a, b, c = ("".join(rng.choice(HANZI, size=int(rng.integers(5, 30))))
                           for _ in range(3))
                f.write(json.dumps({"A": a, "B": b, "C": c, "label": "BC"[i % 2]},
                                   ensure_ascii=False) + "\n")
    return data


def test_cail_run_sh_pairs_in_lockstep(tmp_path):
    data = cail_data(tmp_path)
    out = tmp_path / "out"
    run_task("cail2019_scm", data, out, vocab_dir(tmp_path / "vocab", HANZI), "stride=4",
             "batch_size=2", "grad_accum_steps=1")   # 2 triplets: 4 rows
    check_results(out, "accuracy", 4)
    assert (out / "test_results.json").is_file()


def test_group_steps_share_windows_and_reset_together():
    """A multiple-choice question's rows read the same context window at every step and
    start (reset) together; the trainer's batches keep a group's rows adjacent."""
    from ernie_doc.data.document import Document
    from ernie_doc.data.segment import reading_passes
    from ernie_doc.data.splits import DocumentSplit
    from ernie_doc.kinds.choice import MultipleChoiceTask
    from ernie_doc.run_config import load_config

    class Reader:
        @staticmethod
        def labels(data_dir, options):
            return ["0", "1", "2", "3"]

    class Tok:
        def encode(self, text):
            return [10 + ord(ch) % 50 for ch in text]

    cfg = load_config(None, ["task=c3", "kind=multiple_choice", "max_seq_len=16"])
    task = MultipleChoiceTask(cfg, Reader)
    task.setup({"cls": 1, "sep": 2, "pad": 0}, 16, 4)
    docs = [Document(f"d{i}", fields={"context": "x" * (5 + 9 * i), "question": "q",
                                      "choices": ["a", "bb", "c"][: 2 + i % 2]}, label="1")
            for i in range(3)]
    passes = [reading_passes(task.document_segments(d, i, Tok()), True) for i, d in
              enumerate(docs)]
    for steps in passes:
        for step in steps:
            members = step_members(step)
            assert len(members) == 4
            ctx = [m.input_ids[1:1 + 5].tolist() for m in members]
            assert all(c == ctx[0] for c in ctx)
    split = DocumentSplit("train", docs, passes, group=4, rows=8, seq_len=16, pad_id=0)
    batches = [b for _, b in split.batches(0, 0)]
    for b in batches:
        assert b["input_ids"].shape == (8, 16)
        for g in range(2):
            rows = slice(4 * g, 4 * g + 4)
            assert len(set(b["doc_index"][rows].tolist())) == 1
            assert len(set(b["reset_memory"][rows].tolist())) == 1
            assert len(set(b["seg_index"][rows].tolist())) == 1
    assert batches[0]["target_choice_mask"][0].tolist() == [1.0, 1.0, 0.0, 0.0]
