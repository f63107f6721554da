"""IFLYTEK app-description classification, 119 classes (CLUE; FewCLUE re-split).

JSON lines `{"label": "0".."118" (string or int, 113 and "113" are one label), "label_des": ...,
"sentence": ..., "id": ...}`; blank lines are skipped. Files per split, the first that exists:
train.json / train_few_all.json, dev.json / dev_few_all.json, test_public.json / test.json
(CLUE's test.json has no labels, so FewCLUE's labelled test_public.json comes first). The label
set is labels.json when present (CLUE ships it: JSON lines with a "label" field, in id order),
else "0".."118". doc_id = the record's id, else its line number.

Options:
  files          {split: file name} instead of the search above
  remove_spaces  drop spaces from the text (default true, as the official reader does for
                 Chinese)
"""
import os

from ernie_doc.data.document import (Document, check_label, check_options, check_text,
                                     is_candidate_file, pick_file, read_json_lines, where)
from ernie_doc.errors import DataError

FILES = {"train": ["train.json", "train_few_all.json"],
         "dev": ["dev.json", "dev_few_all.json"],
         "test": ["test_public.json", "test.json"]}
NUM_LABELS = 119
OPTIONS = ("files", "remove_spaces")


def labels(data_dir, options):
    check_options(options, OPTIONS)
    return _labels(data_dir)


def read(data_dir, split, options):
    options = check_options(options, OPTIONS)
    path = pick_file(data_dir, split, FILES, options.get("files"))
    label_set = _labels(data_dir)
    docs, seen = [], set()
    for line, record in read_json_lines(path):
        if "label" not in record:
            raise DataError(f"{where(path, line)}: record has no 'label'")
        label = check_label(str(record["label"]), label_set, path, line)
        text = record.get("sentence")
        if not isinstance(text, str):
            raise DataError(f"{where(path, line)}: 'sentence' is missing or not a string")
        if options.get("remove_spaces", True):
            text = text.replace(" ", "")
        doc_id = str(record.get("id", line))
        if doc_id in seen:
            raise DataError(f"{where(path, line)}: duplicate id {doc_id!r}")
        seen.add(doc_id)
        docs.append(Document(doc_id, check_text(text, path, line), label))
    if not docs:
        raise DataError(f"{where(path)}: no examples for split {split!r}")
    return docs


def _labels(data_dir):
    path = os.path.join(data_dir, "labels.json")
    if not is_candidate_file(path):
        return [str(i) for i in range(NUM_LABELS)]
    found = []
    for line, record in read_json_lines(path):
        if "label" not in record:
            raise DataError(f"{where(path, line)}: record has no 'label'")
        label = str(record["label"])
        if label in found:
            raise DataError(f"{where(path, line)}: duplicate label {label!r}")
        found.append(label)
    if not found:
        raise DataError(f"{where(path)}: no labels")
    return found
