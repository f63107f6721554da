"""HotpotQA, distractor setting (Yang et al. 2018): multi-hop questions over 10 paragraphs.

One JSON file per split, a list of `{"_id", "question", "answer", "supporting_facts": [[title,
sent_id], ...], "context": [[title, [sentence, ...]], ...], "type", "level"}`. Files:
hotpot_train_v1.1.json, hotpot_dev_distractor_v1.json, hotpot_test_fullwiki_v1.json (the only
public test file: no answer, supporting_facts or type, which are then None / []).

Document: doc_id = _id; text = the question and every paragraph (its sentences joined), one per
line (only used to train a tokenizer); label None; fields:
  question          str
  answer            str, or None when the record has none (test)
  type              str ("bridge" / "comparison"), or None when absent
  paragraphs        [[title, [sentence, ...]], ...] in file order
  supporting_facts  [[title, sent_id], ...] that point at an existing sentence
  answer_type       "yes" / "no" when the answer is literally that, else "span" (None: no answer)
  answer_spans      [[paragraph index, sentence index, char start], ...]: every occurrence of
                    the answer in the sentences, case-sensitive; only when there is none,
                    case-insensitive. Empty for yes/no.

Bad input: an empty question or context, a duplicate _id or a malformed record is a DataError
naming the file and _id. A supporting fact pointing at a missing title or sentence is a counted
skip of that fact (the question is kept). A train question whose span answer occurs nowhere is
a counted skip of the question (dev/test keep it: the answer string is still scored).

Options:
  files       {split: file name} instead of the names above
  file        one file under data_dir split into train/dev by dev_ratio, which it then needs
              (e.g. hotpot_dev_distractor_first100.json)
  dev_ratio   dev = this fraction of the train file (or of `file`), by hash of _id
  split_seed  integer seed of that hash (default 0)
"""
import os
import re

from ernie_doc.data.document import (Document, Skips, check_options, check_split, file_name,
                                     pick_file, read_json_list, require_dir, require_file,
                                     split_by_ratio, where)
from ernie_doc.errors import DataError

FILES = {"train": ["hotpot_train_v1.1.json"],
         "dev": ["hotpot_dev_distractor_v1.json"],
         "test": ["hotpot_test_fullwiki_v1.json"]}
OPTIONS = ("files", "file", "dev_ratio", "split_seed")
MISSING_FACT = "supporting fact points at a missing sentence"
NO_ANSWER = "span answer occurs in no sentence"


def read(data_dir, split, options):
    options = check_options(options, OPTIONS)
    check_split(split)
    ratio, seed = options.get("dev_ratio"), options.get("split_seed", 0)
    if "file" in options:
        if ratio is None:
            raise DataError("reader options: 'file' needs 'dev_ratio' (the file is split into "
                            "train and dev)")
        path = require_file(os.path.join(require_dir(data_dir),
                                          file_name(options["file"], "file")))
    else:
        source = "train" if ratio is not None and split != "test" else split
        path = pick_file(data_dir, source, FILES, options.get("files"))
    parsed = parse(path)
    if ratio is not None and ("file" in options or split != "test"):
        # split_by_ratio works on Documents; the parse results ride along by doc_id.
        kept = {d.doc_id for d in split_by_ratio([p[0] for p in parsed], ratio, split, seed)}
        parsed = [p for p in parsed if p[0].doc_id in kept]

    facts, questions = Skips(path, "supporting facts"), Skips(path, "questions")
    docs, total_facts = [], 0
    for doc, bad_facts in parsed:
        location = f"{where(path)} _id {doc.doc_id}"
        total_facts += len(doc.fields["supporting_facts"]) + bad_facts
        if split != "test" and doc.fields["answer"] is None:
            raise DataError(f"{where(path)}: _id {doc.doc_id}: no 'answer' (only test "
                            f"questions may lack one)")
        for _ in range(bad_facts):
            facts.add(MISSING_FACT, location)
        if (split == "train" and doc.fields["answer_type"] == "span"
                and not doc.fields["answer_spans"]):
            questions.add(NO_ANSWER, location)
            continue
        docs.append(doc)
    facts.report(total_facts)
    questions.report(len(parsed))
    if not docs:
        raise DataError(f"{where(path)}: no examples for split {split!r}")
    return docs


