"""Task readers (tasks/*/reader.py): tiny fixtures in the official formats, every bad-input
case as a one-line DataError naming file and line, and the real ../shared data when present."""
import collections
import json

import pytest
from helpers import error, shared_path, write

from ernie_doc.data.document import Document
from tasks.hyp import reader as hyp
from tasks.iflytek import reader as iflytek
from tasks.imdb import reader as imdb
from tasks.thucnews import reader as thucnews


def check_ratio_split(train, dev, total):
    ids_train, ids_dev = {d.doc_id for d in train}, {d.doc_id for d in dev}
    assert len(ids_train) == len(train) and len(ids_dev) == len(dev)
    assert not ids_train & ids_dev
    assert len(train) + len(dev) == total


# ---------------------------------------------------------------------------------- imdb

ACL = {
    "train/pos/1_8.txt": "Great film.<br /><br />Loved\tit.",
    "train/pos/10_9.txt": "Superb<br />acting.\n",
    "train/neg/0_2.txt": "  Bad.  \n\nReally bad. \r\n",
    "test/pos/5_10.txt": "Fine.",
    "test/neg/3_1.txt": "Awful.",
    "train/unsup/7_0.txt": "not read",
    "train/urls_pos.txt": "not read",
}

TSV_HEADER = "qid\tlabel\tscore\ttext_a\n"


def tsv(rows, header=TSV_HEADER):
    return header + "".join("\t".join(row) + "\n" for row in rows)


def test_imdb_acl_layout(tmp_path):
    root = write(tmp_path, ACL)
    assert imdb.labels(root, {}) == ["0", "1"]
    # only <br /><br /> becomes a space, as the official script: a lone <br /> stays
    assert imdb.read(root, "train", {}) == [
        Document("train/neg/0_2", "Bad. Really bad.", "0"),
        Document("train/pos/10_9", "Superb<br />acting.", "1"),
        Document("train/pos/1_8", "Great film. Lovedit.", "1"),
    ]
    test = [Document("test/neg/3_1", "Awful.", "0"), Document("test/pos/5_10", "Fine.", "1")]
    assert imdb.read(root, "test", {}) == test
    assert imdb.read(root, "dev", {}) == test  # the official code evaluates on test
    assert [d.doc_id for d in imdb.read(root, "dev", {"dev_split": "train"})] == [
        "train/neg/0_2", "train/pos/10_9", "train/pos/1_8"]


def test_imdb_tsv_layout(tmp_path):
    root = write(tmp_path, {
        "train.txt": tsv([("7", "1", "8", "Good.<br /><br />Very good. "),
                          ("9", "0", "2", "Bad")]),
        "test.txt": tsv([("4", "0", "1", "Meh")]) + "\n",
    })
    assert imdb.read(root, "train", None) == [
        Document("7", "Good. Very good.", "1", fields={"score": "8"}),
        Document("9", "Bad", "0", fields={"score": "2"}),
    ]
    assert imdb.read(root, "dev", {}) == [Document("4", "Meh", "0", fields={"score": "1"})]
    assert imdb.read(root, "test", {}) == imdb.read(root, "dev", {})


def test_imdb_tsv_without_qid_uses_line_numbers(tmp_path):
    root = write(tmp_path, {"test.txt": "label\ttext_a\n1\tA\n0\tB\n"})
    assert imdb.read(root, "test", {}) == [Document("2", "A", "1"), Document("3", "B", "0")]


def test_imdb_single_file_ratio_split(tmp_path):
    rows = [(str(i), str(i % 2), "5", f"review {i}") for i in range(60)]
    root = write(tmp_path, {"sample.tsv": tsv(rows)})
    options = {"file": "sample.tsv", "dev_ratio": 0.25}
    train, dev = imdb.read(root, "train", options), imdb.read(root, "dev", options)
    check_ratio_split(train, dev, 60)
    assert (len(train), len(dev)) == (43, 17)
    assert imdb.read(root, "dev", options) == dev  # deterministic
    other = imdb.read(root, "dev", dict(options, split_seed=1))
    assert {d.doc_id for d in other} != {d.doc_id for d in dev}
    error(lambda: imdb.read(root, "test", options), "split 'test'")
    error(lambda: imdb.read(root, "train", {"file": "sample.tsv"}), "'file' needs 'dev_ratio'")


