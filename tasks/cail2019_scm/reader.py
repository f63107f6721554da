"""CAIL2019-SCM, similar case matching (Xiao et al. 2019): is case A closer to B or to C?

JSON lines `{"A": str, "B": str, "C": str, "label": "B" | "C"}` (fact descriptions of three
private-lending cases); blank lines are skipped. Files per split, the first that exists:
  train  train.json, cail2019_scm_train.json
  dev    valid.json, dev.json, cail2019_scm_dev.json
  test   test.json, cail2019_scm_test.json, input.txt, input.jsonl
(the CAIL2019-SCM release names train / valid / test.json, PaddleNLP cail2019_scm_*.json; the
competition's stage input is input.txt, the same triples without labels). Labels "B" / "C";
doc_id = the record's "id" when present, else its line number; text = A; fields = {"A", "B",
"C"} (the task scores sim(A, B) against sim(A, C)).

Records without a label are read with label None when the file is unlabeled: with the option
`unlabeled: true`, or for a stage input file (input.txt / input.jsonl). A label that is present
is still checked. Without either, a missing label is a DataError.

Bad input (DataError "file:line: ..."): malformed JSON, an empty or missing A / B / C, a missing
label (unless unlabeled) or one other than B / C, a duplicate id.

Options:
  files      {split: file name} instead of the search above
  unlabeled  records may lack a label (default false; true for input.txt / input.jsonl)
"""
import os

from ernie_doc.data.document import (Document, check_label, check_options, check_text, pick_file,
                                     read_json_lines, where)
from ernie_doc.errors import DataError

FILES = {"train": ["train.json", "cail2019_scm_train.json"],
         "dev": ["valid.json", "dev.json", "cail2019_scm_dev.json"],
         "test": ["test.json", "cail2019_scm_test.json", "input.txt", "input.jsonl"]}
STAGE_INPUTS = ("input.txt", "input.jsonl")
LABELS = ["B", "C"]
OPTIONS = ("files", "unlabeled")


def labels(data_dir, options):
    check_options(options, OPTIONS)
    return list(LABELS)


def read(data_dir, split, options):
    options = check_options(options, OPTIONS)
    path = pick_file(data_dir, split, FILES, options.get("files"))
    unlabeled = options.get("unlabeled", os.path.basename(path) in STAGE_INPUTS)
    if not isinstance(unlabeled, bool):
        raise DataError(f"reader option 'unlabeled': expected true or false, got {unlabeled!r}")
    docs, seen = [], set()
    for line, record in read_json_lines(path):
        texts = {}
        for key in ("A", "B", "C"):
            if not isinstance(record.get(key), str):
                raise DataError(f"{where(path, line)}: {key!r} is missing or not a string")
            texts[key] = check_text(record[key], path, line, f"case {key}")
        if "label" in record:
            label = check_label(record["label"], LABELS, path, line)
        elif unlabeled:
            label = None
        else:
            raise DataError(f"{where(path, line)}: record has no 'label' (set the reader option "
                            f"'unlabeled: true' to read unlabeled input)")
        doc_id = str(record.get("id", line))
        if doc_id in seen:
            raise DataError(f"{where(path, line)}: duplicate id {doc_id!r}")
        seen.add(doc_id)
        docs.append(Document(doc_id, texts["A"], label, fields=texts))
    if not docs:
        raise DataError(f"{where(path)}: no examples for split {split!r}")
    return docs
