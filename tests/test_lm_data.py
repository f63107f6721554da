"""WikiText LM data: vocabulary, <unk> counting, corpus cache, Segatron positions, LMStreams."""
import json
import os

import numpy as np
import pytest
from helpers import error, shared_path, write

from ernie_doc.lm.data import (CACHE_VERSION, EOS, UNK, LMStreams, Vocabulary, load_corpus,
                               sega_positions, to_global, wikitext_sentences)

TRAIN = "b a b <unk>\n \nc a b\n"          # b:3 a:2 <unk>:1 c:1, <eos>:3 (the blank line too)


def test_vocabulary_order_and_ids(tmp_path):
    write(tmp_path, {"train.tokens": TRAIN})
    vocab = Vocabulary.build(tmp_path / "train.tokens")
    # <eos> first, then by count; the 1-count tie <unk>/c keeps first-occurrence order
    assert vocab.tokens == [EOS, "b", "a", UNK, "c"]
    assert (vocab.eos_id, vocab.unk_id) == (0, 3)
    ids = vocab.encode_file(tmp_path / "train.tokens")
    assert ids.dtype == np.int64
    assert ids.tolist() == [1, 2, 1, 3, 0, 0, 4, 2, 1, 0]
    assert Vocabulary.from_lines(TRAIN.splitlines()) == vocab
    # ties by first occurrence; no <unk> in the text: appended last
    assert Vocabulary.from_lines(["x y y x z"]).tokens == [EOS, "x", "y", "z", UNK]
    # min_freq never drops <unk>; max_size counts the specials and keeps <unk>
    assert Vocabulary.from_lines(TRAIN.splitlines(), min_freq=2).tokens == [EOS, "b", "a", UNK]
    assert Vocabulary.from_lines(TRAIN.splitlines(), max_size=3).tokens == [EOS, "b", UNK]
    # several files are counted together, in order
    write(tmp_path, {"more.tokens": "c c c\n"})
    both = Vocabulary.build([tmp_path / "train.tokens", tmp_path / "more.tokens"])
    assert both.tokens == [EOS, "c", "b", "a", UNK]


def test_unknown_tokens_are_counted(tmp_path):
    write(tmp_path, {"train.tokens": TRAIN, "test.tokens": "a d <unk> e e\nb\n"})
    vocab = Vocabulary.build(tmp_path / "train.tokens")
    ids, oov = vocab.encode_file(tmp_path / "test.tokens", return_oov=True)
    # d, e, e are unknown (3); the text's own <unk> is a vocabulary token, not counted
    assert oov == 3
    assert ids.tolist() == [2, 3, 3, 3, 3, 0, 1, 0]
    assert vocab.decode(ids[:3]) == ["a", UNK, UNK]


def test_save_load_round_trip(tmp_path):
    vocab = Vocabulary.from_lines(TRAIN.splitlines())
    vocab.save(tmp_path / "vocab.txt")
    assert (tmp_path / "vocab.txt").read_text(encoding="utf-8") == "<eos>\nb\na\n<unk>\nc\n"
    loaded = Vocabulary.load(tmp_path / "vocab.txt")
    assert loaded == vocab and loaded.fingerprint == vocab.fingerprint
    assert loaded.unk_id == 3 and loaded.id("never seen") == 3
    write(tmp_path, {"dup.txt": "<eos>\nb\n<unk>\nb\n", "nounk.txt": "<eos>\nb\n",
                     "two.txt": "<eos>\n<unk>\nb c\n"})
    error(lambda: Vocabulary.load(tmp_path / "dup.txt"), "dup.txt:4", "duplicate")
    error(lambda: Vocabulary.load(tmp_path / "nounk.txt"), "nounk.txt", UNK)
    error(lambda: Vocabulary.load(tmp_path / "two.txt"), "two.txt:3", "one token per line")


def test_file_errors(tmp_path):
    write(tmp_path, {"empty.tokens": "", "blank.tokens": " \n\n",
                     "bad.tokens": b"fine line\nbad \xff byte\n"})
    vocab = Vocabulary.from_lines(TRAIN.splitlines())
    missing = tmp_path / "missing.tokens"
    for call in (Vocabulary.build, vocab.encode_file, sega_positions):
        error(lambda: call(missing), str(missing), "does not exist")
        error(lambda: call(tmp_path / "empty.tokens"), "empty.tokens", "empty file")
        error(lambda: call(tmp_path / "blank.tokens"), "blank.tokens", "no tokens")
        error(lambda: call(tmp_path / "bad.tokens"), "bad.tokens:2", "invalid UTF-8")
    error(lambda: load_corpus({"test": tmp_path / "empty.tokens"}), "no vocabulary", "train")


