"""IMDB movie reviews (aclImdb v1, Maas et al. 2011), binary sentiment: "0" = neg, "1" = pos.

Two layouts, found per split under data_dir:

* aclImdb folders: `train/{pos,neg}/*.txt`, `test/{pos,neg}/*.txt`, one review per file named
  `ID_RATING.txt`; doc_id "train/pos/ID_RATING".
* ERNIE-Doc TSV: `train.txt`, `test.txt`, a header row naming the columns (`qid label score
  text_a`; `label` and `text_a` required), fields split on tabs with no quoting (the official
  reader uses csv with quotechar=None); doc_id = qid, else the line number. Other columns go
  to Document.fields. Blank lines are skipped.

Both get the official cleaning (ERNIE-Doc `data/imdb/multi_files_to_one.py`, PaddleNLP's
ImdbTextPreprocessor): lines stripped and joined with a space, each `<br /><br />` pair becomes a
space, tabs dropped. A lone `<br />` stays in the text as the references leave it (the tokenizer
then reads it as "<", "br", " />"). Runs of
whitespace are not reproduced byte for byte (empty lines are dropped, the ends stripped): the
tokenizer collapses whitespace first, so the tokens are the same. The official code evaluates
on test, so "dev" reads test unless options say otherwise.

Options:
  file        one TSV under data_dir (e.g. imdb_test_sample5k.tsv) split into train/dev by
              dev_ratio, which it then needs
  dev_ratio   dev = this fraction of the train data (or of `file`), by hash of doc_id
  split_seed  integer seed of that hash (default 0)
  dev_split   folder / file stem read as dev when there is no dev_ratio (default "test")
"""
import itertools
import os

from ernie_doc.data.document import (Document, Skips, check_label, check_options, check_split,
                                     check_text, file_name, is_candidate_file, read_text, read_tsv,
                                     regular_files, require_dir, split_by_ratio, where)
from ernie_doc.errors import DataError

LABELS = ["0", "1"]
OPTIONS = ("file", "dev_ratio", "split_seed", "dev_split")
FOLDERS = (("neg", "0"), ("pos", "1"))


def labels(data_dir, options):
    check_options(options, OPTIONS)
    return list(LABELS)


def read(data_dir, split, options):
    options = check_options(options, OPTIONS)
    check_split(split)
    ratio, seed = options.get("dev_ratio"), options.get("split_seed", 0)
    if ratio is not None and "dev_split" in options:
        raise DataError("reader options: 'dev_ratio' and 'dev_split' both choose the dev data; "
                        "set one")
    if "file" in options:
        if ratio is None:
            raise DataError("reader options: 'file' needs 'dev_ratio' (the file is split into "
                            "train and dev)")
        path = os.path.join(require_dir(data_dir), file_name(options["file"], "file"))
        docs = split_by_ratio(_read_tsv(path), ratio, split, seed)
    elif ratio is not None and split != "test":
        path, docs = _read_layout(data_dir, "train")
        docs = split_by_ratio(docs, ratio, split, seed)
    else:
        name = file_name(options.get("dev_split", "test"), "dev_split") if split == "dev" \
            else split
        path, docs = _read_layout(data_dir, name)
    if not docs:
        raise DataError(f"{where(path)}: no examples for split {split!r}")
    return docs


def read_input(path, options):
    """One TSV file in the official layout, whatever its name, read whole (what `ernie-doc
    predict --format task --input FILE` reads; the split options do not apply)."""
    check_options(options, OPTIONS)
    docs = _read_tsv(path)
    if not docs:
        raise DataError(f"{where(path)}: no examples")
    return docs


def clean(text: str) -> str:
    """A review as the official IMDB preprocessing leaves it (up to whitespace runs): lines
    stripped and joined by a space, `<br /><br />` → " ", tabs removed."""
    text = " ".join(line.strip() for line in text.split("\n") if line.strip())
    text = text.replace("<br /><br />", " ")
    return text.replace("\t", "").strip()


def _read_layout(data_dir, name):
    """(path, documents) of the aclImdb folder `name/` or else the TSV `name.txt`."""
    folder = os.path.join(require_dir(data_dir), name)
    if os.path.isdir(folder):
        return folder, _read_folder(folder, name)
    path = folder + ".txt"
    if is_candidate_file(path):
        return path, _read_tsv(path)
    raise DataError(f"{where(folder)}: neither an aclImdb folder ({name}/pos, {name}/neg) nor "
                    f"a TSV file {name}.txt exists; {_one_file_hint(data_dir)}")


def _one_file_hint(data_dir):
    """How to read one TSV file of data_dir instead, named when data_dir holds *.tsv files."""
    with os.scandir(data_dir) as entries:   # a look at a bounded number of names
        names = sorted(entry.name for entry in itertools.islice(entries, 10000)
                       if entry.name.endswith(".tsv") and entry.is_file())
    example = names[0] if names else "FILE.tsv"
    found = f" ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''} here)" if names else ""
    return (f"to split one TSV file{found} into train and dev, give reader.file={example} "
            f"reader.dev_ratio=0.2 (the dev fraction)")


def _read_folder(folder, name):
    docs = []
    for polarity, label in FOLDERS:
        sub = require_dir(os.path.join(folder, polarity), "aclImdb label folder")
        # Only *.txt are reviews; aclImdb keeps nothing else here, so other names are OS or
        # editor files. A *.txt that is not a regular file (a FIFO would block) is counted.
        skips = Skips(sub, "entries")
        names = sorted(f for f in os.listdir(sub) if f.endswith(".txt"))
        for path in regular_files([os.path.join(sub, f) for f in names], skips):
            text = check_text(clean(read_text(path)), path)
            stem = os.path.basename(path)[:-4]
            docs.append(Document(f"{name}/{polarity}/{stem}", text, label))
        skips.report(len(names))
    return docs


def _read_tsv(path):
    docs, seen = [], set()
    for line, record in read_tsv(path, ("label", "text_a"))[1]:
        doc_id = record.pop("qid", str(line))
        if doc_id in seen:
            raise DataError(f"{where(path, line)}: duplicate qid {doc_id!r}")
        seen.add(doc_id)
        label = check_label(record.pop("label"), LABELS, path, line)
        text = check_text(clean(record.pop("text_a")), path, line)
        docs.append(Document(doc_id, text, label, fields=record))
    return docs
