"""The tokenizer call PaddleNLP and Hugging Face users know (ernie_doc.tokenization.base), the
same on WordPiece, BPE and SentencePiece: ids exactly encode()'s, the [CLS] A [SEP] B [SEP]
layout, truncation, padding, offsets into the original text, tensors, save_pretrained."""
import json
import random

import numpy as np
import pytest
from test_tokenization import _imdb_texts, _zh_texts, need_shared

from ernie_doc.errors import TokenizerError
from ernie_doc.tokenization import (BPETokenizer, SentencePieceTokenizer, WordPieceTokenizer,
                                    load_tokenizer, train_sentencepiece)
from ernie_doc.tokenization.sentences import rule_split_sentences

SPECIALS = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]


@pytest.fixture
def wordpiece(tmp_path):
    vocab = SPECIALS + ["hello", "world", "na", "##ive", "cafe", "##s", ",", "!", "好", "坏",
                        "新", "闻"]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return WordPieceTokenizer(tmp_path / "vocab.txt")


@pytest.fixture(scope="module")
def sentencepiece(tmp_path_factory):
    d = tmp_path_factory.mktemp("spm")
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "café", "naïve", "北京", "résumé", "zeta"]
    (d / "corpus.txt").write_text("\n".join(" ".join(rng.choice(words) for _ in range(12))
                                            for _ in range(2000)) + "\n", encoding="utf-8")
    model = train_sentencepiece(str(d / "corpus.txt"), str(d / "spm"), 330,
                                byte_fallback=True, hard_vocab_limit=False)
    return SentencePieceTokenizer(model)


def spans(tok, text):
    ids, offsets = tok.encode_with_offsets(text)
    assert ids == tok.encode(text)   # the offsets path never changes an id
    return [text[a:b] for a, b in offsets]


def test_wordpiece_call_layout_truncation_padding(wordpiece):
    tok = wordpiece
    one = tok("Hello, world!")
    assert one == {"input_ids": [1, 5, 11, 6, 12, 2], "token_type_ids": [0] * 6,
                   "attention_mask": [1] * 6}
    pair = tok("hello 好", "新闻 world")
    assert pair["input_ids"] == [1, 5, 13, 2, 15, 16, 6, 2]
    assert pair["token_type_ids"] == [0, 0, 0, 0, 1, 1, 1, 1]
    # longest_first takes one token at a time from the longer (the second on a tie)
    long = tok("好 坏 好 坏", "新 闻 新 闻 新 闻 新", max_length=8, truncation=True)
    assert long["input_ids"] == [1, 13, 14, 13, 2, 15, 16, 2]
    assert tok("好 坏 好 坏", "新 闻 新 闻", max_length=8,
               truncation="only_second")["input_ids"] == [1, 13, 14, 13, 14, 2, 15, 2]
    assert tok("好 坏 好 坏", max_length=4, truncation="only_first")["input_ids"] == \
        [1, 13, 14, 2]
    assert len(tok("好 坏 好 坏", max_length=4)["input_ids"]) == 6   # no truncation asked
    batch = tok(["hello", "好 坏 新"], padding=True, return_offsets_mapping=True)
    assert batch["input_ids"] == [[1, 5, 2, 0, 0], [1, 13, 14, 15, 2]]
    assert batch["attention_mask"] == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert batch["offset_mapping"][0] == [(0, 0), (0, 5), (0, 0), (0, 0), (0, 0)]
    assert tok("hello", add_special_tokens=False, return_attention_mask=False,
               return_token_type_ids=False) == {"input_ids": [5]}
    arrays = tok(["hello", "好 坏 新"], padding="max_length", max_length=6, return_tensors="np")
    assert arrays["input_ids"].dtype == np.int64 and arrays["input_ids"].shape == (2, 6)
    np.testing.assert_array_equal(arrays["attention_mask"][0], [1, 1, 1, 0, 0, 0])
    with pytest.raises(ValueError, match="pass padding=True"):
        tok(["hello", "好 坏 新"], return_tensors="np")
    with pytest.raises(ValueError, match="text_pair must match text"):
        tok(["a", "b"], ["c"])
    tensors = tok("hello", return_tensors="pd")   # one text: a batch of one, as HF and PaddleNLP
    assert tensors["input_ids"].shape == [1, 3]
    assert str(tensors["input_ids"].dtype).endswith("int64")


def test_wordpiece_offsets_point_into_the_original_text(wordpiece):
    text = "  Héllo,\tWÖRLD!  naïve CAFÉS 好\x01坏 ΟΔΟΣ"
    assert spans(wordpiece, text) == ["Héllo", ",", "WÖRLD", "!", "na", "ïve", "CAFÉ", "S",
                                      "好", "坏", "ΟΔΟΣ"]


