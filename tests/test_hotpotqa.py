"""HotpotQA (distractor) two-stage task: the segment layout and its labels, the losses on
hand-made logits, evaluation on hand-made row outputs, both stages end to end through run.sh
(stage 1 writes the evidence stage 2 reads) and bad input."""
import json
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest
from helpers import ROOT, in_process
from test_tasks import COMMON, vocab_dir

from ernie_doc.data.segment import reading_passes
from ernie_doc.kinds import build_task
from ernie_doc.run_config import load_config
from ernie_doc.tokenization.wordpiece import WordPieceTokenizer

WORDS = ["the", "cat", "sat", "a", "dog", "ran", "big", "red", "car", "who", "what", "is",
         "on", "mat", "blue", "sky", "green", "tree", "fast", "slow", "."]
TITLES = ["alpha", "beta", "gamma", "delta"]
MARKERS = ["[p]", "[q]", "[/q]"]


def tokenizer(tmp_path, markers=True):
    d = vocab_dir(tmp_path / "vocab", WORDS + TITLES + (MARKERS if markers else []) + ["?"])
    return d, WordPieceTokenizer(d / "vocab.txt")


def record(qid, paragraphs, question, answer, facts):
    return {"_id": qid, "question": question, "answer": answer, "supporting_facts": facts,
            "context": paragraphs, "type": "bridge", "level": "easy"}


SMALL = record("q1", [["alpha", ["the cat sat .", " a dog ran ."]], ["beta", ["big red car ."]]],
               "who sat ?", "cat", [["alpha", 0]])
YES = record("q2", [["gamma", ["the sky is blue ."]], ["delta", ["the tree is green ."]]],
             "is the sky blue ?", "yes", [["gamma", 0], ["delta", 0]])


def make_task(tmp_path, data, stage="evidence", seq_len=32, stride=8, **options):
    cfg = load_config(None, ["task=hotpotqa", "kind=hotpotqa",
                             f"data_dir={data}", f"max_seq_len={seq_len}",
                             "task_options=" + json.dumps(dict(stage=stage, max_query_len=6,
                                                               **options))])
    task = build_task(cfg)
    _, tok = tokenizer(tmp_path)
    special = {"cls": tok.cls_token_id, "sep": tok.sep_token_id, "pad": tok.pad_token_id}
    task.setup(special, seq_len, stride, tok)
    return task, tok


def write_dev(tmp_path, records, name="hotpot_dev_distractor_v1.json"):
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    (data / name).write_text(json.dumps(records))
    return data


def ids(tok, *tokens):
    return [tok.vocab.get_id(t) for t in tokens]


# -- layout ---------------------------------------------------------------------------------
def test_layout_token_ids_and_evidence_labels(tmp_path):
    data = write_dev(tmp_path, [SMALL])
    task, tok = make_task(tmp_path, data, stage="answer", evidence="gold")
    doc = task.read("dev")[0]
    assert doc.fields["evidence"] == [0]          # evidence: gold → the supporting paragraph
    task, tok = make_task(tmp_path, data)
    doc = task.read("dev")[0]
    [seg] = task.document_segments(doc, 0, tok)   # 19 paragraph tokens fit one 32-token row
    want = ids(tok, "[CLS]", "alpha", "[p]", "the", "cat", "sat", ".", "[SEP]", "a", "dog",
               "ran", ".", "[SEP]", "beta", "[p]", "big", "red", "car", ".", "[SEP]",
               "[q]", "who", "sat", "?", "[/q]")
    assert seg.input_ids.tolist() == want + [tok.pad_token_id] * (32 - len(want))
    assert seg.attention_mask.tolist() == [1.0] * len(want) + [0.0] * (32 - len(want))
    t = seg.targets
    assert np.nonzero(t["para_mask"])[0].tolist() == [2, 14]
    assert np.nonzero(t["para_label"])[0].tolist() == [2]          # alpha is supporting
    assert np.nonzero(t["sent_mask"])[0].tolist() == [7, 12, 19]
    assert np.nonzero(t["sent_label"])[0].tolist() == [7]          # (alpha, 0) only
    assert "start_gold" not in t