def test_imdb_dev_ratio_holds_out_train(tmp_path):
    files = {f"train/{'pos' if i % 2 else 'neg'}/{i}_5.txt": f"review {i}" for i in range(40)}
    root = write(tmp_path, dict(files, **{"test/pos/0_9.txt": "x", "test/neg/1_1.txt": "y"}))
    options = {"dev_ratio": 0.3, "split_seed": 3}
    train, dev = imdb.read(root, "train", options), imdb.read(root, "dev", options)
    check_ratio_split(train, dev, 40)
    assert all(d.doc_id.startswith("train/") for d in train + dev)
    assert len(imdb.read(root, "test", options)) == 2
    error(lambda: imdb.read(root, "dev", dict(options, dev_split="test")),
          "'dev_ratio' and 'dev_split'")


@pytest.mark.parametrize("files, split, options, parts", [
    ({"test.txt": tsv([("1", "1", "5", "ok"), ("2", "1", "x")])}, "test", {},
     ["test.txt:3:", "3 columns"]),
    ({"test.txt": tsv([("1", "2", "5", "ok")])}, "test", {}, ["test.txt:2:", "label '2'"]),
    ({"test.txt": tsv([("1", "1", "5", "ok"), ("2", "0", "5", " <br /><br /> ")])}, "test", {},
     ["test.txt:3:", "empty document"]),
    ({"test.txt": TSV_HEADER.encode() + b"1\t1\t5\tgood \xff\n"}, "test", {},
     ["test.txt:2:", "invalid UTF-8"]),
    ({"test.txt": "qid\tlabel\ttext\n"}, "test", {}, ["test.txt:1:", "'text_a'"]),
    ({"test.txt": tsv([("1", "1", "5", "a"), ("1", "0", "5", "b")])}, "test", {},
     ["test.txt:3:", "duplicate qid '1'"]),
    ({"test.txt": TSV_HEADER}, "test", {}, ["test.txt:", "no examples for split 'test'"]),
    ({"test/pos/1_9.txt": "\n  \n", "test/neg/2_1.txt": "x"}, "test", {},
     ["1_9.txt:", "empty document"]),
    ({"test/pos/1_9.txt": b"ok\n\xc3(", "test/neg/2_1.txt": "x"}, "test", {},
     ["1_9.txt:2:", "invalid UTF-8"]),
    ({"test/pos/1_9.txt": "x"}, "test", {}, ["test/neg:", "does not exist"]),
    ({"test/pos/readme": "x", "test/neg/.keep": ""}, "test", {}, ["test:", "no examples"]),
    ({"test.txt": tsv([])}, "train", {}, ["train:", "neither an aclImdb folder", "train.txt"]),
    ({"test.txt": tsv([])}, "train", {"file": "gone.tsv", "dev_ratio": 0.2},
     ["gone.tsv:", "does not exist"]),
    ({"test.txt": tsv([])}, "test", {"dev_fraction": 0.2}, ["unknown key 'dev_fraction'"]),
])
def test_imdb_bad_input(tmp_path, files, split, options, parts):
    root = write(tmp_path, files)
    error(lambda: imdb.read(root, split, options), *parts)


def test_imdb_missing_dir(tmp_path):
    error(lambda: imdb.read(tmp_path / "nope", "train", {}), "nope:", "does not exist")
    error(lambda: imdb.read(tmp_path, "validation", {}), "split 'validation'")


# ----------------------------------------------------------------------------------- hyp

def articles_xml(articles):
    body = "".join(f'<article id="{i}" published-at="2018-01-01" title="T {i}">\n{text}\n'
                   f'</article>\n' for i, text in articles)
    return f'<?xml version="1.0" encoding="UTF-8"?><articles>\n{body}</articles>\n'


def truth_xml(labels):
    body = "".join(f'<article hyperpartisan="{label}" id="{i}" labeled-by="article" '
                   f'url="http://x/{i}"/>\n' for i, label in labels)
    return f'<?xml version="1.0" ?>\n<articles>\n{body}</articles>\n'


