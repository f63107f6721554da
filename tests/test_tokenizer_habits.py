"""What a PaddleNLP or Hugging Face user types at a tokenizer, on tiny local folders: one str is a
batch of one once tensors are asked for (and goes into the model), a batch takes a list of
pairs, Class.from_pretrained / AutoTokenizer, model_max_length, decode / batch_decode keeping
the spaces, readable BPE tokens, and no punkt warning where nothing could differ."""
import json
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers import ROOT, bounded, tiny_config
from test_tokenization import write_tiny_bpe

from ernie_doc.errors import TokenizerError
from ernie_doc.tokenization import (BPETokenizer, WordPieceTokenizer, load_tokenizer,
                                    train_sentencepiece)

ZH = "长文档建模"
WORDS = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]", "naïve", "café", "world", ",", "!",
         "hello", "##s", *ZH]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """{kind: a folder holding only that tokenizer's files}."""
    root = tmp_path_factory.mktemp("tokenizers")
    (root / "wordpiece").mkdir()
    (root / "wordpiece" / "vocab.txt").write_text("\n".join(WORDS) + "\n", encoding="utf-8")
    (root / "bpe").mkdir()
    write_tiny_bpe(root / "bpe")
    return {"wordpiece": root / "wordpiece", "bpe": root / "bpe"}


@pytest.fixture(scope="module")
def spm(tmp_path_factory):
    d = tmp_path_factory.mktemp("spm")
    (d / "corpus.txt").write_text("alpha beta gamma delta\n" * 200, encoding="utf-8")
    model = train_sentencepiece(str(d / "corpus.txt"), str(d / "spm"), 40,
                                hard_vocab_limit=False)
    return load_tokenizer(model)


def test_one_text_is_a_batch_of_one_when_tensors_are_asked(folders):
    tok = load_tokenizer(folders["wordpiece"])
    plain = tok(ZH)   # lists: flat for one str, as Hugging Face and PaddleNLP
    assert plain["input_ids"] == [1, 12, 13, 14, 15, 16, 2]
    arrays = tok(ZH, return_tensors="np")
    assert {k: v.shape for k, v in arrays.items()} == {
        "input_ids": (1, 7), "token_type_ids": (1, 7), "attention_mask": (1, 7)}
    np.testing.assert_array_equal(arrays["input_ids"][0], plain["input_ids"])
    tensors = tok(ZH, return_tensors="pd")
    assert list(tensors["input_ids"].shape) == [1, 7]
    # and it goes into the model as it is
    from ernie_doc import ErnieDocModel
    model = ErnieDocModel(tiny_config(vocab_size=len(WORDS)))
    model.eval()
    out = model(**tensors)
    assert list(out.sequence_output.shape) == [1, 7, 32]
    assert list(tok([ZH, "hello"], padding=True, return_tensors="pd")["input_ids"].shape) == \
        [2, 7]


def test_a_batch_takes_one_pair_per_text(folders):
    tok = load_tokenizer(folders["wordpiece"])
    enc = tok(["hello world", "world"], ["hellos", "world !"], max_length=512, truncation=True,
              padding=True, return_offsets_mapping=True, return_tensors="np")
    assert enc["input_ids"].tolist() == [[1, 10, 7, 2, 10, 11, 2], [1, 7, 2, 7, 9, 2, 0]]
    assert enc["token_type_ids"].tolist() == [[0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 1, 0]]
    assert enc["offset_mapping"][0].tolist() == [[0, 0], [0, 5], [6, 11], [0, 0], [0, 5],
                                                 [5, 6], [0, 0]]
    # one str for a whole batch: an error in Hugging Face and PaddleNLP too, saying what to pass
    with pytest.raises(TypeError, match=r"batch of 2 texts and text_pair one str: pass one "
                                        r"pair per text, a list of 2 str"):
        tok(["hello", "world"], "café")
    with pytest.raises(TypeError, match="text is one str and text_pair a list"):
        tok("hello", ["café"])


