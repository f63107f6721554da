"""Inputs a hostile or careless user can hand the readers (issue 13, sections 4 to 6): TriviaQA
evidence paths that leave the evidence directory, an LM cache edit that keeps the size and the
mtime, FIFOs in a corpus directory or given as a file, WordPiece ids that are not dense, broken
tokenizer files and type-confused records. Every fixture is written here, into tmp_path."""
import io
import json
import logging
import os
import tarfile
import threading
import tracemalloc

import numpy as np
import pytest
from helpers import error, write

from ernie_doc.data.document import NOT_REGULAR, Skips, read_text, require_file, utf8_lines
from ernie_doc.errors import TokenizerError
from ernie_doc.lm.data import CACHE_VERSION, load_corpus, read_token_lines
from ernie_doc.pretraining.corpus import corpus_files, iter_documents
from ernie_doc.tokenization import (BPETokenizer, SentencePieceTokenizer, WordPieceTokenizer,
                                    load_tokenizer, load_vocab)
from tasks.dureader import reader as dureader
from tasks.hyp import reader as hyp
from tasks.imdb import reader as imdb
from tasks.triviaqa import reader as triviaqa
from tasks.wikitext103 import reader as wikitext103

fifo_only = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")


def finishes(call, fifos=(), timeout=30.0):
    """call() run in a thread that must end within `timeout` seconds → what it returned (or
    raises what it raised). A reader that opens a FIFO blocks in open() until a writer comes:
    the test then fails instead of hanging, and the FIFOs are opened for writing once so the
    stuck thread ends too."""
    out = {}

    def run():
        try:
            out["value"] = call()
        except BaseException as e:  # noqa: BLE001  handed to the test below
            out["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        for fifo in fifos:  # release the blocked reader: it then reads an empty stream
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        pytest.fail(f"the read did not finish within {timeout} s (blocked on a FIFO?)")
    if "error" in out:
        raise out["error"]
    return out.get("value")


class logged:
    """The messages of the warnings `name` logs inside the block (attached to the logger
    itself when a test before set it not to propagate)."""

    def __init__(self, caplog, name):
        self.caplog, self.logger = caplog, logging.getLogger(name)

    def __enter__(self):
        self.direct = not self.logger.propagate
        if self.direct:
            self.logger.addHandler(self.caplog.handler)
        self.level = self.logger.level
        self.logger.setLevel(logging.WARNING)
        self.caplog.clear()
        return self

    def __exit__(self, *exc):
        if self.direct:
            self.logger.removeHandler(self.caplog.handler)
        self.logger.setLevel(self.level)

    def lines(self, part):
        return [r.getMessage() for r in self.caplog.records if part in r.getMessage()]


# ---------------------------------------------------------------------------------- TriviaQA

ANSWER = {"Aliases": ["The Bears", "Bears"], "NormalizedAliases": ["bears", "the bears"],
          "Value": "The Bears", "NormalizedValue": "the bears", "Type": "WikipediaEntity"}
SECRET = "secret outside the evidence directory: the Bears"


def trivia(filename, answer=ANSWER):
    item = {"QuestionId": "tc_9", "Question": "Who won?",
            "EntityPages": [{"DocSource": "TagMe", "Filename": filename, "Title": "t"}]}
    if answer is not None:
        item["Answer"] = answer
    return {"Data": [item], "Domain": "Wikipedia", "Split": "dev", "Version": 1.0}


def trivia_dir(root, filename, answer=ANSWER):
    return write(root, {"qa/wikipedia-dev.json": trivia(filename, answer),
                        "evidence/wikipedia/Bears.txt": "The Bears won.\n"})


def trivia_tgz(path, files):
    with tarfile.open(path, "w:gz") as tar:
        for name, content in files.items():
            data = (content if isinstance(content, str) else json.dumps(content)).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_triviaqa_evidence_outside_the_evidence_directory_is_refused(tmp_path):
    write(tmp_path, {"secret.txt": SECRET})
    root = tmp_path / "rc"
    evidence = root / "evidence" / "wikipedia"
    qa = root / "qa" / "wikipedia-dev.json"
    for filename in ("../../../secret.txt", str(tmp_path / "secret.txt"), "a/../../x.txt",
                     ".", "..", "Bears.txt\0.txt"):
        trivia_dir(root, filename)
        message = error(lambda: triviaqa.read(root, "dev", {}))
        assert message == (f"{qa}: Data[0] (QuestionId 'tc_9'): evidence file {filename!r} lies "
                           f"outside {root}/evidence/wikipedia")

    # a symbolic link inside the evidence directory that points out of it
    trivia_dir(root, "link.txt")
    os.symlink(tmp_path / "secret.txt", evidence / "link.txt")
    error(lambda: triviaqa.read(root, "dev", {}), "evidence file 'link.txt' lies outside")
    os.symlink(tmp_path, evidence / "up")  # a linked directory, too
    trivia_dir(root, "up/secret.txt")
    error(lambda: triviaqa.read(root, "dev", {}), "evidence file 'up/secret.txt' lies outside")

    # inside stays readable: a sub-directory, "..", and a link that stays inside
    write(evidence, {"sub/Page.txt": "The Bears again.\n"})
    os.symlink(evidence / "Bears.txt", evidence / "alias.txt")
    for filename in ("sub/Page.txt", "sub/../Bears.txt", "alias.txt"):
        trivia_dir(root, filename)
        assert "Bears" in triviaqa.read(root, "dev", {})[0].text


def test_triviaqa_archive_member_with_dotdot_or_absolute_is_refused(tmp_path):
    top = "triviaqa-rc/"
    for filename in ("../../qa/wikipedia-dev.json", "../secret.txt", "/etc/passwd",
                     "../wikipedia/../../secret.txt"):
        archive = trivia_tgz(tmp_path / "rc.tgz", {
            top + "qa/wikipedia-dev.json": trivia(filename),
            top + "evidence/wikipedia/Bears.txt": "The Bears won.\n",
            # members that a lookup by the un-normalised name would find
            top + "evidence/wikipedia/" + filename: SECRET,
            top + "evidence/secret.txt": SECRET})
        message = error(lambda: triviaqa.read(archive, "dev", {}))
        assert message == (f"{archive}:{top}qa/wikipedia-dev.json: Data[0] (QuestionId 'tc_9'): "
                           f"evidence file {filename!r} lies outside "
                           f"{archive}:{top}evidence/wikipedia")
    archive = trivia_tgz(tmp_path / "ok.tgz", {
        top + "qa/wikipedia-dev.json": trivia("sub/../Bears.txt"),
        top + "evidence/wikipedia/Bears.txt": "The Bears won.\n"})
    assert triviaqa.read(archive, "dev", {})[0].text == "The Bears won.\n"


def test_triviaqa_answer_fields_of_the_wrong_type(tmp_path):
    root = tmp_path / "rc"
    at = f"{root}/qa/wikipedia-dev.json: Data[0] (QuestionId 'tc_9')"
    for key, value, shown in (("Aliases", "The Bears", "'The Bears'"),
                              ("Aliases", None, "None"),
                              ("NormalizedAliases", ["bears", 3], "['bears', 3]"),
                              ("HumanAnswers", {"a": 1}, "{'a': 1}")):
        trivia_dir(root, "Bears.txt", dict(ANSWER, **{key: value}))
        assert error(lambda: triviaqa.read(root, "dev", {})) == \
            f"{at}: Answer.{key} is not a list of strings (got {shown})"
    trivia_dir(root, "Bears.txt", dict(ANSWER, NormalizedValue=5))
    assert error(lambda: triviaqa.read(root, "dev", {})) == \
        f"{at}: Answer.NormalizedValue is not a string (got 5)"
    trivia_dir(root, "Bears.txt", ["The Bears"])
    assert error(lambda: triviaqa.read(root, "dev", {})) == f"{at}: 'Answer' is not an object"


# -------------------------------------------------------------------------------- LM cache

def test_lm_cache_is_keyed_by_content_not_size_and_mtime(tmp_path):
    data = write(tmp_path / "data", {"train.tokens": "a b a c\nb a\n",
                                     "valid.tokens": "a b c\n"})
    paths = {"train": data / "train.tokens", "valid": data / "valid.tokens"}
    cache = tmp_path / "cache"
    first = load_corpus(paths, None, cache)
    assert first.from_cache == {"train": False, "valid": False}
    key = json.loads((cache / "valid.json").read_text())["key"]
    assert key["version"] == CACHE_VERSION == 2
    assert set(key["source"]) == {"size", "blake2b"} and key["source"]["size"] == 6
    assert load_corpus(paths, None, cache).from_cache == {"train": True, "valid": True}

    def edit(path, text):
        """Rewrite path with text of the same size and put its old times back."""
        st = os.stat(path)
        assert len(text.encode()) == st.st_size
        path.write_text(text, encoding="utf-8")
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert os.stat(path).st_mtime_ns == st.st_mtime_ns

    edit(paths["valid"], "c c b\n")
    second = load_corpus(paths, None, cache)
    assert second.from_cache == {"train": True, "valid": False}
    assert second.data["valid"].tolist() == first.vocab.encode_lines(["c c b"]).tolist()
    assert second.data["valid"].tolist() != first.data["valid"].tolist()

    # the vocabulary cache too: counted on train, which now has more c than a
    edit(paths["train"], "c b c c\nb a\n")
    third = load_corpus(paths, None, cache)
    assert third.from_cache == {"train": False, "valid": False}
    assert third.vocab.tokens[:2] == ["<eos>", "c"]
    np.testing.assert_array_equal(load_corpus(paths, None, cache).data["train"],
                                  third.data["train"])


# ----------------------------------------------------------------------------------- FIFOs

@fifo_only
def test_fifo_in_a_corpus_directory_is_skipped_and_counted(tmp_path, caplog):
    root = write(tmp_path / "corpus", {"a.txt": "first doc\n\nsecond doc\n", "sub/b.txt": "b"})
    os.mkfifo(root / "pipe.txt")
    os.mkfifo(root / "sub" / "pipe.jsonl")
    os.symlink(root / "pipe.txt", root / "link-to-pipe.txt")
    os.symlink(tmp_path / "nowhere", root / "broken.txt")
    fifos = [root / "pipe.txt", root / "sub" / "pipe.jsonl"]
    with logged(caplog, "ernie_doc.pretrain") as log:
        docs = finishes(lambda: list(iter_documents(root)), fifos)
    assert [d.doc_id for d in docs] == ["corpus/a.txt:1", "corpus/a.txt:3", "corpus/sub/b.txt:1"]
    skipped = Skips(root, "entries")
    finishes(lambda: corpus_files(root, skipped), fifos)
    assert skipped.counts == {NOT_REGULAR: 4}
    assert log.lines("entries") == [f"{root}: skipped 4 of 6 entries: {NOT_REGULAR} (first at "
                     f"{skipped.first[NOT_REGULAR]})"]


@fifo_only
def test_fifo_given_as_a_file_is_refused(tmp_path):
    fifo = tmp_path / "data.txt"
    os.mkfifo(fifo)
    refused = f"{fifo}: file is a FIFO, not a regular file"
    for call in (lambda: require_file(fifo), lambda: read_text(fifo),
                 lambda: list(utf8_lines(fifo))):
        assert finishes(lambda: error(call), [fifo]) == refused
    finishes(lambda: error(lambda: list(iter_documents(fifo)),
                           f"{fifo}: corpus path is a FIFO, not a regular file or a directory"),
             [fifo])
    finishes(lambda: error(lambda: list(read_token_lines(fifo)), f"{fifo}: token file is a "
                           "FIFO"), [fifo])
    finishes(lambda: error(lambda: load_corpus({"train": fifo}), "is a FIFO"), [fifo])
    finishes(lambda: error(lambda: wikitext103.read(tmp_path, "train",
                                                    {"files": {"train": "data.txt"}}),
                           f"{fifo}: the train split's token file is a FIFO, not a regular "
                           "file"), [fifo])
    # a data file under its conventional name, an archive, an evidence page
    os.mkfifo(tmp_path / "search.dev.json")
    finishes(lambda: error(lambda: dureader.read(tmp_path, "dev", {}),
                           "search.dev.json: file is a FIFO"), [tmp_path / "search.dev.json"])
    finishes(lambda: error(lambda: triviaqa.read(fifo, "dev", {}), "is a FIFO"), [fifo])
    root = trivia_dir(tmp_path / "rc", "Pipe.txt")
    os.mkfifo(root / "evidence" / "wikipedia" / "Pipe.txt")
    finishes(lambda: error(lambda: triviaqa.read(root, "dev", {}), "Pipe.txt: file is a FIFO"),
             [root / "evidence" / "wikipedia" / "Pipe.txt"])
    # a tokenizer: the path itself, or vocab.txt inside its directory
    with pytest.raises(TokenizerError, match="tokenizer path is a FIFO"):
        finishes(lambda: load_tokenizer(fifo), [fifo])
    tok = tmp_path / "tok"
    tok.mkdir()
    os.mkfifo(tok / "vocab.txt")
    with pytest.raises(FileNotFoundError, match="no tokenizer files"):
        finishes(lambda: load_tokenizer(tok), [tok / "vocab.txt"])
    with pytest.raises(TokenizerError, match="vocabulary file is a FIFO"):
        finishes(lambda: WordPieceTokenizer(tok / "vocab.txt"), [tok / "vocab.txt"])


@fifo_only
def test_fifo_among_imdb_reviews_and_hyp_files_is_skipped_and_counted(tmp_path, caplog):
    root = write(tmp_path / "imdb", {"train/pos/1_9.txt": "good", "train/neg/2_1.txt": "bad"})
    os.mkfifo(root / "train" / "pos" / "3_8.txt")
    hyp_dir = write(tmp_path / "hyp", {
        "articles-a.xml": '<articles><article id="1"><p>text</p></article></articles>',
        "ground-truth-a.xml": '<articles><article id="1" hyperpartisan="true"/></articles>'})
    os.mkfifo(hyp_dir / "articles-b.xml")
    with logged(caplog, "ernie_doc.train") as log:
        docs = finishes(lambda: imdb.read(root, "train", {}), [root / "train/pos/3_8.txt"])
        split = finishes(lambda: hyp.read(hyp_dir, "train", {"dev_ratio": 0.01}),
                         [hyp_dir / "articles-b.xml"])
    assert [d.doc_id for d in docs] == ["train/neg/2_1", "train/pos/1_9"]
    assert [d.doc_id for d in split] == ["1"]
    assert log.lines("entries") == [
        f"{root}/train/pos: skipped 1 of 2 entries: {NOT_REGULAR} (first at "
        f"{root}/train/pos/3_8.txt)",
        f"{hyp_dir}: skipped 1 of 2 entries: {NOT_REGULAR} (first at {hyp_dir}/articles-b.xml)"]


# --------------------------------------------------------------------------- WordPiece ids

def vocab_error(tmp_path, content, *parts):
    f = tmp_path / "vocab.txt"
    f.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    with pytest.raises(TokenizerError) as info:
        load_vocab(f)
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(f))
    for part in parts:
        assert part in message, (part, message)
    return message