HYP_ARTICLES = [
    ("0000001", '<p>Hello <a href="http://x" type="external">world</a>!</p>\n'
                '<p>Second\tline &amp; <q>more</q></p>'),
    ("0000002", "Plain   text,\n\n  two lines."),
    ("0000003", "<p>a</p><p>b</p>"),
    ("0000010", "<p>Ten &#160;days</p>"),
]
HYP_TRUTH = [("0000001", "true"), ("0000002", "false"), ("0000003", "false"), ("0000010", "true")]


def hyp_dir(tmp_path, articles=HYP_ARTICLES, truth=HYP_TRUTH, split=None, extra=None):
    files = {"articles-training-byarticle-20181122.xml": articles_xml(articles),
             "ground-truth-training-byarticle-20181122.xml": truth_xml(truth)}
    if split is not None:
        files["hp-splits.json"] = json.dumps(split)
    return write(tmp_path, dict(files, **(extra or {})))


def test_hyp_split_file(tmp_path):
    # 1 is in train and test, like the leak in the public Longformer split: followed, not fixed.
    root = hyp_dir(tmp_path, split={"train": [2, 1, 10], "dev": [3], "test": [1]})
    assert hyp.labels(root, {}) == ["false", "true"]
    # PaddleNLP's rule: ends stripped, every "\n" and "\t" deleted (words they alone
    # separate run together), other whitespace kept as it is
    hello = Document("0000001", "Hello world!Secondline & more", "true")
    assert hyp.read(root, "train", {}) == [
        Document("0000002", "Plain   text,  two lines.", "false"), hello,
        Document("0000010", "Ten \xa0days", "true")]
    assert hyp.read(root, "dev", {}) == [Document("0000003", "ab", "false")]
    assert hyp.read(root, "test", {}) == [hello]


def test_hyp_split_file_option(tmp_path):
    split = {"train": [], "dev": [], "test": [10]}
    root = hyp_dir(tmp_path, extra={"my-split.json": json.dumps(split)})
    options = {"split_file": "my-split.json"}
    assert [d.doc_id for d in hyp.read(root, "test", options)] == ["0000010"]
    error(lambda: hyp.read(root, "train", options), "my-split.json:", "no examples")


def test_hyp_hash_split(tmp_path):
    articles = [(f"{i:07d}", f"<p>article {i}</p>") for i in range(50)]
    truth = [(f"{i:07d}", "true" if i % 3 else "false") for i in range(50)]
    root = hyp_dir(tmp_path, articles, truth)
    options = {"dev_ratio": 0.2, "test_ratio": 0.2, "split_seed": 7}
    parts = {s: hyp.read(root, s, options) for s in ("train", "dev", "test")}
    ids = [{d.doc_id for d in parts[s]} for s in ("train", "dev", "test")]
    assert sum(map(len, ids)) == 50 and len(set().union(*ids)) == 50
    assert [len(i) for i in ids] == [len(parts[s]) for s in ("train", "dev", "test")]
    assert all(len(i) >= 4 for i in ids)
    assert hyp.read(root, "dev", options) == parts["dev"]
    two_way = {"dev_ratio": 0.2}
    check_ratio_split(hyp.read(root, "train", two_way), hyp.read(root, "dev", two_way), 50)
    error(lambda: hyp.read(root, "test", two_way), "split 'test'")
    error(lambda: hyp.read(root, "dev", {"dev_ratio": 0.6, "test_ratio": 0.5}), "must be < 1")