def test_readme_tokenizers_block_runs(folders, tmp_path, monkeypatch):
    """The Tokenizers page's code (docs/tokenizers.md), with the released name standing for a
    local folder."""
    page = ROOT.joinpath("docs", "tokenizers.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert blocks
    monkeypatch.chdir(tmp_path)
    for code in blocks:
        code = code.replace('"ernie-doc-base-en"', repr(str(folders["bpe"])))
        exec(compile(code, "docs/tokenizers.md", "exec"), {})
    assert (tmp_path / "my-tokenizer" / "tokenizer_config.json").is_file()


def test_from_pretrained_and_auto_tokenizer(folders, tmp_path):
    from ernie_doc.tokenization import AutoTokenizer
    assert type(AutoTokenizer.from_pretrained(folders["bpe"])) is BPETokenizer
    assert type(AutoTokenizer.from_pretrained(folders["wordpiece"])) is WordPieceTokenizer
    tok = WordPieceTokenizer.from_pretrained(folders["wordpiece"], do_lower_case=False)
    assert tok.encode("Café") == [4] and BPETokenizer.from_pretrained(folders["bpe"]).encode(
        "hello") == [10]
    with pytest.raises(TokenizerError) as info:
        BPETokenizer.from_pretrained(folders["wordpiece"])
    assert str(info.value) == (f"{folders['wordpiece']}: holds a WordPieceTokenizer, not a "
                               f"BPETokenizer (AutoTokenizer.from_pretrained loads whichever "
                               f"it holds)")
    with pytest.raises(TypeError, match="use AutoTokenizer.from_pretrained"):
        AutoTokenizer()


def test_model_max_length(folders, tmp_path):
    tok = load_tokenizer(folders["wordpiece"])
    assert tok.model_max_length == 512   # nothing recorded: every released model's
    # truncation=True without max_length truncates to it, as in Hugging Face
    tok.model_max_length = 4
    assert tok(ZH, truncation=True)["input_ids"] == [1, 12, 13, 2]
    assert tok("hello", padding="max_length")["input_ids"] == [1, 10, 2, 0]
    saved = tmp_path / "saved"
    tok.save_pretrained(saved)
    assert json.loads((saved / "tokenizer_config.json").read_text())["model_max_length"] == 4
    assert load_tokenizer(saved).model_max_length == 4
    # a model folder: its config's max_position_embeddings, unless the tokenizer recorded one
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "vocab.txt").write_bytes((folders["wordpiece"] / "vocab.txt").read_bytes())
    (model_dir / "config.json").write_text(json.dumps({"max_position_embeddings": 16}))
    assert load_tokenizer(model_dir).model_max_length == 16
    assert "model_max_length" not in load_tokenizer(folders["wordpiece"]).saved_config()
    assert load_tokenizer(model_dir, model_max_length=8).model_max_length == 8
    for bad in ("0", "1e12", "1000000000000", "true"):   # one line naming the file, no padding
        (saved / "tokenizer_config.json").write_text(f'{{"model_max_length": {bad}}}')
        with pytest.raises(TokenizerError, match=r"tokenizer_config.json: model_max_length must "
                                                 r"be an integer from 1 to 1048576, got "):
            load_tokenizer(saved)


@pytest.mark.filterwarnings("ignore:nltk/punkt not available")
def test_decode_keeps_the_spaces(folders, spm):
    wordpiece = WordPieceTokenizer(folders["wordpiece"] / "vocab.txt", do_lower_case=False)
    text = "naïve café world, hello! " + ZH
    assert wordpiece.decode(wordpiece(text)["input_ids"], skip_special_tokens=True) == \
        "naïve café world, hello!" + ZH
    bpe = load_tokenizer(folders["bpe"])
    # the official encoding drops the space before a sentence's first word; decode puts it
    # back where a sentence starts (the real vocabulary's case, "U.S." and "3.14" kept whole:
    # test_tokenization.py::test_bpe_real_known_ids)
    for text in ("hello world! SAD", "hello world! [SEP] SAD"):
        assert bpe.decode(bpe.encode(text)) == text
    assert bpe.decode(bpe("hello", "world")["input_ids"], skip_special_tokens=True) == \
        "hello world"
    assert spm.decode(spm("alpha  beta gamma")["input_ids"], skip_special_tokens=True) == \
        "alpha beta gamma"


def test_batch_decode(folders, spm):
    import paddle
    for tok in (load_tokenizer(folders["wordpiece"]), load_tokenizer(folders["bpe"]), spm):
        texts = ["hello world", "hello"] if tok is not spm else ["alpha beta", "gamma"]
        enc = tok(texts, padding=True, return_tensors="np")
        want = [tok.decode(tok.encode(t)) for t in texts]
        assert tok.batch_decode(enc["input_ids"], skip_special_tokens=True) == want
        assert tok.batch_decode(paddle.to_tensor(enc["input_ids"]),
                                skip_special_tokens=True) == want
        assert tok.batch_decode(enc["input_ids"].tolist(), skip_special_tokens=True) == want


def test_bpe_tokens_are_readable(folders):
    tok = load_tokenizer(folders["bpe"])
    ids = tok.encode("hello world. hello [SEP] world")
    assert tok.convert_ids_to_tokens(ids) == ["hello", "Ġworld", "[UNK]", "hello", "[SEP]",
                                              "Ġworld"]
    assert tok.tokenize("hello world!") == ["hello", "Ġworld", "!"]
    for text in ("hello world!", "[p] hello [q] world [/q]", "SAD hello."):
        assert tok.convert_tokens_to_ids(tok.tokenize(text)) == tok.encode(text)
        assert tok.convert_tokens_to_ids(tok.convert_ids_to_tokens(tok.encode(text))) == \
            tok.encode(text)


