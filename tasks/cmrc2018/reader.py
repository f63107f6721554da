"""CMRC2018 span-extraction reading comprehension (Cui et al. 2019), SQuAD-v1-style JSON.

`{"version", "data": [{"id", "title", "paragraphs": [{"id", "context", "qas": [{"id",
"question", "answers": [{"text", "answer_start"}]}]}]}]}` (the dev and trial sets have up to three
answers per question). One Document per question; the fields, the answer alignment and the
bad-input policy are those of ernie_doc.data.squad.

Files per split, the first that exists: train cmrc2018_train.json / train.json, dev
cmrc2018_dev.json / dev.json, test cmrc2018_test.json / cmrc2018_trial.json (the official test
set is hidden; the trial set is a separate labelled set). Do not train on the trial set and
test on it too: with `files: {train: cmrc2018_trial.json}` set test to another file.

Known data issues: the public dev set has 193 answers with answer_start -1 whose text is not in
the context (dropped from "answers", kept in "references") and 7 misaligned answer_starts
(realigned); the trial set has 5 misaligned answer_starts and two empty questions.

Options:
  files                 {split: file name} instead of the search above
  skip_empty_questions  skip (and count) questions whose text is empty instead of raising
                        DataError (default false; the trial set needs it)
"""
from ernie_doc.data.document import check_options, pick_file
from ernie_doc.data.squad import read_squad

FILES = {"train": ["cmrc2018_train.json", "train.json"],
         "dev": ["cmrc2018_dev.json", "dev.json"],
         "test": ["cmrc2018_test.json", "cmrc2018_trial.json"]}
OPTIONS = ("files", "skip_empty_questions")


def read(data_dir, split, options):
    options = check_options(options, OPTIONS)
    path = pick_file(data_dir, split, FILES, options.get("files"))
    return read_squad(path, split, bool(options.get("skip_empty_questions", False)))