@pytest.mark.parametrize("articles, truth, split, extra, options, parts", [
    ([("0000001", "<p>ok</p>"), ("0000002", "<p>unclosed</article>")], HYP_TRUTH[:2], None,
     None, {},
     ["articles-training-byarticle-20181122.xml:6:", "malformed XML (mismatched tag)"]),
    (HYP_ARTICLES, HYP_TRUTH[:3], None, None, {},
     ["articles-training-byarticle-20181122.xml:14:", "'0000010' has no ground truth"]),
    (HYP_ARTICLES[:3], HYP_TRUTH, None, None, {},
     ["ground-truth-training-byarticle-20181122.xml:6:", "'0000010'", "lacks"]),
    (HYP_ARTICLES, HYP_TRUTH[:3] + [("0000010", "maybe")], None, None, {},
     ["ground-truth-training-byarticle-20181122.xml:6:", "label 'maybe'"]),
    (HYP_ARTICLES[:3] + [("0000010", "<p> </p>")], HYP_TRUTH, None, None, {},
     ["articles-training-byarticle-20181122.xml:14:", "empty document"]),
    (HYP_ARTICLES + [("0000001", "again")], HYP_TRUTH, None, None, {},
     ["articles-training-byarticle-20181122.xml:17:", "duplicate article id '0000001'"]),
    (HYP_ARTICLES, HYP_TRUTH, {"train": [1, 99]}, None, {},
     ["hp-splits.json:", "train id 99 has no article"]),
    (HYP_ARTICLES, HYP_TRUTH, {"train": ["0000001"]}, None, {},
     ["hp-splits.json:", "not an integer"]),
    (HYP_ARTICLES, HYP_TRUTH, {"dev": [1]}, None, {}, ["hp-splits.json:", "no 'train' list"]),
    (HYP_ARTICLES, HYP_TRUTH, None, {"hp-splits.json": '{"train": [1,\n 2,]}'}, {},
     ["hp-splits.json:2:", "invalid JSON"]),
    (HYP_ARTICLES, HYP_TRUTH, None, None, {},
     ["no hp-splits.json", "'split_file' or 'dev_ratio'"]),
    (HYP_ARTICLES, HYP_TRUTH, None, {"articles-other.xml": "<articles/>"}, {"dev_ratio": 0.5},
     ["2 files match articles-*.xml"]),
    (HYP_ARTICLES, HYP_TRUTH, None, None, {"split": "x"}, ["unknown key 'split'"]),
])
def test_hyp_bad_input(tmp_path, articles, truth, split, extra, options, parts):
    root = hyp_dir(tmp_path, articles, truth, split, extra)
    error(lambda: hyp.read(root, "train", options), *parts)


def test_hyp_bad_bytes_and_missing_files(tmp_path):
    root = hyp_dir(tmp_path, split={"train": [1]})
    path = root / "articles-training-byarticle-20181122.xml"
    path.write_bytes(path.read_bytes().replace(b"Hello", b"Hel\xfflo"))
    error(lambda: hyp.read(root, "train", {}), "byarticle-20181122.xml:3:", "invalid UTF-8")
    (root / "ground-truth-training-byarticle-20181122.xml").unlink()
    error(lambda: hyp.read(root, "train", {}), "0 files match ground-truth-*.xml")
    error(lambda: hyp.read(root, "train", {"ground_truth": "gt.xml"}), "gt.xml:", "does not exist")
    error(lambda: hyp.read(tmp_path / "nope", "train", {}), "nope:", "does not exist")
    write(tmp_path, {"other/articles-x.xml": "<docs/>", "other/ground-truth-x.xml": "<articles/>"})
    error(lambda: hyp.read(tmp_path / "other", "train", {}), "articles-x.xml:1:",
          "expected <articles>")


# ------------------------------------------------------------------------------- iflytek

def jsonl(records):
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def test_iflytek_fewclue_files(tmp_path):
    root = write(tmp_path, {
        "train_few_all.json": jsonl([
            {"label": 10, "label_des": "社区服务", "sentence": "行讯通 是 app", "id": 0},
            {"label": "113", "label_des": "其他", "sentence": "另一个", "id": 153}]) + "\n  \n",
        "dev_few_all.json": jsonl([{"label": 0, "label_des": "打车", "sentence": "打车软件", "id": 5}]),
        "test.json": jsonl([{"sentence": "no label", "id": 1}]),
        "test_public.json": jsonl([{"label": 118, "label_des": "x", "sentence": "最后", "id": 9}]),
    })
    assert iflytek.labels(root, {}) == [str(i) for i in range(119)]
    assert iflytek.read(root, "train", {}) == [
        Document("0", "行讯通是app", "10"), Document("153", "另一个", "113")]
    assert iflytek.read(root, "train", {"remove_spaces": False})[0].text == "行讯通 是 app"
    assert iflytek.read(root, "dev", {}) == [Document("5", "打车软件", "0")]
    assert iflytek.read(root, "test", {}) == [Document("9", "最后", "118")]
    error(lambda: iflytek.read(root, "test", {"files": {"test": "test.json"}}),
          "test.json:1:", "no 'label'")