def test_windows_score_each_marker_once_and_answer_targets(tmp_path):
    data = write_dev(tmp_path, [SMALL, YES])
    task, tok = make_task(tmp_path, data, stage="answer", evidence="gold", seq_len=16,
                          stride=4)
    small, yes = task.read("dev")
    small.fields["evidence"] = [0, 1]             # both paragraphs, to get several windows
    segs = task.document_segments(small, 0, tok)
    window = 16 - 3 - 3                           # question "who sat ?" is 3 tokens
    assert len(segs) > 2 and all(s.meta["window"][1] - s.meta["window"][0] <= window
                                 for s in segs)
    # every [p] / [SEP] is scored in exactly one window: the one giving it most context
    layout = segs[0].meta["layout"]
    for name, n_markers in (("para_mask", 2), ("sent_mask", 3)):
        seen = []
        for s in segs:
            a, _ = s.meta["window"]
            seen += [a + i - 1 for i in np.nonzero(s.targets[name])[0]]
        assert len(seen) == n_markers == len(set(seen))
    assert sorted(seen) == np.nonzero(layout.kind == 3)[0].tolist()
    # "cat" is layout token 3: a gold start/end where a window holds it, [CLS] elsewhere
    for s in segs:
        a, b = s.meta["window"]
        g = s.targets["start_gold"]
        if a <= 3 < b:
            assert g[3 - a + 1] == 1.0 and g.sum() == 1.0 and s.targets["end_gold"][3 - a + 1]
        else:
            assert g[0] == 1.0 and g.sum() == 1.0
        allowed = s.targets["allowed"]            # [CLS] and sentence words only
        assert allowed[0] == 1.0
        assert all((layout.kind[a + i - 1] == 0) == bool(allowed[i]) for i in range(1, b - a + 1))
        assert int(s.targets["type"]) == 2 and float(s.targets["has_answer"]) == 1.0
    seg = task.document_segments(yes, 1, tok)[0]  # yes/no: type 0, span points at [CLS]
    assert int(seg.targets["type"]) == 0 and seg.targets["start_gold"][0] == 1.0


# -- losses ---------------------------------------------------------------------------------
def bce(x, y):
    return np.log1p(np.exp(-x)) + (1 - y) * x


def test_losses_on_hand_made_logits(tmp_path):
    from tasks.hotpotqa.head import HotpotOutput
    data = write_dev(tmp_path, [SMALL])
    rng = np.random.default_rng(0)
    B, T = 3, 6
    para, sent = rng.normal(size=(B, T)), rng.normal(size=(B, T))
    batch = {"target_para_label": np.zeros((B, T)), "target_para_mask": np.zeros((B, T)),
             "target_sent_label": np.zeros((B, T)), "target_sent_mask": np.zeros((B, T))}
    batch["target_para_mask"][0, 1] = batch["target_para_label"][0, 1] = 1
    batch["target_para_mask"][1, 2] = 1
    batch["target_para_mask"][2, 3] = batch["target_para_label"][2, 3] = 1   # row 2: weight 0
    batch["target_sent_mask"][0, [2, 4]] = 1
    batch["target_sent_label"][0, 4] = 1
    weight = np.array([1.0, 1.0, 0.0])
    want = (bce(para[0, 1], 1) + bce(para[1, 2], 0)) / 2 \
        + (bce(sent[0, 2], 0) + bce(sent[0, 4], 1)) / 2
    t = {k: paddle.to_tensor(v.astype("float32")) for k, v in batch.items()}
    out = HotpotOutput(paddle.to_tensor(para.astype("float32")),
                       paddle.to_tensor(sent.astype("float32")), None, None, None, None, None)
    task, _ = make_task(tmp_path, data)
    got = float(task.loss(out, t, paddle.to_tensor(weight.astype("float32"))))
    assert got == pytest.approx(want, rel=1e-5)

    # answer stage: + type cross-entropy (rows with an answer) + span loss (mean of start/end
    # negative log of the summed gold probability over the allowed positions)
    types = rng.normal(size=(B, 3))
    span = rng.normal(size=(B, T, 2))
    allowed = np.ones((B, T))
    allowed[:, -1] = 0
    start, end = np.zeros((B, T)), np.zeros((B, T))
    start[:, 0] = end[:, 0] = 1
    start[0, :] = end[0, :] = 0
    start[0, [2, 3]] = end[0, 4] = 1
    t.update({"target_type": paddle.to_tensor(np.array([2, 0, 1])),
              "target_has_answer": paddle.to_tensor(np.array([1.0, 0.0, 1.0], "float32")),
              "target_allowed": paddle.to_tensor(allowed.astype("float32")),
              "target_start_gold": paddle.to_tensor(start.astype("float32")),
              "target_end_gold": paddle.to_tensor(end.astype("float32"))})

    def nll(lg, gold, ok):
        return np.log(np.exp(lg[ok > 0]).sum()) - np.log(np.exp(lg[(gold * ok) > 0]).sum())

    type_ce = np.log(np.exp(types[0]).sum()) - types[0, 2]    # row 1 has no answer
    span_loss = np.mean([(nll(span[r, :, 0], start[r], allowed[r])
                          + nll(span[r, :, 1], end[r], allowed[r])) / 2 for r in (0, 1)])
    out = out._replace(type_logits=paddle.to_tensor(types.astype("float32")),
                       span_logits=paddle.to_tensor(span.astype("float32")))
    task, _ = make_task(tmp_path, data, stage="answer", evidence="gold")
    got = float(task.loss(out, t, paddle.to_tensor(weight.astype("float32"))))
    assert got == pytest.approx(want + type_ce + span_loss, rel=1e-5)


