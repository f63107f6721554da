"""DuReader 2.0 (He et al. 2018) multi-document reading comprehension, converted to span
extraction as DuReader's baseline preprocessing does.

Raw JSON lines, one question each: `{"question_id", "question", "question_type",
"segmented_question", "documents": [{"title", "paragraphs": [str], "segmented_paragraphs":
[[word]], "is_selected", "most_related_para", "bs_rank_pos", ...}], "answers": [str],
"answer_docs": [int], "answer_spans": [[start word, end word]] (inclusive, into the segmented
words of the most related paragraph of documents[answer_docs[0]]), "fake_answers": [str],
"match_scores": [float], "segmented_answers", ...}`. The test files have no answers and no
most_related_para / is_selected. Files per split: search.<split>.json and zhidao.<split>.json.

Conversion, per question:
  - documents: train takes only the is_selected ones (as the baseline), dev/test all; then
    the first max_docs of them;
  - one paragraph per document: most_related_para when present and not -1 (train and dev:
    the paragraph most related to the answers, as the baseline's train and dev preprocessing;
    dev scores are therefore higher than test scores, where the question decides), else the
    paragraph with the highest recall of the question's words (common words / question
    words, ties to the shorter paragraph), the baseline's find_best_question_match for
    inference (-1 is what the data holds for questions without answers);
  - a paragraph's text is its segmented words joined without spaces: answer_spans,
    fake_answers and the baseline's predicted answers all live in that text (the raw paragraph
    keeps spaces the segmentation dropped, so many fake answers do not occur in it verbatim);
  - context = the selected paragraphs joined with "\n" (SEPARATOR), in document order;
  - answers: fake_answers[0] at the character offset of word answer_spans[0][0] in the
    paragraph of documents[answer_docs[0]] (squad.place_answer: the occurrence nearest to that
    offset when they disagree, counted as realigned; dropped and counted when absent);
  - references = answers (the human answers, for the metric); extra field "question_type"
    (YES_NO / ENTITY / DESCRIPTION) for per-type evaluation.
doc_id = str(question_id), unique across the files of a split.

Counted skips (train only; dev/test questions are kept without answer positions): no
answer_spans; match_scores[0] below min_match_score; the answer document not among the selected
documents; the fake answer not found ("no answer found in context"). A malformed line, a
question without id or documents, an empty question or context, a most_related_para out of
range → DataError naming the file, line and question id.

Options:
  files            {split: file name or [file names]} instead of the search above
  sources          which of search / zhidao to read (default both, those present; a source
                   named here must be present)
  max_docs         documents per question (default 5, the baseline's max_p_num)
  min_match_score  train: skip questions whose fake answer matched the answers with an F1
                   below this (default 0 = keep all; DuReader's preprocessed data used 0.7)
"""
import os
from collections import Counter

from ernie_doc.data.document import (Skips, check_options, check_split, file_name,
                                     is_candidate_file, read_json_lines, require_dir, require_file,
                                     where)
from ernie_doc.data.squad import NO_ANSWER, place_answer, span_document
from ernie_doc.errors import DataError

SOURCES = ("search", "zhidao")
SEPARATOR = "\n"
OPTIONS = ("files", "sources", "max_docs", "min_match_score")
NO_SPANS = "no answer_spans"
LOW_SCORE = "match score below min_match_score"
DOC_DROPPED = "answer document not among the selected documents"


def read(data_dir, split, options):
    options = check_options(options, OPTIONS)
    max_docs = options.get("max_docs", 5)
    if isinstance(max_docs, bool) or not isinstance(max_docs, int) or max_docs < 1:
        raise DataError(f"reader option 'max_docs': expected a positive integer, got "
                        f"{max_docs!r}")
    min_score = options.get("min_match_score", 0)
    if isinstance(min_score, bool) or not isinstance(min_score, (int, float)):
        raise DataError(f"reader option 'min_match_score': expected a number, got "
                        f"{min_score!r}")
    docs, seen = [], set()
    for path in _files(data_dir, check_split(split), options):
        records = read_json_lines(path)
        answer_skips, question_skips = Skips(path, "answers"), Skips(path, "questions")
        for line, record in records:
            doc = _convert(record, split, max_docs, min_score, path, line, answer_skips,
                           question_skips)
            if doc is None:
                continue
            if doc.doc_id in seen:
                raise DataError(f"{where(path, line)}: duplicate question_id {doc.doc_id!r}")
            seen.add(doc.doc_id)
            docs.append(doc)
        answer_skips.report(len(records))
        question_skips.report(len(records))
    if not docs:
        raise DataError(f"{where(data_dir)}: no questions for split {split!r}")
    return docs


def _files(data_dir, split, options):
    """The files of `split`: files[split] (one name or a list), else <source>.<split>.json of
    each source (all that exist, or exactly those named in `sources`)."""
    require_dir(data_dir)
    files = check_options(options.get("files"), ("train", "dev", "test"),
                          "reader option 'files'")
    if split in files:
        names = files[split] if isinstance(files[split], list) else [files[split]]
        if not names:
            raise DataError(f"reader option 'files': {split} is an empty list")
        return [require_file(os.path.join(data_dir, file_name(name, f"files.{split}")))
                for name in names]
    sources = options.get("sources")
    if sources is None:
        paths = [os.path.join(data_dir, f"{s}.{split}.json") for s in SOURCES]
        paths = [p for p in paths if is_candidate_file(p)]
        if not paths:
            raise DataError(f"{where(data_dir)}: no search.{split}.json or "
                            f"zhidao.{split}.json for split {split!r}")
        return paths
    if isinstance(sources, str):
        sources = [sources]
    if not isinstance(sources, list) or not sources:
        raise DataError(f"reader option 'sources': expected a list of {list(SOURCES)}, got "
                        f"{sources!r}")
    for source in sources:
        if source not in SOURCES:
            raise DataError(f"reader option 'sources': {source!r} is not one of "
                            f"{list(SOURCES)}")
    return [require_file(os.path.join(data_dir, f"{s}.{split}.json")) for s in sources]


