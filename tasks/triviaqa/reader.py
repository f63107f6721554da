"""TriviaQA reading comprehension (Joshi et al. 2017), Wikipedia setting, original format.

data_dir is the unpacked triviaqa-rc directory or the archive itself (.tgz / .tar.gz / .tar,
read in place with tarfile; members may sit under one top directory). It holds
qa/wikipedia-{train,dev,test-without-answers}.json: `{"Data": [{"QuestionId", "Question",
"Answer": {"Aliases", "NormalizedAliases", "Value", "NormalizedValue", "Type", ...},
"EntityPages": [{"Filename", "Title", "DocSource"}], ...}], "Domain", "Split", ...}` (the
test file has no Answer), and evidence/wikipedia/<Filename> (UTF-8 text). The web files are
not read.

One Document per question (doc_id = QuestionId), as BigBird's TriviaQA preprocessing:
  - context = the question's evidence pages in EntityPages order, each cut to its first
    max_evidence_chars characters, joined with a blank line ("\n\n", SEPARATOR: pages already
    separate their paragraphs with one);
  - answers = every occurrence in the context of every alias (Aliases + NormalizedAliases,
    case-insensitive, whole words: "the" is not found in "there"), distant supervision; the
    text of an answer is the context's own spelling; the first max_answer_spans by position;
  - references = the aliases (Aliases, then NormalizedAliases not already there); extra field
    "answer" = the raw Answer object (None for test), which the TriviaQA metric reads.

Bad input: malformed JSON, a question without QuestionId or EntityPages, a duplicate
QuestionId, an empty question or context, a train/dev question without Answer → DataError
naming the qa file and the question (`Data[3] (QuestionId 'tc_40')`); a missing evidence file →
DataError naming the question and the file; Aliases, NormalizedAliases or HumanAnswers that are
not a list of strings, or a Value / NormalizedValue that is not a string → DataError naming the
question and the key. A train question whose aliases never occur in its context is skipped,
counted ("no answer found in context"); dev/test questions are kept.

Evidence is read only from inside the evidence directory: a Filename that is absolute, or that
resolves outside evidence/wikipedia (through "..", or in a directory through a symbolic link),
is refused: DataError `<qa file>: Data[i] (QuestionId 'x'): evidence file '<Filename>' lies
outside <evidence dir>`. A real TriviaQA file never names one, so it is a hostile or broken
file, not a question to skip. An evidence file that is not a regular file (a FIFO, a device) is
refused too, never opened.

Reading a .tgz lists the whole archive first; for the full 2.5 GB triviaqa-rc archive unpack
it once instead.

Verified files (qa/verified-wikipedia-dev.json, whose top-level "VerifiedEval" is true) are
read as the official TriviaQA code reads them (read_triviaqa_data in utils/dataset_utils.py of
mandarjoshi90/triviaqa, which its evaluation script uses too): only the questions with
"QuestionPartOfVerifiedEval" true are kept (the others are counted skips, "not part of the
verified evaluation"), and in the Wikipedia domain only their EntityPages with
"DocPartOfVerifiedEval" true are read. A verified question left without a page is a counted
skip (the official code stops on an assertion). A flag that is missing or not a boolean is a
DataError naming the question. A file whose VerifiedEval is false or absent (all of the
unverified ones) is read whole.

Options:
  files               {split: path under data_dir} instead of qa/wikipedia-<split>.json (e.g.
                      qa/verified-wikipedia-dev.json)
  max_evidence_chars  characters kept of each evidence page (default 0 = the whole page)
  max_answer_spans    answer spans kept per question (default 64; 0 = all)
"""
import functools
import json
import os
import posixpath
import tarfile

from ernie_doc.data.document import (Skips, check_options, check_split, file_name, open_regular,
                                     require_file)
from ernie_doc.data.squad import NO_ANSWER, find_all, span_document
from ernie_doc.errors import DataError, NotSet
from ernie_doc.utils import decode_utf8

FILES = {"train": "qa/wikipedia-train.json", "dev": "qa/wikipedia-dev.json",
         "test": "qa/wikipedia-test-without-answers.json"}
EVIDENCE = "evidence/wikipedia"
SEPARATOR = "\n\n"
OPTIONS = ("files", "max_evidence_chars", "max_answer_spans")
NOT_VERIFIED = "not part of the verified evaluation (QuestionPartOfVerifiedEval false)"
NO_VERIFIED_PAGE = "no evidence page part of the verified evaluation"


