"""The pretraining corpus: formats, file order, rank sharding, file:line errors, WikiText."""
import logging

import pytest
from helpers import error, shared_path, write

from ernie_doc.data.document import Skips
from ernie_doc.pretraining.corpus import (check_corpus, corpus_files, count_documents,
                                          is_wikitext_heading, iter_documents)


def texts(paths, **kw):
    return [d.text for d in iter_documents(paths, **kw)]


def test_blank_line_splitting(tmp_path):
    write(tmp_path, {"a.txt": b"one\r\ntwo  \r\n\r\n\r\n \t\r\nthree\n\n\n\nfour\nfive \n\n"})
    docs = list(iter_documents(tmp_path / "a.txt"))
    assert [d.text for d in docs] == ["one\ntwo", "three", "four\nfive"]
    assert [d.line for d in docs] == [1, 6, 10]
    assert [d.doc_id for d in docs] == ["a.txt:1", "a.txt:6", "a.txt:10"]
    assert docs[0].path == str(tmp_path / "a.txt")


def test_no_final_newline_and_bom(tmp_path):
    write(tmp_path, {"a.tokens": "\ufeffx\n\ny"})
    assert texts(tmp_path / "a.tokens") == ["x", "y"]


def test_jsonl_custom_field(tmp_path):
    write(tmp_path, {"d.jsonl": '{"body": "first doc", "id": 1}\n\n{"body": "second\\ndoc"}\n'})
    docs = list(iter_documents(tmp_path / "d.jsonl", text_field="body"))
    assert [(d.text, d.doc_id) for d in docs] == [("first doc", "d.jsonl:1"),
                                                  ("second\ndoc", "d.jsonl:3")]
    error(lambda: list(iter_documents(tmp_path / "d.jsonl")), "d.jsonl:1", "'text'")


def test_directory_recursion_order(tmp_path):
    root = write(tmp_path / "corpus", {
        "b.txt": "b", "a/z.txt": "az", "a/b/c.txt": "abc", "a.json": '{"text": "ajson"}',
        "A.txt": "A", ".hidden.txt": "hidden", ".git/x.txt": "git"})
    rels = [rel for _, rel in corpus_files(root)]
    assert rels == ["corpus/A.txt", "corpus/a/b/c.txt", "corpus/a/z.txt", "corpus/a.json",
                    "corpus/b.txt"]
    assert texts(root) == ["A", "abc", "az", "ajson", "b"]
    # paths are taken in the order given; a file named twice is read once
    extra = write(tmp_path, {"extra.txt": "e"}) / "extra.txt"
    assert texts([extra, root, root / "b.txt"]) == ["e", "A", "abc", "az", "ajson", "b"]
    # doc ids do not depend on the working directory
    assert [d.doc_id for d in iter_documents(root)][0] == "corpus/A.txt:1"


def test_same_relative_name_is_an_error(tmp_path):
    write(tmp_path, {"x/corpus/a.txt": "1", "y/corpus/a.txt": "2"})
    error(lambda: corpus_files([tmp_path / "x/corpus", tmp_path / "y/corpus"]),
          "corpus/a.txt", "collide")


@pytest.mark.parametrize("world_size", [2, 3])
def test_sharding(tmp_path, world_size):
    write(tmp_path, {"a.txt": "\n\n".join(f"doc {i}" for i in range(7)),
                     "sub/b.jsonl": "\n".join(f'{{"text": "json {i}"}}' for i in range(4))})
    everything = list(iter_documents(tmp_path))
    assert len(everything) == 11 == count_documents(tmp_path)
    shards = [list(iter_documents(tmp_path, rank=r, world_size=world_size))
              for r in range(world_size)]
    ids = [[d.doc_id for d in s] for s in shards]
    flat = [i for s in ids for i in s]
    assert len(flat) == len(set(flat)) == 11                            # disjoint
    assert set(flat) == {d.doc_id for d in everything}                  # union = all
    for r, s in enumerate(shards):
        assert s == everything[r::world_size]                           # i -> rank i % W
        assert s == list(iter_documents(tmp_path, rank=r, world_size=world_size))  # stable