def test_wordpiece_matches_paddlenlp_call(tmp_path):
    vocab = need_shared("assets", "ernie-doc", "base-zh", "vocab.txt")
    pytest.importorskip("paddlenlp")
    from paddlenlp.transformers import ErnieDocTokenizer
    plain = tmp_path / "vocab.txt"   # PaddleNLP reads one token per line
    plain.write_text("".join(line.split("\t")[0].rstrip("\n") + "\n"
                             for line in open(vocab, encoding="utf-8")), encoding="utf-8")
    ref = ErnieDocTokenizer(str(plain))
    ours = WordPieceTokenizer(vocab, split_symbols=True)   # PaddleNLP's symbol rule
    texts = _zh_texts(40, 10)
    for a, b in zip(texts, texts[1:] + texts[:1]):
        for kwargs in ({}, {"max_length": 64, "truncation": True},
                       {"max_length": 48, "truncation": "only_second"}):
            want = ref(a, b, **kwargs)
            got = ours(a, b, **kwargs)
            assert got["input_ids"] == want["input_ids"]
            assert got["token_type_ids"] == want["token_type_ids"]
        want = ref(a, return_offsets_mapping=True)
        got = ours(a, return_offsets_mapping=True)
        assert got["input_ids"] == want["input_ids"]
        assert [tuple(o) for o in got["offset_mapping"]] == \
            [tuple(o) for o in want["offset_mapping"]]
    want = ref(texts[:4], padding="max_length", max_length=40, truncation=True)
    got = ours(texts[:4], padding="max_length", max_length=40, truncation=True)
    assert got["input_ids"] == want["input_ids"]


def test_bpe_call_and_offsets():
    base = need_shared("assets", "ernie-doc", "base-en")
    tok = BPETokenizer.from_dir(base, sentence_splitter=rule_split_sentences)
    assert tok("This is an example")["input_ids"] == [0, 713, 16, 41, 1246, 2]
    pair = tok("Hello world", "second part", return_offsets_mapping=True)
    assert pair["token_type_ids"] == [0, 0, 0, 0, 1, 1, 1]
    assert pair["offset_mapping"] == [(0, 0), (0, 5), (6, 11), (0, 0), (0, 6), (7, 11), (0, 0)]
    text = "  The café's   price was $3.50!  Naïve résumé 🙂 ok. [SEP] Next one.\n\n𝔘𝔫𝔦 ok"
    assert spans(tok, text)[:12] == ["The", "café", "'s", "price", "was", "$", "3", ".", "50",
                                     "!", "Na", "ïve"]
    pieces = spans(tok, text)
    assert "[SEP]" in pieces and "🙂" in pieces
    # a character spelled over several byte tokens: every one of them covers it
    assert set(pieces[-4:-1]) <= {"𝔘", "𝔫", "𝔦"}
    for review in _imdb_texts(30):
        ids, offsets = tok.encode_with_offsets(review)
        assert ids == tok.encode(review)
        assert all(0 <= a <= b <= len(review) for a, b in offsets)
        assert all(review[a:b].strip() == review[a:b] for a, b in offsets)


def test_sentencepiece_call_and_offsets(sentencepiece):
    tok = sentencepiece
    text = "  Café alpha 北京xyz  ÅNGSTRÖM 🙂 beta"
    pieces = spans(tok, text)
    assert pieces[:6] == ["", "C", "a", "f", "é", "alpha"]
    assert pieces[-1] == "beta" and pieces.count("🙂") == 4 and pieces.count("Å") == 2
    enc = tok(["alpha beta", "gamma"], padding=True)
    assert enc["input_ids"][1][-1] == tok.pad_token_id
    assert enc["input_ids"][0][0] == tok.cls_token_id


def test_save_pretrained_round_trip(wordpiece, sentencepiece, tmp_path):
    text = "Hello, naive 好 world"
    for tok in (WordPieceTokenizer(wordpiece.vocab_file, do_lower_case=False), sentencepiece):
        out = tmp_path / type(tok).__name__
        (out).mkdir()
        (out / "keep.txt").write_text("mine")
        written = tok.save_pretrained(out)
        assert sorted(p.rsplit("/", 1)[-1] for p in written) == sorted(
            [*tok._files(), "tokenizer_config.json"])
        again = load_tokenizer(out)
        assert type(again) is type(tok) and again.encode(text) == tok.encode(text)
        assert (out / "keep.txt").read_text() == "mine"
        assert not [p for p in out.iterdir() if p.name.startswith(".tmp")]
    config = json.loads((tmp_path / "WordPieceTokenizer" / "tokenizer_config.json").read_text())
    assert config == {"do_lower_case": False, "split_symbols": False,
                      "tokenizer_class": "WordPieceTokenizer", "model_max_length": 512}
    assert load_tokenizer(tmp_path / "WordPieceTokenizer").encode("Hello") == [4]   # [UNK]
    base = need_shared("assets", "ernie-doc", "base-en")
    bpe = BPETokenizer.from_dir(base)
    bpe.save_pretrained(tmp_path / "bpe")
    for name in ("vocab.txt", "encoder.json", "vocab.bpe"):
        assert (tmp_path / "bpe" / name).read_bytes() == (base / name).read_bytes()
    assert type(load_tokenizer(tmp_path / "bpe")) is BPETokenizer


def test_bad_tokenizer_config_is_one_line(wordpiece, tmp_path):
    wordpiece.save_pretrained(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": "Nope"}')
    with pytest.raises(TokenizerError, match=r"tokenizer_config.json: tokenizer_class 'Nope' "
                                             r"is not one of"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"do_lower_case": "yes"}')
    with pytest.raises(TokenizerError, match="do_lower_case must be true or false"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"do_lower_case": true, '
                                                     '"do_lower_case": false}')
    with pytest.raises(TokenizerError, match=r'tokenizer_config.json: the key "do_lower_case" '
                                             r'appears twice in one object$'):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": "BPETokenizer"}')
    with pytest.raises(TokenizerError, match="records BPETokenizer, which needs encoder.json, "
                                             "vocab.bpe: not there"):
        load_tokenizer(tmp_path)
