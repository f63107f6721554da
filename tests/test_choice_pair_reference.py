"""C3 (multiple choice) and CAIL2019-SCM (pair matching) against PaddleNLP's readers, the only
public reference for the two tasks (model_zoo/ernie-doc/data.py: MCQIterator,
SemanticMatchingIterator; model.py: ErnieDocForTextMatching). Expected values are worked out
by hand from the reference's rules (written down in ernie_doc/kinds/choice.py), on
fixtures small enough to check with pencil and paper.

Pinned here: the C3 window rule (sum over the choices, pairs cut to max_query_len − 2, a tie
cuts the choice) and the older `window: longest`; both kinds' token types (0 for `[CLS]
first [SEP]`, 1 after); that the types reach the attention; CAIL's
lockstep rows and (T−3)/2 windows; the CAIL loss on the pooled difference and its equality with
PaddleNLP's 2-way softmax head; the multiple-choice training loss's masking of padded choices
(and `missing_choices: paddlenlp`, which scores them)."""
from collections import namedtuple

import numpy as np
import paddle
import pytest
from helpers import ROOT, tiny_config

from ernie_doc.data.collate import collate
from ernie_doc.data.document import Document
from ernie_doc.data.segment import reading_passes, step_members
from ernie_doc.data.splits import DocumentSplit
from ernie_doc.errors import ConfigError
from ernie_doc.kinds.choice import (MultipleChoiceTask, PairMatchingTask, context_window,
                                    question_choice_pairs, truncate_pair)
from ernie_doc.run_config import batch_rows, load_config

CLS, SEP, PAD = 1, 2, 0
SPECIAL = {"cls": CLS, "sep": SEP, "pad": PAD}
Out = namedtuple("Out", ["logits"])   # what a task's loss reads of the head's output


class CharTokenizer:
    """One id per character: lower-case letters a..z → 10..35, digits 0..9 → 40..49;
    whitespace is dropped (as WordPiece drops it)."""

    def encode(self, text):
        return [10 + ord(ch) - ord("a") if ch.isalpha() else 40 + int(ch) for ch in text
                if not ch.isspace()]


def _reader(labels):
    class Reader:
        @staticmethod
        def labels(data_dir, options):
            return list(labels)
    return Reader


def c3_task(seq_len, stride, **options):
    opts = ", ".join(f"{k}: {v}" for k, v in options.items())
    cfg = load_config(None, ["task=c3", "kind=multiple_choice", f"max_seq_len={seq_len}",
                             f"task_options={{{opts}}}"])
    task = MultipleChoiceTask(cfg, _reader("0123"))
    task.setup(SPECIAL, seq_len, stride)
    return task


def cail_task(seq_len, stride, **options):
    opts = ", ".join(f"{k}: {v}" for k, v in options.items())
    cfg = load_config(None, ["task=cail2019_scm", "kind=pair_matching", f"max_seq_len={seq_len}",
                             f"task_options={{{opts}}}"])
    task = PairMatchingTask(cfg, _reader("BC"))
    task.setup(SPECIAL, seq_len, stride)
    return task


# -- C3: the window rule --------------------------------------------------------------------
def test_truncate_pair_tie_rule():
    """Budget 5, both lists 3 long: PaddleNLP's _truncate_seq_pair cuts the second list (the
    choice) on a tie; the older rule cut the first (the question)."""
    q, c = [1, 2, 3], [4, 5, 6]
    assert truncate_pair(q, c, 5, tie_cuts_first=False) == ([1, 2, 3], [4, 5])
    assert truncate_pair(q, c, 5, tie_cuts_first=True) == ([1, 2], [4, 5, 6])
    # the longer one loses first: 2 + 6 → 2 + 4 → (tie) 2 + 3 under the reference rule
    assert truncate_pair([1, 2], [3, 4, 5, 6, 7, 8], 5, tie_cuts_first=False) == \
        ([1, 2], [3, 4, 5])