def test_vocab_ids_must_be_dense(tmp_path):
    f = tmp_path / "vocab.txt"
    tracemalloc.start()
    try:
        message = vocab_error(tmp_path, "[PAD]\t0\n[UNK]\t1000000000\n")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert message == (f"{f}:2: id 1000000000 leaves a gap: the 2 lines must have the ids "
                       f"0..1, each once")
    assert peak < 10 * 2 ** 20  # refused before anything is sized by the id
    with pytest.raises(ValueError, match="leaves a gap"):  # what assemble.choose_tokenizer catches
        WordPieceTokenizer(f)
    assert vocab_error(tmp_path, "a\t0\nb\t2\nc\t1\nd\t5\ne\t3\n") == \
        f"{f}:4: id 5 leaves a gap: the 5 lines must have the ids 0..4, each once"
    assert vocab_error(tmp_path, "a\t0\nb\t1\nc\t1\n") == \
        f"{f}:3: id 1 of token 'c' repeated (first at line 2)"
    # a repeated token keeps its last id (official); its ids are still dense over the lines
    f.write_text("a\nb\na\n", encoding="utf-8")
    assert load_vocab(f) == {"a": 2, "b": 1}
    assert vocab_error(tmp_path, "a\t0\nb\t-1\n") == f"{f}:2: negative id -1 of token 'b'"
    assert vocab_error(tmp_path, "a\t0\nb\t1.0\n") == \
        f"{f}:2: id '1.0' of token 'b' is not an integer"
    assert vocab_error(tmp_path, "") == f"{f}: vocabulary file has no tokens"
    assert vocab_error(tmp_path, "a\t0\textra\n") == f"{f}: vocabulary file has no tokens"
    assert vocab_error(tmp_path, b"a\t0\n\xff\t1\n") == \
        f"{f}:2: invalid UTF-8 (byte 4)"
    # the official layouts, dense, still load (ids from the file, else the line number)
    f.write_text("[PAD]\t1\n[CLS]\t0\nhello\n", encoding="utf-8")
    assert load_vocab(f) == {"[PAD]": 1, "[CLS]": 0, "hello": 2}


