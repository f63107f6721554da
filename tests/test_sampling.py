"""max_examples draws a seeded random sample (stratified by label when the documents carry
labels), so a file sorted by label no longer gives a one-class split; each split's label counts
are logged, and a split with one class of several is a warning."""
from collections import Counter

import pytest
from helpers import write

from ernie_doc.data.document import Document
from ernie_doc.kinds import build_task
from ernie_doc.kinds.document import label_notes
from ernie_doc.run_config import load_config


@pytest.fixture(scope="module")
def sorted_imdb(tmp_path_factory):
    """One IMDB TSV of 300 reviews sorted by label (200 "0", then 100 "1"), as the shared
    imdb_test_sample5k.tsv is."""
    rows = ["qid\tlabel\tscore\ttext_a"]
    rows += [f"{i}\t{0 if i < 200 else 1}\t{2 if i < 200 else 9}\treview number {i} of the "
             f"sorted file" for i in range(300)]
    root = tmp_path_factory.mktemp("imdb")
    return write(root, {"sorted.tsv": "\n".join(rows) + "\n"})


def imdb_task(data, *extra):
    return build_task(load_config(None, [
        "task=imdb", f"data_dir={data}", "reader={file: sorted.tsv, dev_ratio: 0.2}",
        "tokenizer=x", *extra]))


def labels(docs):
    return Counter(d.label for d in docs)


def test_max_examples_of_a_sorted_file_keeps_both_labels(sorted_imdb):
    """The issue's run: reader.file + dev_ratio + max_examples.{train,dev} on a file sorted by
    label gave label 0 only (dev accuracy 1.0, F1 0.0)."""
    task = imdb_task(sorted_imdb, "max_examples={train: 60, dev: 15}", "seed=3")
    full = {s: imdb_task(sorted_imdb).read(s) for s in ("train", "dev")}
    for split, n in (("train", 60), ("dev", 15)):
        docs = task.read(split)
        assert len(docs) == n
        # stratified: each label keeps its share of the split (2:1 here), to one document
        share = labels(full[split])["1"] / len(full[split])
        assert abs(labels(docs)["1"] - n * share) <= 1, labels(docs)
        assert labels(docs)["0"] > 0 and labels(docs)["1"] > 0
        # a subset of the split, in the file's order
        position = {d.doc_id: i for i, d in enumerate(full[split])}
        assert [position[d.doc_id] for d in docs] == sorted(position[d.doc_id] for d in docs)
    # the same seed draws the same sample; another seed another one
    again = imdb_task(sorted_imdb, "max_examples={train: 60}", "seed=3").read("train")
    other = imdb_task(sorted_imdb, "max_examples={train: 60}", "seed=4").read("train")
    ids = [d.doc_id for d in task.read("train")]
    assert [d.doc_id for d in again] == ids != [d.doc_id for d in other]
    drawn = labels(again)
    assert label_notes("train", again, 2) == [
        f"split train: 60 documents; labels 0: {drawn['0']}, 1: {drawn['1']}"]


def test_unset_max_examples_reads_the_split_as_the_reader_gives_it(sorted_imdb):
    """No max_examples: the reader's documents, all of them, in its order (the reference
    comparisons rely on it); a limit at or above the split's size changes nothing either."""
    from tasks.imdb import reader
    given = reader.read(str(sorted_imdb), "train", {"file": "sorted.tsv", "dev_ratio": 0.2})
    for extra in ((), ("max_examples.train=100000",)):
        docs = imdb_task(sorted_imdb, *extra).read("train")
        assert [(d.doc_id, d.label, d.text) for d in docs] == \
            [(d.doc_id, d.label, d.text) for d in given]


def test_a_one_class_split_is_one_warning_line(tmp_path):
    """The run summary (console and train.log) gets each split's label counts, and one
    WARNING line for a split with one class of several."""
    rows = ["qid\tlabel\tscore\ttext_a"] + [f"{i}\t0\t2\tonly negative {i}" for i in range(40)]
    write(tmp_path, {"sorted.tsv": "\n".join(rows) + "\n"})
    docs = imdb_task(tmp_path).read("train")
    notes = label_notes("train", docs, 2)
    assert notes[0] == f"split train: {len(docs)} documents; labels 0: {len(docs)}"
    assert len(notes) == 2 and "\n" not in notes[1], notes
    assert notes[1].startswith("WARNING split train: all ") and "label '0'" in notes[1]
    assert label_notes("test", [Document(doc_id="a", text="t")], 2) == []   # no labels


def test_unlabelled_documents_are_a_plain_seeded_sample():
    from ernie_doc.kinds.base import sample_examples
    docs = [Document(doc_id=str(i), text=f"t{i}") for i in range(50)]
    first = sample_examples(docs, 10, seed=1, split="train")
    assert len(first) == 10 and first != docs[:10]
    assert [d.doc_id for d in first] == sorted((d.doc_id for d in first), key=int)
    assert sample_examples(docs, 10, seed=1, split="train") == first
    assert sample_examples(docs, 10, seed=1, split="dev") != first
    assert sample_examples(docs, 50, seed=1, split="train") == docs


def test_examples_without_a_label_field_are_sampled_and_summarised():
    # span examples and pretraining corpus documents have no `label` attribute at all
    from collections import namedtuple

    from ernie_doc.kinds.base import sample_examples
    Example = namedtuple("Example", "doc_id text")
    docs = [Example(str(i), f"t{i}") for i in range(20)]
    assert len(sample_examples(docs, 5, seed=1, split="train")) == 5
    assert label_notes("dev", docs, 0) == []


def test_a_rare_class_keeps_one_example_and_ties_go_by_seed():
    """Every class is kept once when N allows (a class of 2 among 200 used to round to 0),
    then proportionally; a tie of remainders goes to a seeded draw, not the first label."""
    from ernie_doc.kinds.base import sample_examples
    docs = ([Document(doc_id=f"a{i}", text="t", label="a") for i in range(100)]
            + [Document(doc_id=f"b{i}", text="t", label="b") for i in range(98)]
            + [Document(doc_id=f"c{i}", text="t", label="c") for i in range(2)])
    sample = sample_examples(docs, 10, seed=1, split="train")
    assert labels(sample)["c"] == 1 and sum(labels(sample).values()) == 10
    assert labels(sample)["a"] + labels(sample)["b"] == 9
    # two classes of 3: one seat left after one each, a tie; seeds pick either class
    even = [Document(doc_id=f"{x}{i}", text="t", label=x) for x in "xy" for i in range(3)]
    winners = set()
    for seed in range(12):
        counts = labels(sample_examples(even, 3, seed=seed, split="train"))
        assert sorted(counts.values()) == [1, 2]
        winners.add(max(counts, key=counts.get))
    assert winners == {"x", "y"}
    # fewer seats than classes: one each of classes drawn by seed
    assert sorted(labels(sample_examples(docs, 2, seed=4, split="dev")).values()) == [1, 1]