# A question of 4 tokens with 3 choices of 3, 1 and 5 tokens, num_choices 4, max_query_len 8.
# paddlenlp (pairs cut to 8 − 2 = 6 tokens):
#   (4, 3) = 7 > 6: the question is longer → (3, 3) = 6
#   (4, 1) = 5
#   (4, 5) = 9: the choice is longer → (4, 4), a tie → the choice → (4, 3), the question is
#           longer → (3, 3) = 6
#   (4, 0) padded = 4                                       Σ = 21 → window 40 − 21 − 4 = 15
# longest (pairs cut to 8): (4, 3) 7 · (4, 1) 5 · (4, 5) 9 → (4, 4) 8 · (4, 0) 4
#                                                          max = 8 → window 40 − 8 − 4 = 28
QUESTION, CHOICES = "wxyz", ["abc", "d", "efghi"]


def test_c3_window_rules_by_hand():
    tok = CharTokenizer()
    q, cs = tok.encode(QUESTION), [tok.encode(c) for c in CHOICES]
    ref = question_choice_pairs(q, cs, 4, 8, "paddlenlp")
    assert [(len(a), len(b)) for a, b in ref] == [(3, 3), (4, 1), (3, 3), (4, 0)]
    assert context_window(40, ref, "paddlenlp") == 15
    old = question_choice_pairs(q, cs, 4, 8, "longest")
    assert [(len(a), len(b)) for a, b in old] == [(4, 3), (4, 1), (4, 4), (4, 0)]
    assert context_window(40, old, "longest") == 28


@pytest.mark.parametrize("window, spans", [
    # 50 context tokens, stride 10: windows of 15 advance by 10 (the last one ends the text)
    ("paddlenlp", [(0, 15), (10, 25), (20, 35), (30, 45), (40, 50)]),
    ("longest", [(0, 28), (10, 38), (20, 48), (30, 50)]),
])
def test_c3_rows_layout_and_token_types(window, spans):
    """Every choice's row at step k: [CLS] context[a:b] [SEP] question [SEP] choice [SEP],
    types 0 up to the context's [SEP] and 1 after (PaddleNLP's MCQIterator); the rows of one
    step read the same window."""
    tok = CharTokenizer()
    context = "0123456789" * 5
    task = c3_task(40, 10, max_query_len=8, window=window)
    doc = Document("q0", fields={"context": context, "question": QUESTION, "choices": CHOICES},
                   label="2")
    steps = task.document_segments(doc, 0, tok)
    assert len(steps) == len(spans)
    pairs = question_choice_pairs(tok.encode(QUESTION), [tok.encode(c) for c in CHOICES], 4, 8,
                                  window)
    ctx = tok.encode(context)
    for k, (step, (a, b)) in enumerate(zip(steps, spans)):
        members = step_members(step)
        assert len(members) == 4
        for row, (q, c) in zip(members, pairs):
            first = [CLS] + ctx[a:b] + [SEP]
            rest = q + [SEP] + c + [SEP]
            n = len(first) + len(rest)
            assert row.input_ids.tolist() == first + rest + [PAD] * (40 - n)
            assert row.attention_mask.tolist() == [1.0] * n + [0.0] * (40 - n)
            assert row.token_type_ids.tolist() == [0] * len(first) + [1] * len(rest) + \
                [0] * (40 - n)
            assert (row.seg_index, row.num_segments, row.targets["label"]) == \
                (k, len(spans), 2)
            assert row.targets["choice_mask"].tolist() == [1.0, 1.0, 1.0, 0.0]
    # the fourth (padded) row of the first step: [CLS] context [SEP] wxyz [SEP] [SEP]
    padded, at = step_members(steps[0])[3], spans[0][1] + 2
    assert padded.input_ids[at:at + 6].tolist() == tok.encode("wxyz") + [SEP, SEP]


def test_c3_no_room_for_the_context():
    tok = CharTokenizer()
    doc = Document("q0", fields={"context": "0123456789", "question": QUESTION,
                                 "choices": CHOICES}, label="0")
    # T=25: Σ 21 + 4 leaves no context under PaddleNLP's rule (its reader would loop
    # forever); the longest pair leaves 25 − 8 − 4 = 13
    from ernie_doc.errors import DataError
    with pytest.raises(DataError, match="leaves no room for the context"):
        c3_task(25, 10, max_query_len=8).document_segments(doc, 0, tok)
    assert len(c3_task(25, 10, max_query_len=8, window="longest")
               .document_segments(doc, 0, tok)) == 1