# ------------------------------------------------------------------------- tokenizer files

def bpe_dir(directory, encoder=None, merges="#version: 0.2\nh e\n", vocab=None):
    """encoder.json, vocab.bpe, vocab.txt of a two-letter BPE (str / bytes written as they are,
    anything else as JSON)."""
    encoder = {"h": 0, "e": 1, "he": 2} if encoder is None else encoder
    files = {"encoder.json": encoder, "vocab.bpe": merges,
             "vocab.txt": vocab if vocab is not None else "[CLS]\n[PAD]\n[SEP]\n[UNK]\n0\n1\n2\n"}
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        path = directory / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif isinstance(content, str):
            path.write_text(content, encoding="utf-8")
        else:
            path.write_text(json.dumps(content), encoding="utf-8")
    return directory


def tokenizer_error(path, *parts):
    with pytest.raises(TokenizerError) as info:
        load_tokenizer(path)
    message = str(info.value)
    assert isinstance(info.value, ValueError) and "\n" not in message
    for part in parts:
        assert part in message, (part, message)
    return message


def test_broken_bpe_files_are_one_line_errors(tmp_path):
    good = bpe_dir(tmp_path / "good")
    assert load_tokenizer(good).encode("he", sentence_split=False) == [6]   # merged: GPT-2 id 2
    cases = [
        ({"encoder": ["h", "e"]}, "encoder.json", "expected a JSON object {piece: id}, got list"),
        ({"encoder": "[1, 2"}, "encoder.json:1", "invalid JSON"),
        ({"encoder": {"h": "0"}}, "encoder.json", "piece 'h' has the id '0', not an integer"),
        ({"encoder": {}}, "encoder.json", "has no pieces"),
        ({"encoder": b'{"h": 0, "\xff": 1}'}, "encoder.json:1", "invalid UTF-8"),
        ({"merges": ""}, "vocab.bpe", "BPE merges file is empty (no merges)"),
        ({"merges": "#version: 0.2\n"}, "vocab.bpe", "has no merges (only its header)"),
        ({"merges": "h e\n"}, "vocab.bpe:1", "does not start with its '#version' header"),
        ({"merges": "#version: 0.2\nh e x\n"}, "vocab.bpe:2", "expected a merge of two symbols"),
        ({"merges": b"#version: 0.2\n\xc3\n"}, "vocab.bpe:2", "invalid UTF-8"),
        ({"vocab": ""}, "vocab.txt", "vocabulary file has no tokens"),
        ({"vocab": "[CLS]\n[PAD]\n[SEP]\n0\n"}, "vocab.txt", "has no [UNK] token"),
    ]
    for i, (kwargs, where, what) in enumerate(cases):
        directory = bpe_dir(tmp_path / f"bad{i}", **kwargs)
        message = tokenizer_error(directory, what)
        assert message.startswith(str(directory / where)), message
    with pytest.raises(TokenizerError, match="has no merges"):
        BPETokenizer(good / "vocab.txt", good / "encoder.json", tmp_path / "bad6" / "vocab.bpe")