# -- evaluation -----------------------------------------------------------------------------
def perfect_rows(task, docs, tok, wrong_type=False):
    """Row outputs that a perfect model would give, read off the targets."""
    rows, passes = {}, []
    for i, doc in enumerate(docs):
        segs = task.document_segments(doc, i, tok)
        passes.append(reading_passes(segs, True))
        rows[i] = []
        for s in segs:
            t = s.targets
            out = {"para": np.where(t["para_label"] > 0, 0.99, 0.0001),
                   "sent": np.where(t["sent_label"] > 0, 0.99, 0.0001)}
            if "type" in t:
                probs = np.full(3, 0.1)
                probs[(int(t["type"]) + wrong_type) % 3] = 0.8
                out["type"] = probs
                out["span"] = np.stack([t["start_gold"], t["end_gold"]], -1) * 10.0
            rows[i].append((s.seg_index, out))
    return rows, passes


def test_evaluate_perfect_outputs_score_one(tmp_path):
    data = write_dev(tmp_path, [SMALL, YES])
    task, tok = make_task(tmp_path, data, seq_len=16, stride=4)
    docs = task.read("dev")
    metrics, preds = task.evaluate(docs, *perfect_rows(task, docs, tok))
    assert metrics["para_ap"] == metrics["para_recall"] == 1.0
    # q1 has one gold paragraph, but min_paragraphs 2 selects two: precision (0.5 + 1) / 2
    assert metrics["para_prec"] == 0.75 and metrics["para_em"] == 0.5
    assert metrics["sp_em"] == metrics["sp_f1"] == 1.0 and metrics["para_selected"] == 2.0
    assert preds[0]["paragraphs"][0]["title"] == "alpha" and preds[0]["sentences"] == \
        [["alpha", 0, 0.99]]
    # min_paragraphs 2 keeps beta although it is below the threshold
    assert [p["index"] for p in preds[0]["paragraphs"]] == [0, 1]
    assert preds[0]["paragraph_probs"] == [0.99, 0.0001]

    task, tok = make_task(tmp_path, data, stage="answer", evidence="gold", seq_len=16,
                          stride=4)
    docs = task.read("dev")
    docs[0].fields["evidence"] = [0, 1]           # the answer segment count grows
    rows, passes = perfect_rows(task, docs, tok)
    metrics, preds = task.evaluate(docs, rows, passes)
    assert metrics["joint_f1"] == metrics["joint_em"] == metrics["em"] == 1.0
    assert metrics["sp_f1"] == 1.0 and metrics["type_acc"] == 1.0
    assert [p["answer"] for p in preds] == ["cat", "yes"]
    assert preds[1]["supporting_facts"] == [["gamma", 0], ["delta", 0]]
    # a wrong question type (span → yes, yes → no): no answer credit, supporting facts kept
    metrics, preds = task.evaluate(docs, *perfect_rows(task, docs, tok, wrong_type=True))
    assert [p["answer"] for p in preds] == ["yes", "no"]
    assert metrics["f1"] == metrics["joint_f1"] == 0.0 and metrics["sp_f1"] == 1.0