# -- CAIL2019-SCM: lockstep rows, (T−3)/2 windows, token types ------------------------------
def test_cail_lockstep_rows_windows_and_types():
    """T=13 → windows of (13 − 3) // 2 = 5, stride 3. A (12 tokens): (0,5) (3,8) (6,11)
    (9,12); B (4): (0,4) then nothing; C (8): (0,5) (3,8) then nothing. Step k holds rows
    (A,B) and (A,C): [CLS] A_k [SEP] X_k [SEP], types 0 for [CLS] A_k [SEP], 1 for X_k [SEP]
    (PaddleNLP's SemanticMatchingIterator)."""
    tok = CharTokenizer()
    A, B, C = "abcdefghijkl", "mnop", "qrstuvwx"
    a, b, c = tok.encode(A), tok.encode(B), tok.encode(C)
    a_spans = [(0, 5), (3, 8), (6, 11), (9, 12)]
    b_parts = [b[0:4], [], [], []]
    c_parts = [c[0:5], c[3:8], [], []]
    task = cail_task(13, 3)
    doc = Document("t0", A, "C", fields={"A": A, "B": B, "C": C})
    steps = task.document_segments(doc, 0, tok)
    assert len(steps) == 4
    for k, step in enumerate(steps):
        ab, ac = step_members(step)
        for row, x in ((ab, b_parts[k]), (ac, c_parts[k])):
            first = [CLS] + a[slice(*a_spans[k])] + [SEP]
            rest = x + [SEP]
            n = len(first) + len(rest)
            assert row.input_ids.tolist() == first + rest + [PAD] * (13 - n)
            assert row.token_type_ids.tolist() == [0] * len(first) + [1] * len(rest) + \
                [0] * (13 - n)
            assert (row.seg_index, row.num_segments, row.targets["label"]) == (k, 4, 0.0)

    # Scheduled onto rows: a triplet's two rows stay adjacent, start (reset) together and
    # read the same step of the same document in every batch.
    docs = [Document(f"t{i}", A[:4 + 3 * i], "BC"[i % 2],
                     fields={"A": A[:4 + 3 * i], "B": B[:1 + i], "C": C[:8 - i]})
            for i in range(3)]
    passes = [reading_passes(task.document_segments(d, i, tok), True) for i, d in enumerate(docs)]
    split = DocumentSplit("train", docs, passes, group=2, rows=4, seq_len=13, pad_id=PAD)
    seen = 0
    for _, batch in split.batches(0, 0):
        for g in range(2):
            pair = slice(2 * g, 2 * g + 2)
            for key in ("doc_index", "seg_index", "reset_memory", "final", "has_loss"):
                assert len(set(batch[key][pair].tolist())) == 1, key
            if batch["doc_index"][2 * g] >= 0:
                seen += 1
                # both rows read the same A window: equal up to A's [SEP]
                first = int((batch["token_type_ids"][2 * g] == 0).argmin())
                assert first > 1 and np.array_equal(batch["input_ids"][2 * g, :first],
                                                    batch["input_ids"][2 * g + 1, :first])
    assert seen == sum(len(p) for p in passes)