def test_broken_sentencepiece_and_wordpiece_files_are_one_line_errors(tmp_path):
    garbage = tmp_path / "garbage.model"
    garbage.write_bytes(b"\x00\x01 this is not a model \xff" * 10)
    assert tokenizer_error(garbage) == (f"{garbage}: not a usable SentencePiece model (not a "
                                        f"serialized SentencePiece ModelProto)")
    empty = tmp_path / "spm.model"
    empty.write_bytes(b"")
    assert tokenizer_error(tmp_path) == f"{empty}: SentencePiece model is empty"
    with pytest.raises(FileNotFoundError, match="SentencePiece model does not exist"):
        SentencePieceTokenizer(tmp_path / "none.model")

    zh = tmp_path / "zh"
    zh.mkdir()
    (zh / "vocab.txt").write_text("[PAD]\t0\n[CLS]\t1\n[SEP]\t2\n", encoding="utf-8")
    assert tokenizer_error(zh) == (f"{zh}/vocab.txt: vocabulary file has no [UNK] token (every "
                                   f"piece outside the vocabulary maps to it)")
    (zh / "vocab.txt").write_bytes(b"[PAD]\t0\n[UNK]\t1\n\xe4\xbd\t2\n")
    assert tokenizer_error(zh) == f"{zh}/vocab.txt:3: invalid UTF-8 (byte 16)"