def test_corpus_cache_hit_and_invalidation(tmp_path):
    data = write(tmp_path / "data", {"train.tokens": TRAIN, "valid.tokens": "a c . B d\n"})
    paths = {"train": data / "train.tokens", "valid": data / "valid.tokens"}
    cache = tmp_path / "cache"
    first = load_corpus(paths, None, cache, positions="local")
    assert first.from_cache == {"train": False, "valid": False}
    assert first.vocab.tokens == [EOS, "b", "a", UNK, "c"]
    assert first.oov == {"train": 0, "valid": 3}  # ".", "B", "d"
    assert first.positions["valid"].tolist() == [[0] * 6, [0, 0, 0, 1, 1, 1], [0, 1, 2, 0, 1, 2]]
    assert sorted(os.listdir(cache)) == ["train.ids.npy", "train.json", "train.pos.npy",
                                         "valid.ids.npy", "valid.json", "valid.pos.npy",
                                         "vocab.json", "vocab.txt"]

    again = load_corpus(paths, None, cache, positions="global")
    assert again.from_cache == {"train": True, "valid": True}
    for split in paths:
        np.testing.assert_array_equal(again.data[split], first.data[split])
    assert again.positions["valid"].tolist() == [[0] * 6, [0, 0, 0, 1, 1, 1], list(range(6))]
    assert again.oov == first.oov

    # a changed valid file is re-encoded; train and the vocabulary stay cached
    write(data, {"valid.tokens": "a c b\nc\n"})
    os.utime(paths["valid"], ns=(1, 1))
    third = load_corpus(paths, None, cache)
    assert third.from_cache == {"train": True, "valid": False}
    assert third.data["valid"].tolist() == [2, 4, 1, 0, 4, 0] and third.oov["valid"] == 0

    # a changed train file rebuilds the vocabulary, so every split is re-encoded
    write(data, {"train.tokens": TRAIN + "c c c\n"})
    fourth = load_corpus(paths, None, cache)
    assert fourth.vocab.tokens == [EOS, "c", "b", "a", UNK]
    assert fourth.from_cache == {"train": False, "valid": False}
    assert fourth.data["valid"].tolist() == [3, 1, 2, 0, 1, 0]

    # an explicit vocabulary file (different from the cached one) also re-encodes
    Vocabulary(first.vocab.tokens).save(tmp_path / "vocab.txt")
    fifth = load_corpus({"valid": paths["valid"]}, tmp_path / "vocab.txt", cache)
    assert fifth.from_cache == {"valid": False}
    assert fifth.data["valid"].tolist() == [2, 4, 1, 0, 4, 0]
    assert load_corpus({"valid": paths["valid"]}, tmp_path / "vocab.txt", cache).from_cache == \
        {"valid": True}


def test_wikitext_sentence_rules():
    def split(text):
        tokens = text.split()
        return [" ".join(tokens[a:b]) for a, b in wikitext_sentences(tokens)]

    assert split("It is 1 @.@ 5 m long . It grew .") == ["It is 1 @.@ 5 m long .", "It grew ."]
    assert split("He left ( for good . ) Then") == ["He left ( for good . )", "Then"]
    assert split('" Why ? " he asked . Then') == ['" Why ? " he asked .', "Then"]
    assert split("“ Go . ” She went") == ["“ Go . ”", "She went"]
    assert split("' Go . ' She went") == ["' Go . '", "She went"]
    assert split("Ohio . . . at Michigan . Next") == ["Ohio . . . at Michigan .", "Next"]
    assert split("Warren <unk> . , Frank Hill") == ["Warren <unk> . , Frank Hill"]
    assert split("in the U.S. The end") == ["in the U.S. The end"]
    assert split("Really ? ! Yes") == ["Really ? !", "Yes"]
    assert split("wait ... Then") == ["wait ... Then"]
    assert wikitext_sentences([]) == []


def test_segatron_positions(tmp_path):
    text = (" \n = Title = \n \n"
            " The rate rose 1 @.@ 5 % . It fell ( slowly ) ."
            ' " Why ? " he asked . Then it stopped . \n'
            " Short one \n")
    write(tmp_path, {"p.tokens": text})
    para, sent, tok = sega_positions(tmp_path / "p.tokens")
    vocab = Vocabulary.from_lines(text.splitlines())
    assert len(para) == len(vocab.encode_file(tmp_path / "p.tokens")) == 35
    # leading blank <eos>, "= Title = <eos>", blank <eos>: one sentence of paragraph 0
    assert para[:6].tolist() == [0] * 6 and sent[:6].tolist() == [0] * 6
    assert tok[:6].tolist() == [0, 1, 2, 3, 4, 5]
    # paragraph 1: 8 + 6 + 7 + 4 tokens, the line's <eos> ending the last sentence
    assert para[6:32].tolist() == [1] * 26
    assert sent[6:32].tolist() == [0] * 8 + [1] * 6 + [2] * 7 + [3] * 5
    assert tok[6:32].tolist() == (list(range(8)) + list(range(6)) + list(range(7))
                                  + list(range(5)))
    assert (para[32:].tolist(), sent[32:].tolist(), tok[32:].tolist()) == \
        ([2, 2, 2], [0, 0, 0], [0, 1, 2])
    glob = sega_positions(text.splitlines(), scheme="global")
    assert glob[1].tolist() == [0] * 6 + [1] * 8 + [2] * 6 + [3] * 7 + [4] * 5 + [5] * 3
    assert glob[2].tolist() == list(range(35))
    np.testing.assert_array_equal(to_global(np.stack([para, sent, tok])), glob)
    assert glob.dtype == np.int32