def _convert(record, split, max_docs, min_score, path, line, answer_skips, question_skips):
    """The Document of one question, or None when it is skipped (counted)."""
    qid = record.get("question_id")
    if isinstance(qid, bool) or not isinstance(qid, (int, str)):
        raise DataError(f"{where(path, line)}: record without a 'question_id'")
    at = f"{where(path, line)} (question_id {qid})"  # errors
    loc = f"line {line} (question_id {qid})"  # counted skips (their report names the file)
    documents = record.get("documents")
    if not isinstance(documents, list):
        raise DataError(f"{at}: record without a 'documents' list")
    spans, answer_docs = _list(record, "answer_spans", at), _list(record, "answer_docs", at)
    fakes, scores = _list(record, "fake_answers", at), _list(record, "match_scores", at)
    question = record.get("question")
    if question is not None and not isinstance(question, str):
        raise DataError(f"{at}: 'question' is not a string")
    train = split == "train"
    if train and not (spans and answer_docs and fakes):
        question_skips.add(NO_SPANS, loc)
        return None
    if scores and (isinstance(scores[0], bool) or not isinstance(scores[0], (int, float))):
        raise DataError(f"{at}: match_scores[0] {scores[0]!r} is not a number")
    if train and min_score and (scores or [0])[0] < min_score:
        question_skips.add(LOW_SCORE, loc)
        return None

    chosen = [(i, d) for i, d in enumerate(documents) if not train or _selected(d, i, at)]
    chosen = chosen[:max_docs]
    question_words = _list(record, "segmented_question", at) or list(question or "")
    if not all(isinstance(w, str) for w in question_words):
        raise DataError(f"{at}: 'segmented_question' is not a list of words")
    pieces, offsets = [], {}  # offsets: document index → (paragraph words, start in context)
    position = 0
    for i, doc in chosen:
        words = _paragraph(doc, question_words, f"{at}: documents[{i}]")
        text = "".join(words)
        if not text.strip():
            continue
        offsets[i] = (words, position)
        pieces.append(text)
        position += len(text) + len(SEPARATOR)
    context = SEPARATOR.join(pieces)

    answers = []
    if spans and answer_docs and fakes:
        doc_index = answer_docs[0] if isinstance(answer_docs[0], int) else None
        answer = _answer(offsets, doc_index, spans[0], fakes[0], loc, answer_skips)
        if answer:
            answers.append(answer)
        elif train and doc_index not in offsets:
            question_skips.add(DOC_DROPPED, loc)
            return None
    if train and not answers:
        question_skips.add(NO_ANSWER, loc)
        return None
    references = [a for a in _list(record, "answers", at) if isinstance(a, str) and a.strip()]
    return span_document(qid, question, context, answers, references, at,
                         question_type=record.get("question_type"))


def _list(record, key, at):
    """record[key] as a list ([] when absent or null); any other type is a DataError (a
    string would otherwise be read one character at a time)."""
    value = record.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise DataError(f"{at}: {key!r} is not a list (got {type(value).__name__})")
    return value


def _selected(doc, i, at):
    if not isinstance(doc, dict):
        raise DataError(f"{at}: documents[{i}] is not an object")
    return bool(doc.get("is_selected"))


def _paragraph(doc, question_words, at):
    """The segmented words of the document's selected paragraph (see the module docstring)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("segmented_paragraphs"), list):
        raise DataError(f"{at}: document without a 'segmented_paragraphs' list")
    paragraphs = doc["segmented_paragraphs"]
    if not paragraphs:
        return []
    for number, words in enumerate(paragraphs):
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise DataError(f"{at}: segmented_paragraphs[{number}] is not a list of words")
    index = doc.get("most_related_para")
    # -1 is DuReader's "no paragraph matched the answers" (questions without answers).
    if index is None or (isinstance(index, int) and index == -1):
        index = best_question_match(paragraphs, question_words)
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(paragraphs):
        raise DataError(f"{at}: most_related_para {index!r} is not a paragraph index "
                        f"(0..{len(paragraphs) - 1})")
    return paragraphs[index]


def best_question_match(paragraphs, question_words):
    """Index of the paragraph (word lists) with the highest recall of the question's words,
    ties to the shorter then the earlier paragraph (DuReader's find_best_question_match)."""
    question = Counter(question_words)
    total = sum(question.values())

    def key(i):
        common = sum((Counter(paragraphs[i]) & question).values())
        return (-(common / total if total else 0.0), len(paragraphs[i]), i)

    return min(range(len(paragraphs)), key=key)


def _answer(offsets, doc_index, span, fake, at, skips):
    """{"text", "start"} of the fake answer, placed at the character offset of its first word
    in the context; None when its document was not selected or it is not in the paragraph."""
    if doc_index not in offsets or not isinstance(fake, str) or not fake.strip():
        return None
    words, paragraph_start = offsets[doc_index]
    paragraph = "".join(words)
    first = span[0] if isinstance(span, list) and span and isinstance(span[0], int) else None
    # Offset of the first answer word; a span outside the paragraph leaves place_answer the
    # first occurrence of the fake answer.
    start = len("".join(words[:first])) if first is not None and 0 <= first < len(words) \
        else None
    placed = place_answer(paragraph, fake, start, skips, at)
    if placed is None:
        return None
    return {"text": fake, "start": paragraph_start + placed["start"]}