def read(data_dir, split, options):
    options = check_options(options, OPTIONS)
    check_split(split)
    files = check_options(options.get("files"), ("train", "dev", "test"),
                          "reader option 'files'")
    for key, value in files.items():
        file_name(value, f"files.{key}")
    max_chars = _count_option(options, "max_evidence_chars", 0)
    max_spans = _count_option(options, "max_answer_spans", 64)
    with _Source(data_dir) as source:
        name = files.get(split, FILES[split])
        table = source.json(name)
        qa_at = source.where(name)
        data = table.get("Data") if isinstance(table, dict) else None
        if not isinstance(data, list):
            raise DataError(f"{qa_at}: expected {{\"Data\": [questions]}}")
        skips, docs, seen = Skips(qa_at, "questions"), [], set()
        verified = table.get("VerifiedEval") is True
        wikipedia = table.get("Domain") == "Wikipedia"
        for i, item in enumerate(data):
            if verified:
                item = _verified_part(item, i, qa_at, wikipedia, skips)
                if item is None:
                    continue
            doc = _convert(item, i, split, source, qa_at, max_chars, max_spans, skips)
            if doc is None:
                continue
            if doc.doc_id in seen:
                raise DataError(f"{qa_at}: Data[{i}] (QuestionId {doc.doc_id!r}): duplicate "
                                f"QuestionId")
            seen.add(doc.doc_id)
            docs.append(doc)
        skips.report(len(data))
    if not docs:
        raise DataError(f"{qa_at}: no questions for split {split!r}")
    return docs


# Keys of an Answer object the reader and the TriviaQA metric read (the snake_case ones are the
# Hugging Face copy's), with the JSON type each must have when present.
STRING_LISTS = ("Aliases", "NormalizedAliases", "HumanAnswers", "aliases", "normalized_aliases",
                "human_answers")
STRINGS = ("Value", "NormalizedValue", "value", "normalized_value")


def aliases(answer):
    """Aliases then NormalizedAliases, without repeats or empty strings."""
    found = []
    for key in ("Aliases", "NormalizedAliases"):
        for alias in answer.get(key) or []:
            if isinstance(alias, str) and alias.strip() and alias not in found:
                found.append(alias)
    return found


def check_answer(answer, at):
    """The Answer object of one question, its alias lists and values checked (DataError at
    `at` naming the key): a string where a list belongs would otherwise become one alias per
    character."""
    if not isinstance(answer, dict):
        raise DataError(f"{at}: 'Answer' is not an object")
    for key in STRING_LISTS:
        if key in answer and (not isinstance(answer[key], list)
                              or not all(isinstance(a, str) for a in answer[key])):
            raise DataError(f"{at}: Answer.{key} is not a list of strings "
                            f"(got {_shown(answer[key])})")
    for key in STRINGS:
        if key in answer and not isinstance(answer[key], str):
            raise DataError(f"{at}: Answer.{key} is not a string (got {_shown(answer[key])})")
    return answer


def _shown(value, limit=60):
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def alias_spans(context, names, limit=0):
    """[{"text", "start"}] of every case-insensitive whole-word occurrence of any of `names`,
    by position (longer first at one start), at most `limit` (0 = all)."""
    spans = set()
    for name in names:
        for start in find_all(context, name.strip(), ignore_case=True, whole_word=True):
            spans.add((start, start + len(name.strip())))
    ordered = sorted(spans, key=lambda s: (s[0], -s[1]))
    if limit:
        ordered = ordered[:limit]
    return [{"text": context[s:e], "start": s} for s, e in ordered]


def _verified_flag(entry, key, at):
    value = entry.get(key) if isinstance(entry, dict) else None
    if not isinstance(value, bool):
        raise DataError(f"{at}: {key} is missing or not true/false in a verified file "
                        f"(got {_shown(value)})")
    return value


def _verified_part(item, i, qa_at, wikipedia, skips):
    """Data[i] of a verified file as the official reader keeps it: None (a counted skip) when
    the question is not part of the verified evaluation or, in the Wikipedia domain, none of
    its pages is; else the item, in that domain with only its verified EntityPages."""
    qid = item.get("QuestionId") if isinstance(item, dict) else None
    loc = f"Data[{i}] (QuestionId {qid!r})" if isinstance(qid, str) and qid else f"Data[{i}]"
    at = f"{qa_at}: {loc}"
    if not _verified_flag(item, "QuestionPartOfVerifiedEval", at):
        skips.add(NOT_VERIFIED, loc)
        return None
    if not wikipedia or not isinstance(item.get("EntityPages"), list):
        return item      # a missing EntityPages list is _convert's error
    pages = [page for page in item["EntityPages"]
             if _verified_flag(page, "DocPartOfVerifiedEval", f"{at}: EntityPages entry")]
    if not pages:
        skips.add(NO_VERIFIED_PAGE, loc)
        return None
    return dict(item, EntityPages=pages)