def parse(path):
    """[(Document, number of skipped supporting facts)] of one HotpotQA file, in file order."""
    records = read_json_list(path, "questions")
    parsed, seen = [], set()
    for index, record in enumerate(records):
        if not isinstance(record, dict) or not isinstance(record.get("_id"), str):
            raise DataError(f"{where(path)}: question {index} is not an object with an '_id'")
        qid = record["_id"]
        if qid in seen:
            raise DataError(f"{where(path)}: duplicate _id {qid!r}")
        seen.add(qid)
        parsed.append(_document(record, f"{where(path)}: _id {qid}"))
    return parsed


def _document(record, at):
    question = record.get("question")
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{at}: empty or missing question")
    paragraphs = _paragraphs(record.get("context"), at)
    answer = record.get("answer")
    if answer is not None and (not isinstance(answer, str) or not answer.strip()):
        raise DataError(f"{at}: the answer is empty or not a string")
    kind = record.get("type")
    if kind is not None and not isinstance(kind, str):
        raise DataError(f"{at}: 'type' is not a string")
    facts, bad = _supporting_facts(record.get("supporting_facts", []), paragraphs, at)

    # The official preprocessing compares the stripped answer with "yes"/"no".
    answer_type = None if answer is None else (
        answer.strip() if answer.strip() in ("yes", "no") else "span")
    spans = find_answer(answer, paragraphs) if answer_type == "span" else []
    text = "\n".join([question] + ["".join(sentences) for _, sentences in paragraphs])
    fields = {"question": question, "answer": answer, "type": kind, "paragraphs": paragraphs,
              "supporting_facts": facts, "answer_type": answer_type, "answer_spans": spans}
    return Document(record["_id"], text, None, fields=fields), bad


def _paragraphs(context, at):
    if not isinstance(context, list):
        raise DataError(f"{at}: 'context' is missing or not a list")
    paragraphs = []
    for i, paragraph in enumerate(context):
        if (not isinstance(paragraph, list) or len(paragraph) != 2
                or not isinstance(paragraph[0], str) or not isinstance(paragraph[1], list)
                or not all(isinstance(s, str) for s in paragraph[1])):
            raise DataError(f"{at}: context paragraph {i} is not [title, [sentence, ...]]")
        paragraphs.append([paragraph[0], list(paragraph[1])])
    if not any(s.strip() for _, sentences in paragraphs for s in sentences):
        raise DataError(f"{at}: empty context")
    return paragraphs


def _supporting_facts(facts, paragraphs, at):
    """(facts that point at an existing sentence, number of the others)."""
    if not isinstance(facts, list):
        raise DataError(f"{at}: 'supporting_facts' is not a list")
    sizes = {}
    for title, sentences in paragraphs:
        sizes.setdefault(title, len(sentences))  # a repeated title: the first paragraph
    kept, bad = [], 0
    for fact in facts:
        if (not isinstance(fact, list) or len(fact) != 2 or not isinstance(fact[0], str)
                or isinstance(fact[1], bool) or not isinstance(fact[1], int)):
            raise DataError(f"{at}: supporting fact {fact!r} is not [title, sentence index]")
        title, sent_id = fact
        if title in sizes and 0 <= sent_id < sizes[title]:
            kept.append([title, sent_id])
        else:
            bad += 1
    return kept, bad


def find_answer(answer, paragraphs):
    """[[paragraph, sentence, char start]] of every occurrence of answer, overlapping ones
    included; case-insensitive only when no exact occurrence exists. A regex (not .lower())
    keeps the offsets right for characters whose lower case has another length."""
    escaped = re.escape(answer)
    for flags in (0, re.IGNORECASE):
        # The lookahead matches empty strings, so every start position is found.
        pattern = re.compile(f"(?=({escaped}))", flags)
        spans = [[p, s, m.start()]
                 for p, (_, sentences) in enumerate(paragraphs)
                 for s, sentence in enumerate(sentences)
                 for m in pattern.finditer(sentence)]
        if spans:
            return spans
    return []