def test_iflytek_clue_files_and_labels_json(tmp_path):
    root = write(tmp_path, {
        "labels.json": jsonl([{"label": "0", "label_des": "打车"},
                              {"label": "1", "label_des": "地图导航"}]),
        "train.json": jsonl([{"label": "1", "label_des": "地图导航", "sentence": "地图"},
                             {"label": "0", "label_des": "打车", "sentence": "打车"}]),
        "train_few_all.json": "not read",
        "dev.json": jsonl([{"label": "5", "sentence": "x"}]),
    })
    assert iflytek.labels(root, None) == ["0", "1"]
    assert iflytek.read(root, "train", {}) == [Document("1", "地图", "1"), Document("2", "打车", "0")]
    error(lambda: iflytek.read(root, "dev", {}), "dev.json:1:", "label '5'")


@pytest.mark.parametrize("content, parts", [
    ('{"label": "1", "sentence": "a", "id": 1}\n{"label": "2", "sentence": "b",\n',
     ["train.json:2:", "invalid JSON"]),
    ('\n{"sentence": "a", "id": 1}\n', ["train.json:2:", "no 'label'"]),
    ('{"label": 119, "sentence": "a", "id": 1}\n', ["train.json:1:", "label '119'"]),
    ('{"label": 3, "sentence": "   ", "id": 1}\n', ["train.json:1:", "empty document"]),
    ('{"label": 3, "id": 1}\n', ["train.json:1:", "'sentence' is missing"]),
    ('[1, 2]\n', ["train.json:1:", "expected a JSON object"]),
    ('{"label": 3, "sentence": "a", "id": 1}\n{"label": 4, "sentence": "b", "id": 1}\n',
     ["train.json:2:", "duplicate id '1'"]),
    (b'{"label": 3, "sentence": "a"}\n{"label": 3, "sentence": "\xe4\xb8"}\n',
     ["train.json:2:", "invalid UTF-8"]),
    ("\n\n", ["train.json:", "no examples for split 'train'"]),
])
def test_iflytek_bad_input(tmp_path, content, parts):
    root = write(tmp_path, {"train.json": content})
    error(lambda: iflytek.read(root, "train", {}), *parts)


def test_iflytek_bad_options_and_missing_files(tmp_path):
    root = write(tmp_path, {"train.json": jsonl([{"label": 1, "sentence": "a"}])})
    read = iflytek.read
    error(lambda: read(root, "dev", {}), "no dev.json or dev_few_all.json for split 'dev'")
    error(lambda: read(root, "train", {"files": {"train": "x.json"}}), "x.json:", "does not exist")
    error(lambda: read(root, "train", {"files": {"training": "x.json"}}), "unknown key 'training'")
    error(lambda: read(root, "train", {"files": "x.json"}), "'files': expected a mapping")
    error(lambda: read(root, "train", {"remove_space": True}), "unknown key 'remove_space'")
    error(lambda: iflytek.labels(root, {"label": 1}), "unknown key 'label'")
    error(lambda: iflytek.read(tmp_path / "nope", "train", {}), "nope:", "does not exist")


# ------------------------------------------------------------------------------ thucnews

def test_thucnews(tmp_path):
    root = write(tmp_path, {
        "label.txt": "体育\n财经\n\n",
        "train.txt": "体育\t马晓旭 意外受伤\n\n财经\t基金 上涨\n",
        "val.txt": "财经\t股市\n",
        "dev.txt": "not read",
        "test.txt": "体育\t比赛\n",
    })
    assert thucnews.labels(root, {}) == ["体育", "财经"]
    assert thucnews.read(root, "train", {}) == [
        Document("train:1", "马晓旭意外受伤", "体育"), Document("train:3", "基金上涨", "财经")]
    assert thucnews.read(root, "train", {"remove_spaces": False})[1].text == "基金 上涨"
    assert thucnews.read(root, "dev", {}) == [Document("dev:1", "股市", "财经")]
    assert thucnews.read(root, "test", {"labels": ["体育", "财经"]}) == [
        Document("test:1", "比赛", "体育")]
    error(lambda: thucnews.read(root, "test", {"labels": ["财经", "体育"]}), "label.txt:", "differs")