def _convert(item, i, split, source, qa_at, max_chars, max_spans, skips):
    """The Document of Data[i], or None when it is skipped (counted)."""
    qid = item.get("QuestionId") if isinstance(item, dict) else None
    if not isinstance(qid, str) or not qid:
        raise DataError(f"{qa_at}: Data[{i}]: question without a 'QuestionId'")
    loc = f"Data[{i}] (QuestionId {qid!r})"
    at = f"{qa_at}: {loc}"
    pages = item.get("EntityPages")
    if not isinstance(pages, list):
        raise DataError(f"{at}: question without an 'EntityPages' list")
    texts = []
    for page in pages:
        filename = page.get("Filename") if isinstance(page, dict) else None
        if not isinstance(filename, str) or not filename:
            raise DataError(f"{at}: EntityPages entry without a 'Filename'")
        name = source.evidence_name(filename, at)
        text = source.evidence(name)
        if text is None:
            raise DataError(f"{at}: evidence file {name} not found in {source.root}")
        texts.append(text[:max_chars] if max_chars else text)
    context = SEPARATOR.join(t for t in texts if t.strip())

    answer = item.get("Answer")
    if answer is None and split != "test":
        raise DataError(f"{at}: question without an 'Answer' in split {split!r}")
    if answer is not None:
        check_answer(answer, at)
    names = aliases(answer) if answer else []
    answers = alias_spans(context, names, max_spans)
    if split == "train" and not answers:
        skips.add(NO_ANSWER, loc)
        return None
    return span_document(qid, item.get("Question"), context, answers, names, at,
                         answer=answer)


def _count_option(options, key, default):
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DataError(f"reader option {key!r}: expected an integer >= 0, got {value!r}")
    return value


class _Source:
    """Files of a TriviaQA directory or archive by their relative path ("qa/...")."""

    def __init__(self, data_dir):
        self.root = os.fspath(data_dir)
        self.tar, self.members, self.prefix = None, {}, ""
        self.evidence_real = None  # the evidence directory, symbolic links resolved
        # Questions share pages (e.g. England.txt): decode each once while it is in use.
        self.evidence = functools.lru_cache(maxsize=256)(self._evidence)
        if os.path.isdir(self.root):
            return
        if not self.root:
            raise NotSet("the data directory or archive is not set")
        if not os.path.lexists(self.root):
            raise DataError(f"{self.root}: data directory or archive does not exist")
        require_file(self.root, "data directory or archive")  # never open a FIFO or a device
        try:
            self.tar = tarfile.open(self.root)
            # Regular members only (links are not followed), and none whose own name is
            # absolute or climbs with "..": nothing is extracted, so they could not escape, but
            # no real archive has them and they would make the lookups below ambiguous.
            self.members = {m.name[2:] if m.name.startswith("./") else m.name: m
                            for m in self.tar.getmembers() if m.isfile()
                            and not m.name.startswith("/") and ".." not in m.name.split("/")}
        except (tarfile.TarError, OSError, EOFError) as e:
            reason = (str(e).splitlines() or [type(e).__name__])[0]  # one line
            raise DataError(f"{self.root}: not a readable tar archive ({reason})") from None
        # An archive packed from its parent folder has every path under one top directory.
        for name in self.members:
            parts = name.split("/")
            if len(parts) >= 2 and parts[-2] == "qa":
                self.prefix = "/".join(parts[:-2] + [""])
                break

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.tar is not None:
            self.tar.close()

    def where(self, name):
        """How messages name a file: the path, or 'archive:member'."""
        if self.tar is None:
            return os.path.join(self.root, name)
        return f"{self.root}:{self.prefix}{name}"

    def json(self, name):
        data = self._bytes(name)
        if data is None:
            kind = "archive" if self.tar is not None else "directory"
            raise DataError(f"{self.where(name)}: file not found in the {kind} {self.root}")
        try:
            return json.loads(self._decode(name, data))
        except json.JSONDecodeError as e:
            raise DataError(f"{self.where(name)}:{e.lineno}: invalid JSON ({e.msg})") from None

    def evidence_name(self, filename, at):
        """The path under the root ("evidence/wikipedia/...") of an EntityPages Filename; one
        that is absolute or resolves outside the evidence directory raises DataError at `at`.
        In a directory symbolic links are resolved too (a link inside the evidence directory
        must point inside it); an archive is never extracted, and its links are not read."""
        name = posixpath.normpath(posixpath.join(EVIDENCE, filename))
        inside = (not posixpath.isabs(filename) and "\0" not in filename
                  and name.startswith(EVIDENCE + "/"))
        if inside and self.tar is None:
            if self.evidence_real is None:
                self.evidence_real = os.path.realpath(os.path.join(self.root, EVIDENCE))
            base, real = self.evidence_real, os.path.realpath(os.path.join(self.root, name))
            inside = real != base and os.path.commonpath([base, real]) == base
        if not inside:
            raise DataError(f"{at}: evidence file {filename!r} lies outside "
                            f"{self.where(EVIDENCE)}")
        return name

    def _evidence(self, name):
        """The text of an evidence file, or None when it is not there."""
        data = self._bytes(name)
        return None if data is None else self._decode(name, data)

    def _bytes(self, name):
        if self.tar is None:
            path = os.path.join(self.root, name)
            if not os.path.lexists(path):
                return None
            with open_regular(path) as f:  # a FIFO or a device is refused, never opened
                return f.read()
        member = self.members.get(self.prefix + name)
        return None if member is None else self.tar.extractfile(member).read()

    def _decode(self, name, data):
        return decode_utf8(data, self.where(name), DataError)   # archive members too