def test_span_answers_stay_inside_one_sentence(tmp_path):
    data = write_dev(tmp_path, [SMALL])
    task, tok = make_task(tmp_path, data, stage="answer", evidence="gold")
    doc = task.read("dev")[0]
    [seg] = task.document_segments(doc, 0, tok)
    out = {"type": np.array([0.0, 0.0, 1.0]), "para": np.zeros(32), "sent": np.zeros(32),
           "span": np.zeros((32, 2))}
    # row: [CLS] alpha [p] the cat sat . [SEP] a dog …: the best pair, "cat" … "dog", crosses
    # a sentence boundary; the best one inside a sentence is "cat sat ."
    out["span"][4, 0], out["span"][9, 1] = 9.5, 9.0
    out["span"][6, 1] = 5.0
    metrics, preds = task.evaluate([doc], {0: [(0, out)]}, [reading_passes([seg])])
    assert preds[0]["answer"] == "cat sat ." and metrics["f1"] == pytest.approx(2 / 3)
    assert metrics["sp_f1"] == 0.0 and metrics["joint_f1"] == 0.0


# -- end to end through run.sh --------------------------------------------------------------
E2E = ["model_overrides.max_position_embeddings=32", "max_seq_len=32", "stride=8",
       "task_options.max_query_len=8", "batch_size=4", "epochs=1"]


def random_records(rng, n, prefix):
    out = []
    for i in range(n):
        paragraphs = [[title, [" ".join(rng.choice(WORDS[:-1], size=4)) + " ." for _ in range(2)]]
                      for title in TITLES[:3]]
        if i % 4 == 3:
            answer, facts = "yes", [[TITLES[0], 0], [TITLES[1], 1]]
        else:
            answer = paragraphs[1][1][0].split()[2]
            facts = [[TITLES[0], 1], [TITLES[1], 0]]
        out.append(record(f"{prefix}{i}", paragraphs, "what is the " + WORDS[i % 5] + " ?",
                          answer, facts))
    return out


def hotpot_data(tmp_path, bad_fact=False):
    rng = np.random.default_rng(7)
    data = tmp_path / "hotpot"
    data.mkdir()
    train = random_records(rng, 12, "t")
    if bad_fact:
        train[0]["supporting_facts"].append([TITLES[0], 7])   # there is no sentence 7
    (data / "hotpot_train_v1.1.json").write_text(json.dumps(train))
    (data / "hotpot_dev_distractor_v1.json").write_text(json.dumps(random_records(rng, 4, "d")))
    return data


