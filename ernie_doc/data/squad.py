"""Span-extraction QA: the Document every span reader returns, answer alignment, and the reader
of SQuAD-v1-style JSON (CMRC2018, DRCD; tasks/cmrc2018, tasks/drcd).

One Document per question (doc_id: the question id; text: the context; fields: question,
context, verified answers, references, title). Details: docs/design-notes.md, "Span data:
SQuAD-style JSON"."""
import re
from typing import List, Tuple

from ernie_doc.data.document import Document, Skips, check_split, read_json_file
from ernie_doc.errors import DataError

REALIGNED = "realigned the answer_start of"   # Skips.fixed: the answer is kept
NOT_FOUND = "answer text not found in context"
EMPTY_ANSWER = "empty answer text"
NO_ANSWER = "no answer found in context"
EMPTY_QUESTION = "empty question"


def find_all(context, text, ignore_case=False, whole_word=False):
    """Start offsets of every (overlapping) occurrence of `text` in `context`; whole_word: no
    word character on either side; ignore_case keeps `context`'s offsets."""
    if not text:
        return []
    if not ignore_case and not whole_word:
        starts, i = [], context.find(text)
        while i >= 0:
            starts.append(i)
            i = context.find(text, i + 1)
        return starts
    # A zero-width lookahead finds overlapping matches; regex case folding keeps the offsets
    # of the original string (str.lower() can change lengths, e.g. "İ").
    body = re.escape(text)
    if whole_word:
        body = rf"(?<!\w)(?={body}(?!\w))"
    else:
        body = rf"(?={body})"
    return [m.start() for m in re.finditer(body, context, re.IGNORECASE if ignore_case else 0)]


def align_answer(context, text, start):
    """The start of `text` in `context`: `start` when it is right, else the occurrence nearest
    to it (the earlier on a tie; the first when start is None), else None (not in context)."""
    if isinstance(start, int) and not isinstance(start, bool) and start >= 0 \
            and context[start:start + len(text)] == text:
        return start
    found = find_all(context, text)
    if not found:
        return None
    if not isinstance(start, int) or isinstance(start, bool):
        return found[0]
    return min(found, key=lambda i: (abs(i - start), i))


def place_answer(context, text, start, skips, location):
    """{"text", "start"} of an answer given with a possibly wrong start (align_answer), or
    None when the text is not in the context; a realignment or a miss is counted in `skips`."""
    found = align_answer(context, text, start)
    if found is None:
        skips.add(NOT_FOUND, location)
        return None
    if found != start:
        skips.fixed(REALIGNED, location)
    return {"text": text, "start": found}


def span_document(doc_id, question, context, answers, references, location, **extra):
    """The Document of one question (schema in the module docstring). An empty question or
    context raises DataError at `location`; `answers` must already be aligned."""
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{location}: empty question")
    if not isinstance(context, str) or not context.strip():
        raise DataError(f"{location}: empty context")
    unique = []
    for answer in answers:
        # A broken offset here is a bug in the reader, not in the data.
        assert context[answer["start"]:answer["start"] + len(answer["text"])] == answer["text"]
        if answer not in unique:  # CMRC2018 dev repeats one answer up to three times
            unique.append(answer)
    fields = {"question": question, "context": context, "answers": unique,
              "references": list(references)}
    fields.update(extra)
    return Document(str(doc_id), context, None, fields=fields)


def read_squad(path, split, skip_empty_questions=False):
    """[Document] of a SQuAD-v1-style JSON file (policy in the module docstring)."""
    check_split(split)
    table = read_json_file(path)
    data = table.get("data") if isinstance(table, dict) else None
    if not isinstance(data, list):
        raise DataError(f"{path}: expected {{\"data\": [articles]}}")
    answer_skips, question_skips = Skips(path, "answers"), Skips(path, "questions")
    docs, seen, questions, answers_seen = [], set(), 0, 0
    for a, article in enumerate(data):
        _require_list(article, "paragraphs", f"{path}: data[{a}]", "article")
        title = article.get("title")
        for p, paragraph in enumerate(article["paragraphs"]):
            at = f"data[{a}].paragraphs[{p}]"
            _require_list(paragraph, "qas", f"{path}: {at}", "paragraph")
            context = paragraph.get("context")
            for q, qa in enumerate(paragraph["qas"]):
                questions += 1
                qa_at = f"{at}.qas[{q}]"
                qid = qa.get("id") if isinstance(qa, dict) else None
                if not isinstance(qid, (str, int)) or isinstance(qid, bool):
                    raise DataError(f"{path}: {qa_at}: question without an 'id'")
                qid = str(qid)
                location = f"{qa_at} (id {qid!r})"
                if qid in seen:
                    raise DataError(f"{path}: {location}: duplicate question id")
                seen.add(qid)
                question = qa.get("question")
                if question is not None and not isinstance(question, str):
                    raise DataError(f"{path}: {location}: 'question' is not a string")
                if not (question or "").strip():
                    if not skip_empty_questions:
                        raise DataError(f"{path}: {location}: empty question (the reader option "
                                        f"skip_empty_questions skips such questions)")
                    question_skips.add(EMPTY_QUESTION, location)
                    continue
                if not isinstance(context, str) or not context.strip():
                    raise DataError(f"{path}: {location}: empty context")
                raw = qa.get("answers", [])
                if not isinstance(raw, list):
                    raise DataError(f"{path}: {location}: 'answers' is not a list")
                answers, references = _question_answers(raw, context, path, qa_at, qid,
                                                        answer_skips)
                answers_seen += len(raw)
                if split == "train" and not answers:
                    question_skips.add(NO_ANSWER, location)
                    continue
                extra = {"title": title} if isinstance(title, str) else {}
                docs.append(span_document(qid, question, context, answers, references,
                                          f"{path}: {location}", **extra))
    answer_skips.report(answers_seen)
    question_skips.report(questions)
    if not docs:
        raise DataError(f"{path}: no questions for split {split!r}")
    return docs


def _question_answers(raw: list, context: str, path: str, qa_at: str, qid: str,
                      skips: Skips) -> Tuple[List[dict], List[str]]:
    """(answers placed in the context, reference texts) of one question's answer records;
    empty answers and ones not found in the context are counted in `skips`."""
    answers, references = [], []
    for n, answer in enumerate(raw):
        answer_at = f"{qa_at}.answers[{n}] (id {qid!r})"
        text, start = _answer(answer, f"{path}: {answer_at}")
        if not text.strip():
            skips.add(EMPTY_ANSWER, answer_at)
            continue
        references.append(text)
        placed = place_answer(context, text, start, skips, answer_at)
        if placed:
            answers.append(placed)
    return answers, references


def _require_list(record, key, at, what):
    if not isinstance(record, dict) or not isinstance(record.get(key), list):
        raise DataError(f"{at}: {what} without a '{key}' list")


def _answer(answer, location):
    """(text, answer_start) of one answer record; answer_start may be absent (None)."""
    if not isinstance(answer, dict) or not isinstance(answer.get("text"), str):
        raise DataError(f"{location}: answer without a 'text' string")
    start = answer.get("answer_start")
    if start is not None and (isinstance(start, bool) or not isinstance(start, int)):
        raise DataError(f"{location}: answer_start {start!r} is not an integer")
    return answer["text"], start