def test_min_chars_skips_are_counted(tmp_path, caplog):
    write(tmp_path, {"a.txt": "tiny\n\nlong enough\n\nab\n\nanother long one",
                     "b.jsonl": '{"text": "   "}\n{"text": "long enough too"}\n'})
    skips = Skips(tmp_path, "documents")
    kept = texts(tmp_path, min_chars=5, skips=skips)
    assert kept == ["long enough", "another long one", "long enough too"]
    assert len(skips) == 3 and skips.first["shorter than 5 characters"].endswith("a.txt:1")
    # sharding counts kept documents only
    assert texts(tmp_path, min_chars=5, rank=1, world_size=2) == ["another long one"]
    assert count_documents(tmp_path, min_chars=5) == 3
    with caplog.at_level(logging.WARNING, logger="ernie_doc.pretrain"):
        list(iter_documents(tmp_path))
    assert "skipped 1 of 6 documents: empty" in caplog.text


def test_invalid_utf8_names_file_and_line(tmp_path):
    write(tmp_path, {"bad.txt": b"fine\n\nstill fine\nbroken \xff here\n"})
    error(lambda: list(iter_documents(tmp_path)), "bad.txt:4", "invalid UTF-8")
    error(lambda: check_corpus(tmp_path), "bad.txt:4", "invalid UTF-8")
    write(tmp_path, {"bad.txt": "ok", "bad.jsonl": b'{"text": "ok"}\n{"text": "\xc3("}\n'})
    error(lambda: list(iter_documents(tmp_path)), "bad.jsonl:2", "invalid UTF-8")


@pytest.mark.parametrize("line, message", [
    ('{"text": "unterminated', "invalid JSON"),
    ('["text"]', "expected a JSON object"),
    ('{"title": "no text"}', "no field 'text'"),
    ('{"text": 3}', "must be a string"),
])
def test_malformed_json_names_file_and_line(tmp_path, line, message):
    write(tmp_path, {"c.json": '{"text": "good"}\n\n' + line + "\n"})
    error(lambda: list(iter_documents(tmp_path / "c.json")), "c.json:3", message)


def test_empty_corpus(tmp_path):
    (tmp_path / "empty").mkdir()
    write(tmp_path, {"blank/a.txt": "\n \n\n", "blank/b.jsonl": '{"text": ""}\n'})
    for path in (tmp_path / "empty", tmp_path / "blank"):
        error(lambda: check_corpus(path), str(path), "empty corpus")
        error(lambda: list(iter_documents(path)), str(path), "empty corpus")
        assert count_documents(path) == 0
    error(lambda: check_corpus([]), "empty corpus")
    error(lambda: check_corpus(tmp_path / "missing"), "missing", "does not exist")
    # too few documents for the ranks: every rank would not get one
    write(tmp_path, {"one/a.txt": "only"})
    assert check_corpus(tmp_path / "one") == 1
    error(lambda: check_corpus(tmp_path / "one", world_size=2), "1 documents for 2 ranks")


WIKI = """ 
 = First Article = 
 
 Intro paragraph . 
 
 = = Section = = 
 
 Section text . 
 
 = = = Subsection = = = 
 Sub text . 
 
 
 = Second = Article = 
 
 Only paragraph . 
"""


def test_wikitext_split(tmp_path):
    write(tmp_path, {"wiki.tokens": WIKI})
    docs = list(iter_documents(tmp_path, split="wikitext"))
    assert [d.line for d in docs] == [2, 14]
    assert docs[0].text == (" = First Article =\n Intro paragraph .\n = = Section = =\n"
                            " Section text .\n = = = Subsection = = =\n Sub text .")
    assert docs[1].text == " = Second = Article =\n Only paragraph ."
    assert is_wikitext_heading(" = X = ") and not is_wikitext_heading(" = = X = = ")
    assert not is_wikitext_heading(" = = ") and not is_wikitext_heading("a = b")
    # the same file split on blank lines gives paragraphs
    assert len(texts(tmp_path)) == 7
    error(lambda: list(iter_documents(tmp_path, split="sections")), "'sections'")


def test_wikitext103_valid_article_count():
    path = shared_path("data", "wikitext103", "wiki.valid.tokens")
    docs = list(iter_documents(path, split="wikitext"))
    assert len(docs) == 60 == count_documents(path, split="wikitext")
    assert docs[0].doc_id == "wiki.valid.tokens:2"
    assert docs[0].text.startswith(" = Homarus gammarus =\n")
    assert all(is_wikitext_heading(d.text.split("\n", 1)[0]) for d in docs)