def _stderr_of(code):
    """stderr of `code` in a fresh interpreter without nltk (as on a machine without punkt)."""
    run = subprocess.run([sys.executable, "-c", "import sys; sys.modules['nltk'] = None\n" +
                          textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert run.returncode == 0, run.stderr
    return run.stderr


def test_no_punkt_warning_where_nothing_splits(folders):
    load = f"from ernie_doc.tokenization import load_tokenizer\n" \
           f"tok = load_tokenizer({str(folders['bpe'])!r})\n"
    assert _stderr_of("import ernie_doc\n" + load + "tok('Great movie, loved it.')\n"
                      "tok.encode('hello world')\ntok.decode(tok.encode('hello SAD!'))\n") == ""
    # a text where punkt and the fallback could disagree: nothing on a library user's stderr;
    # one note, once per process, where a handler of the package's loggers listens (a
    # command's notes)
    splits = "tok('hello. world')\ntok('SAD. hello')\n"
    assert _stderr_of(load + splits) == ""
    listening = "import logging, sys\nlogging.getLogger('ernie_doc').addHandler(" \
                "logging.StreamHandler(sys.stderr))\nlogging.getLogger('ernie_doc')." \
                "setLevel(logging.INFO)\n"
    noted = _stderr_of(listening + load + splits)
    assert noted.count("nltk with its punkt data is not installed") == 1, noted


def test_what_the_tokenizers_do_not_take_is_one_clear_error(folders):
    """Hugging Face options they do not implement, bytes or None, a max_length beyond
    MAX_MODEL_MAX_LENGTH (refused before padding to it): one line naming what is wrong. A
    [1, T] tensor decodes as its row; WordPiece converts one id as BPE does."""
    import paddle
    for kind in ("wordpiece", "bpe"):
        tok = load_tokenizer(str(folders[kind]))
        for option in ("is_split_into_words", "return_length", "stride", "pad_to_multiple_of",
                       "return_special_tokens_mask"):
            with pytest.raises(TypeError, match=f"{option}= is a Hugging Face option this "
                                                f"tokenizer does not support"):
                tok("hello", **{option: 1})
        with pytest.raises(TypeError, match=r"got bytes \(decode bytes first"):
            tok(b"hello")
        with pytest.raises(TypeError, match="got NoneType"):
            tok(None)
        with bounded(), pytest.raises(TokenizerError, match=r"max_length must be an integer "
                                                           r"from 1 to 1048576, got "
                                                           r"1099511627776"):
            tok("hello", max_length=1 << 40, padding="max_length")
        enc = tok("hello world", return_tensors="pd")
        assert tok.decode(enc["input_ids"]) == tok.decode(enc["input_ids"][0])
        with pytest.raises(TypeError, match="batch_decode"):
            tok.decode(paddle.to_tensor(np.ones([2, 3], dtype=np.int64)))
    wordpiece = load_tokenizer(str(folders["wordpiece"]))
    assert wordpiece.convert_ids_to_tokens(10) == ["hello"]
    assert wordpiece.convert_ids_to_tokens(np.array([10, 7])) == ["hello", "world"]


def test_a_long_text_is_encoded_a_piece_at_a_time_to_the_same_ids(folders, spm):
    """encode_array (what a document's reading uses): int64 ids equal to encode(text), built
    from pieces cut before whitespace (WordPiece) or between sentences (BPE), so a long
    document's ids never stand as one list of Python ints."""
    from ernie_doc.tokenization import base
    rng = np.random.default_rng(0)
    words = ["hello", "world", "naïve", "café", "Hello", "SAD", "!", ",", "长文档", "建模",
             "Dr.", "U.S.", "3.14", "e.g."]
    seps = [" ", "  ", "\n", "\n\n", "\t", " \u3000", ". ", "! ", "\xa0"]
    text = "".join(str(rng.choice(words)) + str(rng.choice(seps)) for _ in range(40_000))
    assert len(text) > 3 * base.ENCODE_CHUNK_CHARS
    pieces = list(base.whitespace_chunks(text))
    assert "".join(pieces) == text and len(pieces) > 3
    assert all(p[:1].isspace() for p in pieces[1:])
    for tok in (load_tokenizer(folders["wordpiece"]), load_tokenizer(folders["bpe"]), spm):
        ids = tok.encode_array(text)
        assert ids.dtype == np.int64 and ids.tolist() == tok.encode(text), type(tok)
    assert list(base.whitespace_chunks("x" * 200_000)) == ["x" * 200_000]
