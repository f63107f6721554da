"""TriviaQA answer EM / F1, reproducing the official triviaqa_evaluation.py
(mandarjoshi90/triviaqa, utils/triviaqa_evaluation.py).

Scores are the max over a question's ground truths (`ground_truths`) of the exact match and
token F1 of TriviaQA-normalised strings, averaged ×100 over every reference question; a
question without a prediction scores 0. Deviations (none changes a score on the released
data): docs/design-notes.md, "Metrics: TriviaQA"."""
from ernie_doc.metrics import squad


def normalize_answer(text):
    """TriviaQA normalisation (see squad.normalize_answer, triviaqa=True)."""
    return squad.normalize_answer(text, triviaqa=True)


def f1_score(prediction, ground_truth):
    """Token F1 of TriviaQA-normalised strings."""
    return squad.token_f1(prediction, ground_truth, triviaqa=True)[0]


def exact_match(prediction, ground_truth):
    """1.0 when the TriviaQA-normalised strings are equal."""
    return squad.exact_match(prediction, ground_truth, triviaqa=True)


def _field(answer, camel, snake, default):
    return answer.get(camel, answer.get(snake, default))


def ground_truths(answer):
    """The strings a prediction is scored against, from a TriviaQA "Answer" object:
    NormalizedAliases, then NormalizedValue, then the normalised HumanAnswers."""
    found = list(_field(answer, "NormalizedAliases", "normalized_aliases", []))
    value = _field(answer, "NormalizedValue", "normalized_value", None)
    if value:
        found.append(value)
    found += [normalize_answer(a) for a in _field(answer, "HumanAnswers", "human_answers", [])]
    return list(dict.fromkeys(found))


def evaluate(predictions, references):
    """predictions: qid -> answer string; references: qid -> TriviaQA Answer object (or a
    list of answer strings). → {"em", "f1"} ×100 over all references, "total", "missing"."""
    def golds(ref):
        return ground_truths(ref) if isinstance(ref, dict) else list(ref)

    em, f1, total, missing = squad.average_scores(
        predictions, references,
        lambda p, ref: squad.max_over_ground_truths(exact_match, p, golds(ref)),
        lambda p, ref: squad.max_over_ground_truths(f1_score, p, golds(ref)))
    return {"em": em, "f1": f1, "total": total, "missing": missing}
