"""SemEval-2019 Task 4 Hyperpartisan News Detection, by-article (Kiesel et al. 2019).

data_dir holds `articles-*.xml` (`<articles><article id="0000182" title=...>` HTML-ish content:
`<p>`, `<a>`, `<q>` ... `</article>`) and `ground-truth-*.xml` (`<article id="0000182"
hyperpartisan="true" .../>`). A document is the character data inside one <article>, markup
dropped (as BeautifulSoup get_text in PaddleNLP; the title attribute is not part of it), then
cleaned as PaddleNLP's HYPTextPreprocessor (model_zoo/ernie-doc/data.py) does: the ends
stripped, every "\n" and "\t" deleted (so words a bare line break separates run together).
Labels "false" / "true"; doc_id = the article id.

Splits come from a split file in the Longformer format, `{"train": [182, ...], "dev": [...],
"test": [...]}` with article ids as integers ("0000182" is 182; default `hp-splits.json` in
data_dir), or from a hash of the article ids (dev_ratio, test_ratio).

Options:
  articles, ground_truth   file names under data_dir (needed when more than one matches)
  split_file               the split file (default hp-splits.json)
  dev_ratio, test_ratio    hash split of all articles instead of a split file; without
                           test_ratio there is no test split
  split_seed               integer seed of that hash (default 0)
"""
import glob
import os
from xml.parsers import expat

from ernie_doc.data.document import (Document, Skips, check_label, check_options, check_ratio,
                                     check_split, check_text, file_name, is_candidate_file,
                                     read_json_file, read_text, regular_files, require_dir,
                                     require_file, split_by_ratio, where)
from ernie_doc.errors import DataError

LABELS = ["false", "true"]
OPTIONS = ("articles", "ground_truth", "split_file", "dev_ratio", "test_ratio", "split_seed")
SPLIT_FILE = "hp-splits.json"


def labels(data_dir, options):
    check_options(options, OPTIONS)
    return list(LABELS)


def read(data_dir, split, options):
    options = check_options(options, OPTIONS)
    check_split(split)
    require_dir(data_dir)
    articles_path = _find(data_dir, options, "articles", "articles-*.xml")
    truth_path = _find(data_dir, options, "ground_truth", "ground-truth-*.xml")
    articles, truth = parse_articles(articles_path), parse_articles(truth_path)
    for article_id, (line, _, _) in truth.items():
        if article_id not in articles:
            raise DataError(f"{where(truth_path, line)}: ground truth for article id "
                            f"{article_id!r}, which {os.path.basename(articles_path)} lacks")
    docs = {}
    for article_id, (line, _, text) in articles.items():
        if article_id not in truth:
            raise DataError(f"{where(articles_path, line)}: article id {article_id!r} has no "
                            f"ground truth in {os.path.basename(truth_path)}")
        truth_line, attributes, _ = truth[article_id]
        label = check_label(attributes.get("hyperpartisan"), LABELS, truth_path, truth_line)
        text = clean(text)
        docs[article_id] = Document(article_id, check_text(text, articles_path, line), label)

    if "dev_ratio" in options:
        if "split_file" in options:
            raise DataError("reader options: 'split_file' and 'dev_ratio' both define the "
                            "split; set one")
        selected, source = _hash_split(list(docs.values()), split, options), articles_path
    elif "test_ratio" in options:
        raise DataError("reader options: 'test_ratio' needs 'dev_ratio'")
    else:
        split_path = os.path.join(data_dir, file_name(options.get("split_file", SPLIT_FILE),
                                                      "split_file"))
        if "split_file" not in options and not is_candidate_file(split_path):
            raise DataError(f"{where(data_dir)}: no {SPLIT_FILE}; set the reader option "
                            f"'split_file' or 'dev_ratio'")
        selected, source = _from_split_file(docs, split_path, split), split_path
    if not selected:
        raise DataError(f"{where(source)}: no examples for split {split!r}")
    return selected


def clean(text: str) -> str:
    """An article's character data as the model reads it (see the module docstring)."""
    # strip first, then delete: the order of HYPTextPreprocessor
    return text.strip().replace("\n", "").replace("\t", "")