# ------------------------------------------------------------------ type-confused records

def test_dureader_fields_of_the_wrong_type(tmp_path):
    good = {"question_id": 7, "question": "什么", "segmented_question": ["什么"],
            "documents": [{"title": "t", "segmented_paragraphs": [["ab", "cd"]],
                           "is_selected": True, "most_related_para": 0}],
            "answers": ["cd"], "answer_docs": [0], "answer_spans": [[1, 1]],
            "fake_answers": ["cd"], "match_scores": [1.0]}
    path = tmp_path / "search.train.json"
    at = f"{path}:1 (question_id 7)"
    for key, value, message in (
            ("answer_docs", 0, "'answer_docs' is not a list (got int)"),
            ("answer_spans", {"a": 1}, "'answer_spans' is not a list (got dict)"),
            ("fake_answers", "cd", "'fake_answers' is not a list (got str)"),
            ("answers", 5, "'answers' is not a list (got int)"),
            ("match_scores", ["high"], "match_scores[0] 'high' is not a number"),
            ("question", 5, "'question' is not a string"),
            ("segmented_question", [1], "'segmented_question' is not a list of words")):
        path.write_text(json.dumps(dict(good, **{key: value})) + "\n", encoding="utf-8")
        assert error(lambda: dureader.read(tmp_path, "train", {"min_match_score": 0.5})) == \
            f"{at}: {message}"
    record = dict(good, documents=[dict(good["documents"][0], most_related_para=None,
                                        segmented_paragraphs=[["ab"], 5])])
    path.write_text(json.dumps(record) + "\n", encoding="utf-8")
    assert error(lambda: dureader.read(tmp_path, "train", {})) == \
        f"{at}: documents[0]: segmented_paragraphs[1] is not a list of words"