def run_stage(data, out, vocab, *extra, stage="evidence", evidence=None, expect=0, nproc=1):
    env = dict(os.environ, DATA_DIR=str(data), OUTPUT_DIR=str(out), PYTHON=sys.executable,
               INIT_CHECKPOINT="", MODEL_CONFIG="ernie-doc-small", NPROC=str(nproc),
               STAGE=stage, LAUNCH_LOG_DIR=str(out) + ".launch",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    env.pop("EVIDENCE", None)
    if evidence is not None:
        env["EVIDENCE"] = str(evidence)
    cmd = ["bash", "tasks/hotpotqa/run.sh", f"tokenizer={vocab}", *COMMON, *E2E, *extra]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == expect, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


def finetune_stage(data, out, vocab, *extra, stage="evidence", evidence=None, expect=0):
    """What run_stage's run.sh runs (its config per STAGE, EVIDENCE as
    task_options.evidence_file, then tools/launch.sh's overrides), in this process: for tests
    of the stages' data and results; test_both_stages_run_sh_... keeps the real launches."""
    from tools.finetune import command
    config = "config.yaml" if stage == "evidence" else "config_answer.yaml"
    overrides = [f"output_dir={out}", "overwrite_output_dir=true", f"data_dir={data}",
                 "model=ernie-doc-small"]
    if evidence is not None:
        overrides.append(f"task_options.evidence_file={evidence}")
    return in_process(command, [str(ROOT / "tasks" / "hotpotqa" / config), "--set", *overrides,
                                f"tokenizer={vocab}", *COMMON, *E2E, *extra], expect)


def lines(path):
    return [json.loads(x) for x in open(path, encoding="utf-8")]


@pytest.mark.two_ranks
def test_both_stages_run_sh_stage_one_feeds_stage_two(tmp_path):
    data = hotpot_data(tmp_path, bad_fact=True)
    vocab, _ = tokenizer(tmp_path)
    first = tmp_path / "evidence"
    proc = run_stage(data, first, vocab, nproc=2)   # data parallel: the pooler is unused here
    # the bad supporting fact is a counted skip (the reader's), the question stays
    assert "skipped 1 of 25 supporting facts" in proc.stdout + proc.stderr
    results = json.loads((first / "eval_results.json").read_text())
    assert results["main_metric"] == "para_ap" and 0.0 <= results["para_ap"] <= 1.0
    assert {"para_recall", "para_prec", "sp_em", "sp_f1"} <= set(results)
    dev = lines(first / "predictions_dev.jsonl")
    assert len(dev) == 4 and all(len(p["paragraphs"]) >= 2 for p in dev)
    assert len(lines(first / "predictions_train.jsonl")) == 12   # config: test_splits [train]

    second = tmp_path / "answer"
    run_stage(data, second, vocab, stage="answer", evidence=first, nproc=2)
    results = json.loads((second / "eval_results.json").read_text())
    assert results["main_metric"] == "joint_f1" and 0.0 <= results["joint_f1"] <= 1.0
    assert {"em", "f1", "sp_em", "sp_f1", "joint_em", "type_acc"} <= set(results)
    preds = {p["doc_id"]: p for p in lines(second / "predictions_dev.jsonl")}
    chosen = {p["doc_id"]: [q["title"] for q in p["paragraphs"]] for p in dev}
    assert {k: p["evidence"] for k, p in preds.items()} == chosen   # stage 1's selection
    for p in preds.values():
        assert p["answer_type"] in ("yes", "no", "span")
        assert all(t in p["evidence"] for t, _ in p["supporting_facts"])

    # evidence missing for a dev question: one error line, nothing written
    path = tmp_path / "partial.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in dev[1:]))
    proc = finetune_stage(data, tmp_path / "bad", vocab, stage="answer", evidence=path,
                          expect=2)
    assert proc.stderr.startswith("error: ") and dev[0]["doc_id"] in proc.stderr
    assert not (tmp_path / "bad").exists()


def test_bad_configuration_is_one_error_line(tmp_path):
    data = hotpot_data(tmp_path)
    vocab, _ = tokenizer(tmp_path / "plain", markers=False)
    proc = finetune_stage(data, tmp_path / "out", vocab, expect=2)
    assert "[p] / [q] / [/q]" in proc.stderr and proc.stderr.count("\n") == 1
    vocab, _ = tokenizer(tmp_path)
    proc = finetune_stage(data, tmp_path / "out", vocab, "task_options.evidence_file=null",
                          stage="answer", expect=2)
    assert "evidence_file" in proc.stderr and not (tmp_path / "out").exists()


def test_head_saves_its_stage_and_trains_every_parameter(tmp_path):
    from helpers import tiny_config

    from tasks.hotpotqa.head import ErnieDocForHotpotQA
    model = ErnieDocForHotpotQA(tiny_config(cls_token_idx=0), stage="evidence")
    assert not hasattr(model, "span") and not hasattr(model, "type_classifier")
    model.save_pretrained(str(tmp_path / "ckpt"))
    again = ErnieDocForHotpotQA.from_pretrained(str(tmp_path / "ckpt"))
    assert again.stage == "evidence" and not again.load_report.missing
    ids = paddle.to_tensor(np.arange(8).reshape(1, 8) % 60)
    for stage in ("evidence", "answer"):
        model = ErnieDocForHotpotQA(tiny_config(cls_token_idx=0), stage=stage)
        out = model(ids, model.ernie_doc.init_memories(1), paddle.zeros_like(ids),
                    paddle.ones([1, 8]), paddle.to_tensor([True]))   # as the trainer calls it
        assert out.para_logits.shape == out.sent_logits.shape == [1, 8]
        loss = out.para_logits.sum() + out.sent_logits.sum()
        if stage == "answer":
            assert out.type_logits.shape == [1, 3] and out.span_logits.shape == [1, 8, 2]
            loss = loss + out.type_logits.sum() + out.span_logits.sum()
        else:
            assert out.type_logits is None and out.span_logits is None
        loss.backward()
        # data-parallel sync stops on a trainable parameter without a gradient that an output
        # depends on: the heads must all get one, and the evidence stage (which never reads the
        # pooled [CLS]) hands back no pooled output
        idle = [n for n, p in model.named_parameters() if not p.stop_gradient and p.grad is None
                and not n.startswith("ernie_doc.")]
        assert idle == [], (stage, idle)
        assert (out.encoder.pooled_output is None) == (stage == "evidence")
