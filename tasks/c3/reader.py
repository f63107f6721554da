"""C3, free-form multiple-choice reading comprehension in Chinese (Sun et al. 2020).

Files `c3-{d,m}-{train,dev,test}.json` (d: dialogues, m: mixed-genre texts), each a JSON list of
`[[paragraph, ...], [{"question", "choice": [2 to 4 strings], "answer"}, ...], id]`. The test
files carry answers too. A split reads c3-d-<split>.json and c3-m-<split>.json, those present
(at least one must be).

One Document per question: doc_id = f"{subset}-{id}-{question index}", where subset is "d" or
"m" (the file stem for other file names): the public files reuse ids across d and m within one
split (236 in train) for different texts, so the subset keeps doc_ids unique. text = the context
(paragraphs joined by "\n"); label = str(index of the answer in choice) (its first occurrence:
a few questions repeat a choice); fields = {"question", "choices", "context"}.

Bad input (DataError naming the file and the entry / question): an empty context or question,
an empty choice list or more than 4 choices, an answer that is not among the choices, a
duplicate id within one file, a malformed entry.

Options:
  subsets  which of "d", "m" to read (default both, those present)
  files    {split: [file names]} (or one name) instead of the c3-<subset>-<split>.json search
"""
import os

from ernie_doc.data.document import (Document, check_options, check_split, is_candidate_file,
                                     read_json_list, require_dir, require_file, where)
from ernie_doc.errors import DataError

SUBSETS = ("d", "m")
LABELS = ["0", "1", "2", "3"]
OPTIONS = ("subsets", "files")


def labels(data_dir, options):
    check_options(options, OPTIONS)
    return list(LABELS)


def read(data_dir, split, options):
    options = check_options(options, OPTIONS)
    check_split(split)
    docs = []
    for path, subset in _files(require_dir(data_dir), split, options):
        docs.extend(read_file(path, subset))
    if not docs:
        raise DataError(f"{where(data_dir)}: no questions for split {split!r}")
    return docs


def read_file(path, subset):
    """The Documents of one C3 file; subset prefixes the doc_ids."""
    entries = read_json_list(path, "[paragraphs, questions, id]")
    docs, seen = [], set()
    for index, entry in enumerate(entries):
        at = f"{where(path)}: entry {index}"
        if (not isinstance(entry, list) or len(entry) != 3 or not isinstance(entry[0], list)
                or not isinstance(entry[1], list) or not isinstance(entry[2], (str, int))
                or isinstance(entry[2], bool)):
            raise DataError(f"{at}: expected [[paragraphs], [questions], id]")
        paragraphs, questions, entry_id = entry[0], entry[1], str(entry[2])
        at = f"{at} (id {entry_id})"
        if entry_id in seen:
            raise DataError(f"{at}: duplicate id")
        seen.add(entry_id)
        if not all(isinstance(p, str) for p in paragraphs):
            raise DataError(f"{at}: a paragraph is not a string")
        context = "\n".join(paragraphs)
        if not context.strip():
            raise DataError(f"{at}: empty context")
        if not questions:
            raise DataError(f"{at}: no questions")
        for number, item in enumerate(questions):
            label, fields = _question(item, f"{at} question {number}")
            fields["context"] = context
            docs.append(Document(f"{subset}-{entry_id}-{number}", context, label, fields=fields))
    return docs


def _question(item, at):
    """(label, fields without the context) of one question."""
    if not isinstance(item, dict):
        raise DataError(f"{at}: expected an object with question, choice, answer")
    question, choices, answer = item.get("question"), item.get("choice"), item.get("answer")
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{at}: empty or missing question")
    if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
        raise DataError(f"{at}: 'choice' is missing or not a list of strings")
    if not choices:
        raise DataError(f"{at}: empty choice list")
    if len(choices) > len(LABELS):
        raise DataError(f"{at}: {len(choices)} choices, C3 has at most {len(LABELS)}")
    if answer not in choices:
        raise DataError(f"{at}: answer {answer!r} is not among the choices {choices}")
    return str(choices.index(answer)), {"question": question, "choices": list(choices)}


def _files(data_dir, split, options):
    """[(path, subset)] to read for split."""
    if "files" in options and "subsets" in options:
        raise DataError("reader options: 'files' and 'subsets' both choose the files; set one")
    files = check_options(options.get("files"), ("train", "dev", "test"), "reader option 'files'")
    if split in files:
        names = files[split]
        names = [names] if isinstance(names, str) else names
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise DataError(f"reader option 'files': {split} must be a file name or a non-empty "
                            f"list of names")
        found = []
        for name in names:
            path = require_file(os.path.join(data_dir, name))
            stem = os.path.splitext(os.path.basename(name))[0]
            parts = stem.split("-")
            # Official names keep the short d / m prefix; any other file is named by its stem.
            subset = parts[1] if len(parts) == 3 and parts[0] == "c3" else stem
            found.append((path, subset))
        if len({s for _, s in found}) != len(found):
            raise DataError(f"reader option 'files': {split} lists two files of one subset")
        return found
    subsets = options.get("subsets")
    if subsets is not None:
        if (not isinstance(subsets, list) or not subsets
                or any(s not in SUBSETS for s in subsets) or len(set(subsets)) != len(subsets)):
            raise DataError(f"reader option 'subsets': expected a list of {list(SUBSETS)}, got "
                            f"{subsets!r}")
        return [(require_file(os.path.join(data_dir, f"c3-{s}-{split}.json")), s)
                for s in subsets]
    found = [(os.path.join(data_dir, f"c3-{s}-{split}.json"), s) for s in SUBSETS]
    found = [(path, s) for path, s in found if is_candidate_file(path)]
    if not found:
        raise DataError(f"{where(data_dir)}: no c3-d-{split}.json or c3-m-{split}.json")
    return found