def test_shipped_configs_read_files_into_reference_types(tmp_path):
    """tasks/c3 and tasks/cail2019_scm as shipped (config.yaml + reader on files in the
    official layouts) give PaddleNLP's token types."""
    import json

    from ernie_doc.kinds import build_task
    tok = CharTokenizer()
    c3_dir, cail_dir = tmp_path / "c3", tmp_path / "cail"
    c3_dir.mkdir()
    cail_dir.mkdir()
    (c3_dir / "c3-m-dev.json").write_text(json.dumps(
        [[["abcdef", "ghij"], [{"question": "kl", "choice": ["m", "no"], "answer": "no"}],
          "e0"]]))
    (cail_dir / "valid.json").write_text(json.dumps({"A": "abcd", "B": "efg", "C": "hi",
                                                     "label": "B"}) + "\n")
    c3 = build_task(load_config(str(ROOT / "tasks" / "c3" / "config.yaml"),
                                [f"data_dir={c3_dir}", "max_seq_len=32"]))
    c3.setup(SPECIAL, 32, 128)
    doc = c3.read("dev")[0]
    assert (doc.label, doc.fields["context"]) == ("1", "abcdef\nghij")
    rows = step_members(c3.document_segments(doc, 0, tok)[0])
    # [CLS] 10 context [SEP] | k l [SEP] n o [SEP]: 12 tokens of type 0, then 6 of type 1
    assert rows[1].token_type_ids.tolist() == [0] * 12 + [1] * 6 + [0] * 14
    cail = build_task(load_config(str(ROOT / "tasks" / "cail2019_scm" / "config.yaml"),
                                  [f"data_dir={cail_dir}", "max_seq_len=13"]))
    cail.setup(SPECIAL, 13, 128)
    doc = cail.read("dev")[0]
    ab, ac = step_members(cail.document_segments(doc, 0, tok)[0])
    # [CLS] a b c d [SEP] | e f g [SEP]  and  [CLS] a b c d [SEP] | h i [SEP]
    assert ab.token_type_ids.tolist() == [0] * 6 + [1] * 4 + [0] * 3
    assert ac.token_type_ids.tolist() == [0] * 6 + [1] * 3 + [0] * 4


# -- batch sizes count questions and triplets --------------------------------------------------
def test_batch_size_counts_examples_as_paddlenlp():
    """PaddleNLP's run_mcq.py builds its memories for batch_size × choice_num rows (batch_size
    questions per step) and run_semantic_matching.py reads batch_size triplets per step, one
    row each in its (A,B) and (A,C) inputs. batch_unit: rows (ours) counts rows."""
    c3 = load_config(None, ["task=c3", "kind=multiple_choice", "batch_size=2",
                            "eval_batch_size=3"])
    assert c3.batch_unit == "examples"
    assert (batch_rows(c3, 4), batch_rows(c3, 4, evaluation=True)) == (8, 12)
    cail = load_config(None, ["task=cail2019_scm", "kind=pair_matching", "batch_size=3"])
    assert (batch_rows(cail, 2), batch_rows(cail, 2, evaluation=True)) == (6, 6)
    rows = load_config(None, ["task=c3", "kind=multiple_choice", "batch_size=8",
                              "batch_unit=rows"])
    assert (batch_rows(rows, 4), batch_rows(rows, 4, evaluation=True)) == (8, 8)
    with pytest.raises(ConfigError, match="batch_unit"):
        load_config(None, ["task=c3", "kind=multiple_choice", "batch_unit=questions"])


@pytest.mark.parametrize("task, paper_batch", [("c3", 24), ("cail2019_scm", 48)])
def test_shipped_configs_hold_the_paper_batch_in_examples(task, paper_batch):
    """The paper's appendix batch (C3 24, CAIL 48) read in PaddleNLP's unit: examples per
    optimizer step (batch_size × grad_accum_steps, one rank)."""
    cfg = load_config(str(ROOT / "tasks" / task / "config.yaml"))
    assert cfg.batch_unit == "examples"
    assert cfg.batch_size * cfg.grad_accum_steps == paper_batch


# -- the loss and the heads ----------------------------------------------------------------
def _cail_batch(task, tok):
    docs = [Document("t0", "abcdefg", "B", fields={"A": "abcdefg", "B": "hij", "C": "klmnop"}),
            Document("t1", "qrs", "C", fields={"A": "qrs", "B": "tuvwx", "C": "yz"})]
    rows = [m for i, d in enumerate(docs) for m in step_members(
        task.document_segments(d, i, tok)[0])]
    return collate(rows, [True] * 4, 13, PAD)