def parse_articles(path):
    """{id: (line, attributes, text)} of the <article> elements under the <articles> root; text
    is the raw character data (whitespace as in the file)."""
    parser = expat.ParserCreate()
    found, parts = {}, []
    depth, current = 0, None

    def start(name, attributes):
        nonlocal depth, current
        line = parser.CurrentLineNumber
        if depth == 0 and name != "articles":
            raise DataError(f"{where(path, line)}: root element <{name}>, expected <articles>")
        if depth == 1:
            if name != "article":
                raise DataError(f"{where(path, line)}: <{name}> in <articles>, expected <article>")
            if "id" not in attributes:
                raise DataError(f"{where(path, line)}: <article> without an id")
            if attributes["id"] in found:
                raise DataError(f"{where(path, line)}: duplicate article id {attributes['id']!r}")
            current = (line, attributes)
            parts.clear()
        depth += 1

    def end(name):
        nonlocal depth
        depth -= 1
        if depth == 1:
            line, attributes = current
            found[attributes["id"]] = (line, attributes, "".join(parts))

    def data(text):
        if depth >= 2:
            parts.append(text)

    parser.StartElementHandler, parser.EndElementHandler = start, end
    parser.CharacterDataHandler = data
    # read_text first so bad bytes are reported as invalid UTF-8, not as malformed XML.
    text = read_text(path)
    try:
        parser.Parse(text, True)
    except expat.ExpatError as e:
        raise DataError(f"{where(path, e.lineno)}: malformed XML "
                        f"({expat.ErrorString(e.code)})") from None
    return found


def _find(data_dir, options, key, pattern):
    if key in options:
        return require_file(os.path.join(data_dir, file_name(options[key], key)))
    skips = Skips(data_dir, "entries")
    listed = sorted(glob.glob(os.path.join(glob.escape(os.fspath(data_dir)), pattern)))
    matches = regular_files(listed, skips)  # a FIFO would block the reader: counted instead
    skips.report(len(listed))
    if len(matches) != 1:
        raise DataError(f"{where(data_dir)}: {len(matches)} files match {pattern}, expected one "
                        f"(or set the reader option {key!r})")
    return matches[0]


def _hash_split(docs, split, options):
    dev_ratio, test_ratio = options["dev_ratio"], options.get("test_ratio")
    seed = options.get("split_seed", 0)
    if test_ratio is None:
        return split_by_ratio(docs, dev_ratio, split, seed)
    check_ratio(dev_ratio, "dev_ratio")
    check_ratio(test_ratio, "test_ratio")
    if not dev_ratio + test_ratio < 1.0:
        raise DataError(f"reader options: dev_ratio + test_ratio must be < 1, got "
                        f"{dev_ratio} + {test_ratio}")
    # Test is drawn first; dev is then drawn from the rest with another seed (the rest all
    # hash above test_ratio under the first seed), both ratios being fractions of all articles.
    if split == "test":
        return split_by_ratio(docs, test_ratio, "dev", seed)
    rest = split_by_ratio(docs, test_ratio, "train", seed)
    return split_by_ratio(rest, dev_ratio / (1.0 - test_ratio), split, seed + 1)


def _from_split_file(docs, path, split):
    table = read_json_file(path)
    if not isinstance(table, dict) or not isinstance(table.get(split), list):
        raise DataError(f"{where(path)}: expected {{\"train\": [ids], \"dev\": [ids], "
                        f"\"test\": [ids]}}, found no {split!r} list")
    by_number = {}
    for article_id, doc in docs.items():
        if not article_id.isdigit() or int(article_id) in by_number:
            raise DataError(f"{where(path)}: article id {article_id!r} cannot be named by an "
                            f"integer in a split file (not digits, or two ids with one value)")
        by_number[int(article_id)] = doc
    selected, seen = [], set()
    # The public Longformer split leaks (51 test ids are also in train, 7 dev ids in test).
    # It is followed as published, so results compare with the papers that used it.
    for number in table[split]:
        if isinstance(number, bool) or not isinstance(number, int):
            raise DataError(f"{where(path)}: {split} id {number!r} is not an integer")
        if number not in by_number:
            raise DataError(f"{where(path)}: {split} id {number} has no article")
        if number in seen:
            raise DataError(f"{where(path)}: {split} id {number} is listed twice")
        seen.add(number)
        selected.append(by_number[number])
    return selected
