"""DRCD, Delta Reading Comprehension Dataset (Shao et al. 2018): traditional Chinese
span-extraction reading comprehension, SQuAD-v1-style JSON.

`{"version", "data": [{"id", "title", "paragraphs": [{"id", "context", "qas": [{"id",
"question", "answers": [{"id", "text", "answer_start"}]}]}]}]}`. Nothing is converted to
simplified characters: the tokenizer maps characters its vocabulary lacks to [UNK] without
moving offsets. One Document per question; the fields, the answer alignment and the bad-input
policy are those of ernie_doc.data.squad.

Files per split, the first that exists: DRCD_training.json / train.json, DRCD_dev.json /
dev.json, DRCD_test.json / test.json.

Options:
  files                 {split: file name} instead of the search above
  skip_empty_questions  skip (and count) questions whose text is empty instead of raising
                        DataError (default false)
"""
from ernie_doc.data.document import check_options, pick_file
from ernie_doc.data.squad import read_squad

FILES = {"train": ["DRCD_training.json", "train.json"],
         "dev": ["DRCD_dev.json", "dev.json"],
         "test": ["DRCD_test.json", "test.json"]}
OPTIONS = ("files", "skip_empty_questions")


def read(data_dir, split, options):
    options = check_options(options, OPTIONS)
    path = pick_file(data_dir, split, FILES, options.get("files"))
    return read_squad(path, split, bool(options.get("skip_empty_questions", False)))
