"""HotpotQA answer / supporting-fact / joint metrics, reproducing the official
hotpot_evaluate_v1.py (hotpotqa/hotpot), with no deviation known.

Answers use SQuAD normalisation and token overlap (a differing yes/no/noanswer scores 0);
supporting facts are compared as sets of (title, sent_id); joint precision / recall / EM are
the products of the two. Fractions in 0..1 averaged over all gold records; a record missing
from the predictions scores 0, as in the official script."""
from ernie_doc.metrics import squad

_SPECIAL_ANSWERS = ("yes", "no", "noanswer")

KEYS = ("em", "f1", "prec", "recall", "sp_em", "sp_f1", "sp_prec", "sp_recall",
        "joint_em", "joint_f1", "joint_prec", "joint_recall")


def answer_scores(prediction, gold):
    """(em, f1, precision, recall) of one predicted answer string against the gold one."""
    pred_norm, gold_norm = squad.normalize_answer(prediction), squad.normalize_answer(gold)
    em = float(pred_norm == gold_norm)
    # A yes/no answer is a class label, not a span: no partial credit for overlap with it.
    if pred_norm != gold_norm and (pred_norm in _SPECIAL_ANSWERS or gold_norm in _SPECIAL_ANSWERS):
        return em, 0.0, 0.0, 0.0
    f1, prec, recall = squad.token_f1(prediction, gold)
    return em, f1, prec, recall


def _f1(prec, recall):
    return 2 * prec * recall / (prec + recall) if prec + recall > 0 else 0.0


def sp_scores(prediction, gold):
    """(em, f1, precision, recall) of predicted vs gold supporting facts, each a list of
    [title, sent_id]; duplicates count once. Both empty is an exact match."""
    pred, want = set(map(tuple, prediction)), set(map(tuple, gold))
    tp = len(pred & want)
    fp, fn = len(pred) - tp, len(want) - tp
    prec = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    return float(fp + fn == 0), _f1(prec, recall), prec, recall


def evaluate(pred_answers, pred_sp, gold):
    """pred_answers: _id -> answer; pred_sp: _id -> [[title, sent_id], ...]; gold: HotpotQA
    records (_id, answer, supporting_facts). → the 12 `KEYS`, averaged over gold."""
    totals = dict.fromkeys(KEYS, 0.0)
    for record in gold:
        qid = record["_id"]
        ans = sp = None
        if qid in pred_answers:
            ans = answer_scores(pred_answers[qid], record["answer"])
            for key, value in zip(("em", "f1", "prec", "recall"), ans):
                totals[key] += value
        if qid in pred_sp:
            sp = sp_scores(pred_sp[qid], record["supporting_facts"])
            for key, value in zip(("sp_em", "sp_f1", "sp_prec", "sp_recall"), sp):
                totals[key] += value
        if ans is not None and sp is not None:
            joint_prec, joint_recall = ans[2] * sp[2], ans[3] * sp[3]
            totals["joint_em"] += ans[0] * sp[0]
            totals["joint_f1"] += _f1(joint_prec, joint_recall)
            totals["joint_prec"] += joint_prec
            totals["joint_recall"] += joint_recall
    n = len(gold)
    return {key: value / n if n else 0.0 for key, value in totals.items()}