def test_lm_streams_layout_and_coverage():
    rng = np.random.RandomState(0)
    data = rng.randint(0, 50, size=103).astype(np.int64)
    positions = np.stack([np.arange(103), 1000 + np.arange(103)])
    streams = LMStreams(data, bsz=4, tgt_len=5, positions=positions)
    rows = data[:100].reshape(4, 25)            # row b = tokens b*25 ... b*25+24
    assert (streams.n_step, len(streams)) == (25, 5)
    batches = list(streams)
    assert [b.seq_len for b in batches] == [5, 5, 5, 5, 4]   # 24 steps: the last batch is short
    assert batches[-1].input.shape == (4, 4) and batches[0].positions.shape == (2, 4, 5)
    beg = 0
    for b in batches:
        assert b.input.shape == b.target.shape == (4, b.seq_len)
        np.testing.assert_array_equal(b.target, rows[:, beg + 1:beg + 1 + b.seq_len])
        np.testing.assert_array_equal(b.target[:, :-1], b.input[:, 1:])
        where = np.arange(100).reshape(4, 25)[:, beg:beg + b.seq_len]
        np.testing.assert_array_equal(b.positions[0], where)
        np.testing.assert_array_equal(b.positions[1], 1000 + where)
        beg += b.seq_len
    np.testing.assert_array_equal(np.concatenate([b.input for b in batches], 1), rows[:, :24])
    np.testing.assert_array_equal(np.concatenate([b.target for b in batches], 1), rows[:, 1:])
    # ext_len: up to 2 earlier tokens of context before the seq_len inputs
    ext = list(LMStreams(data, bsz=4, tgt_len=5, ext_len=2))
    assert [b.input.shape[1] for b in ext] == [5, 7, 7, 7, 6]
    for b, plain in zip(ext, batches):
        np.testing.assert_array_equal(b.input[:, -b.seq_len:], plain.input)
        np.testing.assert_array_equal(b.target, plain.target)


def test_lm_streams_resume():
    data = np.arange(61, dtype=np.int64)
    streams = LMStreams(data, bsz=3, tgt_len=4)
    full = [b.input for b in LMStreams(data, bsz=3, tgt_len=4)]
    it = iter(streams)
    seen = [next(it).input, next(it).input]
    state = streams.state()
    assert state["batch"] == 2
    resumed = LMStreams(data, bsz=3, tgt_len=4)
    resumed.load_state(state)
    rest = [b.input for b in resumed]
    assert len(seen) + len(rest) == len(full) == 5
    for got, want in zip(seen + rest, full):
        np.testing.assert_array_equal(got, want)
    assert resumed.state()["batch"] == 5
    np.testing.assert_array_equal(next(iter(resumed)).input, full[0])  # a new epoch
    with pytest.raises(ValueError, match="bsz"):
        LMStreams(data, bsz=2, tgt_len=4).load_state(state)
    with pytest.raises(ValueError):
        LMStreams(data, bsz=61, tgt_len=4)


def test_real_wikitext_valid():
    path = shared_path("data", "wikitext103", "wiki.valid.tokens")
    vocab = Vocabulary.build(path)
    ids, oov = vocab.encode_file(path, return_oov=True)
    text = path.read_text(encoding="utf-8")
    words, lines = len(text.split()), text.count("\n")
    info = f"vocab {len(vocab)}, {len(ids)} tokens ({words} words + {lines} lines)"
    assert len(ids) == words + lines, info
    assert oov == 0 and vocab.tokens[:4] == [EOS, "the", ",", "."], info
    assert (len(vocab), len(ids)) == (18891, 217646), info
    assert int((ids == vocab.eos_id).sum()) == lines, info
    pos = sega_positions(path)
    assert pos.shape == (3, len(ids)), info
    n_paragraphs = sum(1 for line in text.split("\n")[:lines] if line.strip())
    assert int(pos[0, -1]) + 1 == n_paragraphs, info


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
