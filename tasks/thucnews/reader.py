"""THUCNews news classification (the cnews subset layout).

`train.txt`, `val.txt` (dev; `dev.txt` is also accepted), `test.txt`: one `label<TAB>text` per
line, blank lines skipped. The label set is `label.txt` in data_dir (one label per line, in id
order) or else the reader option `labels`. doc_id = "split:line".

Options:
  labels         the label list, when data_dir has no label.txt
  files          {split: file name} instead of the names above
  remove_spaces  drop spaces from the text (default true, as the official reader does for
                 Chinese)
"""
import os

from ernie_doc.data.document import (Document, check_label, check_options, check_text,
                                     is_candidate_file, pick_file, read_lines, require_dir, where)
from ernie_doc.errors import DataError

FILES = {"train": ["train.txt"], "dev": ["val.txt", "dev.txt"], "test": ["test.txt"]}
OPTIONS = ("labels", "files", "remove_spaces")


def labels(data_dir, options):
    return _labels(data_dir, check_options(options, OPTIONS))


def read(data_dir, split, options):
    options = check_options(options, OPTIONS)
    path = pick_file(data_dir, split, FILES, options.get("files"))
    label_set = _labels(data_dir, options)
    docs = []
    for line, row in read_lines(path):
        if not row.strip():
            continue
        values = row.split("\t")
        if len(values) != 2:
            raise DataError(f"{where(path, line)}: {len(values)} columns, expected 2 "
                            f"(label<TAB>text)")
        label = check_label(values[0], label_set, path, line)
        text = values[1].replace(" ", "") if options.get("remove_spaces", True) else values[1]
        docs.append(Document(f"{split}:{line}", check_text(text, path, line), label))
    if not docs:
        raise DataError(f"{where(path)}: no examples for split {split!r}")
    return docs


def _labels(data_dir, options):
    path = os.path.join(require_dir(data_dir), "label.txt")
    given = options.get("labels")
    if given is not None:
        if not isinstance(given, list):
            raise DataError(f"reader option 'labels': expected a list, got {given!r}")
        given = [str(label) for label in given]
    if not is_candidate_file(path):
        if given is None:
            raise DataError(f"{where(path)}: file does not exist (or set the reader option "
                            f"'labels')")
        found, path = given, "reader option 'labels'"
    else:
        found = [label.strip() for _, label in read_lines(path) if label.strip()]
        # Two label lists that disagree would silently reorder the ids; refuse instead.
        if given is not None and given != found:
            raise DataError(f"{where(path)}: differs from the reader option 'labels'")
    if not found:
        raise DataError(f"{path}: no labels")
    if len(set(found)) != len(found):
        raise DataError(f"{path}: duplicate labels")
    return found