def test_cail_loss_on_pooled_difference_equals_paddlenlp_softmax_head():
    """Our head: logit = w·dropout(pooled(A,B) − pooled(A,C)) + b, BCE against 1 for "B".
    PaddleNLP's ErnieDocForTextMatching: Linear(H, 2) on the same difference, cross-entropy
    over [B, C]. With w = W[:, 0] − W[:, 1] and b = b_0 − b_1 the probabilities and the loss
    are equal."""
    from ernie_doc.heads import ErnieDocForPairMatching
    paddle.seed(3)
    tok = CharTokenizer()
    task = cail_task(13, 3)
    model = ErnieDocForPairMatching(tiny_config(cls_token_idx=0, max_position_embeddings=13))
    model.eval()
    batch = {k: paddle.to_tensor(v) for k, v in _cail_batch(task, tok).items()}
    out, _ = task.forward(model, batch, task.init_carry(model, 4))
    pooled = out.encoder.pooled_output.numpy().astype(np.float64)     # [4, H]
    diff = pooled[0::2] - pooled[1::2]                                 # [2, H]
    w = model.linear.weight.numpy().astype(np.float64)[:, 0]
    b = float(model.linear.bias.numpy()[0])
    logit = diff @ w + b
    assert np.allclose(out.logits.numpy(), logit, atol=1e-5)
    y = np.array([1.0, 0.0])                                           # t0: B, t1: C
    bce = np.logaddexp(0, logit) - y * logit                           # −log σ(±logit)
    ones = paddle.ones([4])
    assert float(task.loss(out, batch, ones)) == pytest.approx(bce.mean(), abs=1e-5)
    # the pair's weight is its (A,B) row's: weight 0 on t1 leaves t0's loss alone
    only_first = paddle.to_tensor([1.0, 1.0, 0.0, 0.0])
    assert float(task.loss(out, batch, only_first)) == pytest.approx(bce[0], abs=1e-5)

    # PaddleNLP's 2-way head with W[:, 0] − W[:, 1] = w, b_0 − b_1 = b
    rng = np.random.default_rng(0)
    W = rng.normal(size=(w.size, 2))
    W[:, 0] = W[:, 1] + w
    bias = np.array([0.3 + b, 0.3])
    two = diff @ W + bias                                              # [2, 2] over [B, C]
    log_softmax = two - np.logaddexp(two[:, :1], two[:, 1:])
    ce = -log_softmax[np.arange(2), [0, 1]]                            # labels B → 0, C → 1
    assert np.allclose(ce, bce, atol=1e-9)
    assert np.allclose(np.exp(log_softmax[:, 0]), 1 / (1 + np.exp(-logit)), atol=1e-12)
    assert np.allclose(task.row_outputs(out), 1 / (1 + np.exp(-logit)), atol=1e-5)


def test_token_types_reach_the_attention():
    """The C3 rows' types differ within a row, so the model's task term is computed: the
    logits move when the types are zeroed, and t_proj (the task projection) gets a gradient
    only from rows with mixed types."""
    from ernie_doc.heads import ErnieDocForMultipleChoice
    paddle.seed(4)
    tok = CharTokenizer()
    task = c3_task(40, 10, max_query_len=8)
    doc = Document("q0", fields={"context": "0123456789", "question": QUESTION,
                                 "choices": CHOICES}, label="2")
    rows = list(step_members(task.document_segments(doc, 0, tok)[0]))
    model = ErnieDocForMultipleChoice(tiny_config(cls_token_idx=0, max_position_embeddings=40),
                                      num_choices=4)
    model.eval()
    # At initialisation (weights of std 0.02) the attention's output is tiny next to the
    # residual and the task term moves the encoder output by ~1e-4; projections of std 0.3
    # make it plainly visible.
    for p in model.ernie_doc.encoder.parameters():
        if len(p.shape) == 2:
            p.set_value(paddle.randn(p.shape) * 0.3)
    batch = {k: paddle.to_tensor(v) for k, v in collate(rows, [True] * 4, 40, PAD).items()}
    assert batch["token_type_ids"].numpy().max() == 1
    typed, _ = task.forward(model, batch, task.init_carry(model, 4))
    zeroed, _ = task.forward(model, dict(batch, token_type_ids=paddle.zeros_like(
        batch["token_type_ids"])), task.init_carry(model, 4))
    moved = np.abs(typed.encoder.sequence_output.numpy() -
                   zeroed.encoder.sequence_output.numpy()).max()
    assert moved > 0.5   # 2.9 with this seed
    t_proj = model.ernie_doc.encoder.layers[0].attn.t_proj.weight
    for out, moved in ((typed, True), (zeroed, False)):
        model.clear_gradients()
        task.loss(out, batch, paddle.ones([4])).backward()
        grad = t_proj.grad
        assert (grad is not None and float(grad.abs().max()) > 0) == moved