def test_thucnews_labels_option_and_dev_txt(tmp_path):
    root = write(tmp_path, {"dev.txt": "b\tx\na\ty\n"})
    options = {"labels": ["a", "b"]}
    assert thucnews.labels(root, options) == ["a", "b"]
    assert thucnews.read(root, "dev", options) == [
        Document("dev:1", "x", "b"), Document("dev:2", "y", "a")]
    error(lambda: thucnews.read(root, "dev", {}), "label.txt:", "'labels'")
    error(lambda: thucnews.read(root, "dev", {"labels": ["a", "a", "b"]}), "duplicate labels")


@pytest.mark.parametrize("content, parts", [
    ("a\tok\nno tab here\n", ["train.txt:2:", "1 columns"]),
    ("a\tok\n\na\tone\ttwo\n", ["train.txt:3:", "3 columns"]),
    ("a\tok\nc\tx\n", ["train.txt:2:", "label 'c'"]),
    ("a\t  \n", ["train.txt:1:", "empty document"]),
    (b"a\tok\nb\t\xff\n", ["train.txt:2:", "invalid UTF-8"]),
    ("\n", ["train.txt:", "no examples for split 'train'"]),
])
def test_thucnews_bad_input(tmp_path, content, parts):
    root = write(tmp_path, {"label.txt": "a\nb\n", "train.txt": content})
    error(lambda: thucnews.read(root, "train", {}), *parts)


def test_thucnews_missing(tmp_path):
    root = write(tmp_path, {"label.txt": "a\n"})
    error(lambda: thucnews.read(root, "test", {}), "no test.txt for split 'test'")
    error(lambda: thucnews.read(root, "dev", {}), "no val.txt or dev.txt")
    error(lambda: thucnews.read(tmp_path / "nope", "train", {}), "nope:", "does not exist")
    error(lambda: thucnews.read(root, "train", {"label_file": "x"}), "unknown key 'label_file'")


# ----------------------------------------------------------------------------- real data

def test_real_imdb_sample():
    path = shared_path("data", "imdb", "imdb_test_sample5k.tsv")
    options = {"file": path.name, "dev_ratio": 0.2}
    train, dev = imdb.read(path.parent, "train", options), imdb.read(path.parent, "dev", options)
    check_ratio_split(train, dev, 5000)
    assert (len(train), len(dev)) == (3978, 1022)
    assert collections.Counter(d.label for d in train + dev) == {"1": 2556, "0": 2444}
    assert 0.4 < sum(d.label == "1" for d in dev) / len(dev) < 0.6
    assert not any("<br />" in d.text or "\t" in d.text for d in train + dev)


def test_real_hyperpartisan():
    root = shared_path("data", "hyperpartisan")
    splits = {s: hyp.read(root, s, {}) for s in ("train", "dev", "test")}
    assert [len(splits[s]) for s in ("train", "dev", "test")] == [516, 64, 65]
    ids = [{d.doc_id for d in splits[s]} for s in ("train", "dev", "test")]
    assert len(ids[0] & ids[2]) == 51 and len(ids[1] & ids[2]) == 7  # the published leak
    articles = hyp.parse_articles(root / "articles-training-byarticle-20181122.xml")
    assert len(articles) == 645
    assert collections.Counter(d.label for d in splits["train"]) == {"false": 329, "true": 187}


def test_real_iflytek_fewclue():
    root = shared_path("data", "iflytek")
    label_set = set(iflytek.labels(root, {}))
    counts = {}
    for split in ("train", "dev", "test"):
        docs = iflytek.read(root, split, {})
        assert {d.label for d in docs} <= label_set
        counts[split] = (len(docs), len({d.label for d in docs}))
    assert counts == {"train": (3024, 119), "dev": (1373, 117), "test": (1749, 98)}