def _c3_batch(task, tok):
    """Two questions, one step each: q0 with 2 choices (answer 1), q1 with 4 (answer 2)."""
    docs = [Document("q0", fields={"context": "0123", "question": "wx", "choices": ["a", "b"]},
                     label="1"),
            Document("q1", fields={"context": "4567", "question": "wx",
                                   "choices": ["a", "b", "c", "d"]}, label="2")]
    rows = [m for i, d in enumerate(docs) for m in step_members(
        task.document_segments(d, i, tok)[0])]
    return collate(rows, [True] * 8, 24, PAD)


LOGITS = np.array([[1.0, 2.0, 7.0, -3.0], [0.5, -1.0, 2.0, 0.0]], dtype=np.float32)


def _ce(logits, label):
    return float(np.logaddexp.reduce(logits) - logits[label])


@pytest.mark.parametrize("missing, expected", [
    # mask: q0's softmax is over its 2 choices only, q1's over all 4
    ("mask", [_ce(LOGITS[0, :2], 1), _ce(LOGITS[1], 2)]),
    # paddlenlp: q0's padded choices (7.0 and −3.0) enter its softmax
    ("paddlenlp", [_ce(LOGITS[0], 1), _ce(LOGITS[1], 2)]),
])
def test_choice_training_loss_masks_padded_choices(missing, expected):
    tok = CharTokenizer()
    task = c3_task(24, 10, max_query_len=4, missing_choices=missing)
    batch = {k: paddle.to_tensor(v) for k, v in _c3_batch(task, tok).items()}
    mask = [1.0, 1.0, 0.0, 0.0] if missing == "mask" else [1.0] * 4
    assert batch["target_choice_mask"].numpy()[0].tolist() == mask
    logits = paddle.to_tensor(LOGITS, stop_gradient=False)
    loss = task.loss(Out(logits), batch, paddle.ones([8]))
    assert float(loss) == pytest.approx(np.mean(expected), abs=1e-5)
    loss.backward()
    grad = np.abs(logits.grad.numpy())
    # masked choices get no gradient (exp(−1e9) underflows to ~0); scored ones do
    assert (grad[0, 2:].max() < 1e-20) == (missing == "mask") and grad[0, :2].min() > 1e-3
    # the group's weight is its first row's: weight 0 on q1 leaves q0's loss
    half = paddle.to_tensor([1.0] * 4 + [0.0] * 4)
    assert float(task.loss(Out(paddle.to_tensor(LOGITS)), batch, half)) == \
        pytest.approx(expected[0], abs=1e-5)


def test_choice_prediction_with_padded_choices():
    """Logits [0, 1, 5, 0] for a 2-choice question: masked, the softmax is over [0, 1] and
    choice 1 wins; with missing_choices: paddlenlp padded choice 2 wins (its text is "")."""
    doc = Document("q0", fields={"context": "0123", "question": "wx", "choices": ["a", "b"]})
    rows = [(0, np.array([0.0, 1.0, 5.0, 0.0]))]
    masked = c3_task(24, 10).predict_document(doc, rows)
    e = 1 / (1 + np.e)
    assert (masked["pred"], masked["choice"]) == ("1", "b")
    assert masked["probs"] == pytest.approx([e, 1 - e], abs=1e-6)
    scored = c3_task(24, 10, missing_choices="paddlenlp").predict_document(doc, rows)
    z = np.exp([0.0, 1.0, 5.0, 0.0])
    assert (scored["pred"], scored["choice"]) == ("2", "")
    assert scored["probs"] == pytest.approx((z / z.sum()).tolist(), abs=1e-6)


def test_option_values_are_checked():
    from ernie_doc.errors import ConfigError
    with pytest.raises(ConfigError, match="task_options.window"):
        c3_task(40, 10, window="max")
    with pytest.raises(ConfigError, match="task_options.token_types"):
        cail_task(13, 3, token_types="zeros")   # not a reference's: gone
    with pytest.raises(ConfigError, match="task_options.max_query_len"):
        c3_task(40, 10, max_query_len=2)
