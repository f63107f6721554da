"""Tests for ernie_doc.tokenization.

Reference files come from the project's shared/ folder (or $ERNIE_DOC_SHARED)
and tests needing them skip when absent; PaddleNLP is imported lazily, only
by the comparison tests, which skip without it."""

from __future__ import annotations

import json
import os
import random
import runpy
import subprocess
import sys
import tracemalloc
import types
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from ernie_doc.errors import TokenizerError  # noqa: E402
from ernie_doc.tokenization import split_sentences  # noqa: E402
from ernie_doc.tokenization import (BPETokenizer, SentencePieceTokenizer,  # noqa: E402
                                    WordPieceTokenizer, load_tokenizer)
from ernie_doc.tokenization import sentences as sentences_mod  # noqa: E402
from ernie_doc.tokenization.bpe import OFFICIAL_SPECIAL_TOKENS, bytes_to_unicode  # noqa: E402
from ernie_doc.tokenization.sentences import rule_split_sentences  # noqa: E402
from ernie_doc.tokenization.vocab import Vocab, load_vocab  # noqa: E402


def shared_dir() -> Path:
    """The project's shared/ folder (reference assets and data), or $ERNIE_DOC_SHARED."""
    env = os.environ.get("ERNIE_DOC_SHARED")
    return Path(env) if env else REPO.parent / "shared"


def need_shared(*parts: str) -> Path:
    path = shared_dir().joinpath(*parts)
    if not path.exists():
        pytest.skip(f"reference file absent: {path}")
    return path


# --------------------------------------------------------------------------- vocab
def test_vocab_one_token_per_line(tmp_path):
    f = tmp_path / "vocab.txt"
    f.write_text("[CLS]\n[PAD]\n[SEP]\n[UNK]\n13\n 262 \n", encoding="utf-8")
    assert load_vocab(f) == {"[CLS]": 0, "[PAD]": 1, "[SEP]": 2, "[UNK]": 3, "13": 4, "262": 5}


def test_vocab_token_tab_id(tmp_path):
    f = tmp_path / "vocab.txt"
    # ids are taken from the file, not from the line number; a line without an
    # id falls back to its line number. (The ids must be 0..N-1: test_vocab_ids_must_be_dense.)
    f.write_text("[PAD]\t1\n[CLS]\t0\n你\t2\nhello\n##a \t4\n", encoding="utf-8")
    assert load_vocab(f) == {"[PAD]": 1, "[CLS]": 0, "你": 2, "hello": 3, "##a": 4}


def test_vocab_more_than_two_fields_stops_reading(tmp_path):
    f = tmp_path / "vocab.txt"
    f.write_text("a\t0\nb\t1\nc\t2\textra\nd\t3\n", encoding="utf-8")
    assert load_vocab(f) == {"a": 0, "b": 1}


def test_vocab_lookup_with_unk():
    v = Vocab({"[UNK]": 3, "x": 0, "y": 5})
    assert v.to_ids(["x", "zz", "y"]) == [0, 3, 5]
    assert v.to_tokens([5, 0, 42]) == ["y", "x", "[UNK]"]
    assert len(v) == 3 and v.size == 6


# ------------------------------------------------------------------ tiny BPE files
# GPT-2 ids of the hand-built encoder; merges build "hello", "Ġworld", "Ġhello".
_TINY_MERGES = [
    ("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"),
    ("Ġ", "w"), ("o", "r"), ("Ġw", "or"), ("Ġwor", "l"), ("Ġworl", "d"),
    # "h e" outranks any merge with "Ġ", so " hello" becomes "Ġ" + "hello" first.
    ("Ġ", "hello"),
]


def write_tiny_bpe(directory: Path) -> dict:
    singles = ["h", "e", "l", "o", "w", "r", "d", ".", "Ġ", "!", "[", "]", "S", "E", "P", "A", "D"]
    pieces = singles + ["".join(m) for m in _TINY_MERGES]
    encoder = {p: i for i, p in enumerate(pieces)}
    (directory / "encoder.json").write_text(json.dumps(encoder), encoding="utf-8")
    (directory / "vocab.bpe").write_text(
        "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in _TINY_MERGES), encoding="utf-8"
    )
    # Model vocab in another order than GPT-2 ids, like RoBERTa's dict;
    # GPT-2 id of "." is left out to exercise the [UNK] fallback.
    gpt2_ids = [i for i in reversed(range(len(pieces))) if i != encoder["."]]
    lines = ["[CLS]", "[PAD]", "[SEP]", "[UNK]"] + [str(i) for i in gpt2_ids] + ["[p]", "[q]", "[/q]", "[MASK]"]
    (directory / "vocab.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return encoder


@pytest.fixture
def tiny_bpe(tmp_path):
    enc = write_tiny_bpe(tmp_path)
    return BPETokenizer.from_dir(tmp_path, sentence_splitter=rule_split_sentences), enc


def test_bpe_tiny_exact_tokens_and_ids(tiny_bpe):
    tok, enc = tiny_bpe
    # Two sentences; the second starts with "hello" without the Ġ marker, and
    # the word after [SEP] keeps its leading space (official encoder).
    assert (enc["hello"], enc["Ġworld"], enc["."], enc["Ġhello"]) == (20, 25, 7, 26)
    text = "hello   world. hello [SEP] world"
    assert tok.tokenize(text) == ["hello", "Ġworld", ".", "hello", "[SEP]", "Ġworld"]
    # vocab.txt lists GPT-2 ids 26..0 from line 4 on (7 missing -> [UNK]=3).
    assert tok.encode(text) == [10, 5, 3, 10, 2, 5]
    # Without sentence splitting the second "hello" gets the space marker.
    assert tok.tokenize("hello world. hello", sentence_split=False) == ["hello", "Ġworld", ".",
                                                                         "Ġhello"]
    assert tok.encode("hello world. hello", sentence_split=False) == [10, 5, 3, 4]


def test_bpe_tiny_special_tokens_and_ids(tiny_bpe):
    tok, _ = tiny_bpe
    assert tok.tokenize("[p] hello [q] world [/q] [PAD]") == ["[p]", "Ġhello", "[q]", "Ġworld",
                                                              "[/q]", "[PAD]"]
    assert tok.encode("[p] hello [q] world [/q] [PAD]") == [30, 4, 31, 5, 32, 1]
    # Glued to other characters a special token is ordinary text.
    assert tok.tokenize("hello [SEP]!") == ["hello", "Ġ", "[", "S", "E", "P", "]", "!"]
    assert (tok.cls_token_id, tok.pad_token_id, tok.sep_token_id, tok.unk_token_id, tok.mask_token_id) == (
        0, 1, 2, 3, 33)
    assert tok.vocab_size == 34 == len(tok)


def test_bpe_tiny_official_special_set(tmp_path):
    write_tiny_bpe(tmp_path)
    tok = BPETokenizer.from_dir(tmp_path, special_tokens=OFFICIAL_SPECIAL_TOKENS,
                                sentence_splitter=rule_split_sentences)
    # The official encoder keeps only [SEP] [p] [q] [/q] whole; "[PAD]" is BPE'd.
    assert tok.tokenize("hello [SEP] [PAD]") == ["hello", "[SEP]", "Ġ", "[", "P", "A", "D", "]"]


def test_bpe_tiny_decode(tiny_bpe):
    tok, _ = tiny_bpe
    ids = tok.encode("hello world [SEP] hello")
    assert tok.decode(ids) == "hello world [SEP] hello"
    assert tok.decode(ids, skip_special_tokens=True) == "hello world hello"
    assert tok.convert_ids_to_tokens(tok.convert_tokens_to_ids(["[SEP]", "[p]"])) == ["[SEP]", "[p]"]


def test_bytes_to_unicode_is_a_bijection():
    table = bytes_to_unicode()
    assert len(table) == 256 == len(set(table.values()))
    assert table[ord(" ")] == "Ġ" and table[ord("A")] == "A"


# -------------------------------------------------------------- real English files
@pytest.fixture(scope="module")
def en_bpe():
    base = need_shared("assets", "ernie-doc", "base-en")
    for name in ("vocab.txt", "encoder.json", "vocab.bpe"):
        need_shared("assets", "ernie-doc", "base-en", name)
    return BPETokenizer.from_dir(base, sentence_splitter=rule_split_sentences)


def test_bpe_real_known_ids(en_bpe):
    assert en_bpe.encode("This is an example") == [713, 16, 41, 1246]
    assert (en_bpe.cls_token_id, en_bpe.pad_token_id, en_bpe.sep_token_id,
            en_bpe.unk_token_id, en_bpe.mask_token_id) == (0, 1, 2, 3, 50264)
    assert en_bpe.vocab_size == 50265
    assert en_bpe.convert_tokens_to_ids(["[p]", "[q]", "[/q]"]) == [50261, 50262, 50263]
    # The first word of every sentence has no space marker: "This" twice
    # encodes to the same id.
    ids = en_bpe.encode("This is it. This is it.")
    assert ids[0] == ids[len(ids) // 2] == 713
    # Decoding is byte-exact; the space between sentences (not in the ids) is put back.
    text = "Hello world. It's 3.14, isn't it? Ünïcödé 😀"
    assert en_bpe.decode(en_bpe.encode(text)) == text
    text = 'The U.S. Army won. It cost $3.14 per item. "Great!" She said (really).'
    assert en_bpe.decode(en_bpe.encode(text)) == text
    assert en_bpe.convert_ids_to_tokens(en_bpe.encode("Hello world. This")) == [
        "Hello", "Ġworld", ".", "This"]


def _imdb_texts(n):
    path = need_shared("data", "imdb", "imdb_test_sample5k.tsv")
    with open(path, encoding="utf-8") as f:
        # Plain TAB split: reviews may start with a quote character.
        rows = [line.rstrip("\n").split("\t", 3) for line in f]
    assert rows[0] == ["qid", "label", "score", "text_a"]
    return [r[3] for r in rows[1 : n + 1]]


@pytest.fixture(scope="module")
def paddlenlp_transformers():
    pytest.importorskip("paddlenlp", reason="PaddleNLP not installed")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import paddlenlp.transformers as transformers
    return transformers


def test_bpe_matches_paddlenlp_on_imdb(en_bpe, paddlenlp_transformers, monkeypatch):
    base = shared_dir() / "assets" / "ernie-doc" / "base-en"
    # PaddleNLP calls nltk.tokenize.sent_tokenize; give it our splitter so the
    # comparison is about BPE, not about sentence splitting.
    fake_nltk = types.SimpleNamespace(tokenize=types.SimpleNamespace(sent_tokenize=rule_split_sentences))
    monkeypatch.setitem(sys.modules, "nltk", fake_nltk)
    ref = paddlenlp_transformers.ErnieDocBPETokenizer(
        str(base / "vocab.txt"),
        encoder_json_path=str(base / "encoder.json"),
        vocab_bpe_path=str(base / "vocab.bpe"),
    )
    ref.nltk = fake_nltk
    texts = _imdb_texts(50)
    for text in texts:
        assert en_bpe.encode(text) == ref.convert_tokens_to_ids(ref.tokenize(text))
    assert ref.convert_tokens_to_ids(ref.tokenize("This is an example")) == [713, 16, 41, 1246]


# ----------------------------------------------------------------------- WordPiece
def test_wordpiece_tiny(tmp_path):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##want", "##ed", "want", "runn", "##ing",
             ",", "我", "爱", "hello", "a", "##a", "$", "～", "¿", "Hé"]
    f = tmp_path / "vocab.txt"
    f.write_text("".join(f"{t}\t{i}\n" for i, t in enumerate(vocab)), encoding="utf-8")
    tok = WordPieceTokenizer(f)
    assert tok.tokenize("UNwant\u00e9d,running") == ["un", "##want", "##ed", ",", "runn", "##ing"]
    # Accents stripped, CJK split per character, control chars dropped.
    assert tok.tokenize("Héllo\u200b 我爱\x00hello\ufffd") == ["hello", "我", "爱", "hello"]
    # ASCII non-alphanumerics and Unicode P* split; symbols (～ is Sm) do not.
    assert tok.tokenize("a$a ¿a a～") == ["a", "$", "a", "¿", "a", "[UNK]"]
    assert WordPieceTokenizer(f, split_symbols=True).tokenize("a～") == ["a", "～"]
    assert tok.tokenize("xyz") == ["[UNK]"]
    assert tok.tokenize("a" * 100) == ["a"] + ["##a"] * 99
    assert tok.tokenize("a" * 101) == ["[UNK]"]
    assert WordPieceTokenizer(f, do_lower_case=False).tokenize("Hé hello") == ["Hé", "hello"]
    assert tok.encode("我爱hello") == [12, 13, 14]
    assert (tok.pad_token_id, tok.unk_token_id, tok.cls_token_id, tok.sep_token_id, tok.mask_token_id) == (
        0, 1, 2, 3, 4)
    assert tok.decode([2, 12, 13, 14, 5, 6, 3], skip_special_tokens=True) == "我爱hello unwant"
    assert tok.vocab_size == len(vocab) == len(tok)


@pytest.fixture(scope="module")
def zh_vocab_file():
    return need_shared("assets", "ernie-doc", "base-zh", "vocab.txt")


def _zh_texts(n_iflytek, n_cmrc):
    ifl = need_shared("data", "iflytek", "dev_few_all.json")
    with open(ifl, encoding="utf-8") as f:
        sents = [json.loads(line)["sentence"] for line in f if line.strip()][:n_iflytek]
    cmrc = need_shared("data", "cmrc2018", "cmrc2018_dev.json")
    with open(cmrc, encoding="utf-8") as f:
        data = json.load(f)["data"]
    contexts = [p["context"] for art in data for p in art["paragraphs"]][:n_cmrc]
    return sents + contexts


def test_wordpiece_real_special_ids(zh_vocab_file):
    tok = WordPieceTokenizer(zh_vocab_file)
    assert (tok.pad_token_id, tok.cls_token_id, tok.sep_token_id, tok.mask_token_id, tok.unk_token_id) == (
        0, 1, 2, 3, 27599)
    assert tok.vocab_size == 27600
    # "25℃" is one basic token and ℃ has no piece: the official reader gives [UNK].
    assert tok.tokenize("温度25℃") == ["温", "度", "[UNK]"]


def test_wordpiece_matches_paddlenlp(zh_vocab_file, paddlenlp_transformers, tmp_path):
    # PaddleNLP reads one token per line; the official zh vocab is "token<TAB>id".
    plain = tmp_path / "vocab.txt"
    with open(zh_vocab_file, encoding="utf-8") as f:
        plain.write_text("".join(line.rstrip("\n").split("\t")[0] + "\n" for line in f), encoding="utf-8")
    ref = paddlenlp_transformers.ErnieDocTokenizer(str(plain))
    ours_compat = WordPieceTokenizer(zh_vocab_file, split_symbols=True)
    ours = WordPieceTokenizer(zh_vocab_file)
    from ernie_doc.tokenization.wordpiece import is_punctuation, is_symbol

    texts = _zh_texts(200, 20)
    same_official = 0
    for text in texts:
        expected = ref.convert_tokens_to_ids(ref.tokenize(text))
        assert ours_compat.encode(text) == expected
        # The official rule differs from PaddleNLP only where a Unicode
        # symbol (S*) sits next to other characters.
        if not any(is_symbol(c) and not is_punctuation(c) for c in text):
            assert ours.encode(text) == expected
            same_official += 1
    assert same_official > len(texts) // 2


# ----------------------------------------------------------- sentence splitting
# Expected values were checked against NLTK's Punkt with its English model.
RULE_CASES = [
    ("Mr. Smith went to Washington. He arrived at 5 p.m. today.",
     ["Mr. Smith went to Washington.", "He arrived at 5 p.m. today."]),
    ("It cost $3.14 in 1999. Then prices rose to 4.5 dollars.",
     ["It cost $3.14 in 1999.", "Then prices rose to 4.5 dollars."]),
    ('He said "hello." Then he left.', ['He said "hello."', "Then he left."]),
    ("Really?! Yes... I think so. (It was fine.) The end!",
     ["Really?!", "Yes...", "I think so.", "(It was fine.)", "The end!"]),
    ("J. R. R. Tolkien wrote it. Plan B. The end.", ["J. R. R. Tolkien wrote it.", "Plan B.", "The end."]),
    ("Dr. Jones and Mrs. Brown met St. Peter. The rest.",
     ["Dr. Jones and Mrs. Brown met St. Peter.", "The rest."]),
    ("Wait... Then what? he asked.", ["Wait... Then what?", "he asked."]),
    ("The end. then lower case.", ["The end.", "then lower case."]),
    ("She left!' And that was it.", ["She left!'", "And that was it."]),
    ("Great movie.10/10 would watch again.", ["Great movie.10/10 would watch again."]),
    ("It was the U.S. The end.", ["It was the U.S.", "The end."]),
    # Punkt's English model does not list "e.g." as an abbreviation.
    ("Some films, e.g. this one, are long.", ["Some films, e.g.", "this one, are long."]),
    ("", []),
]


@pytest.mark.parametrize("text, expected", RULE_CASES)
def test_rule_splitter(text, expected):
    assert rule_split_sentences(text) == expected
    assert split_sentences(text, use_nltk=False) == expected


def test_fallback_is_said_once_where_a_command_listens(monkeypatch):
    """Without punkt, the fallback is one INFO record of ernie_doc.tokenization, given to a
    handler of the ernie_doc loggers (a command's notes) the first time a text could be split;
    never a warning, nor a record for the root logger's handler alone (paddle's import adds
    one at INFO, on stderr)."""
    import logging
    monkeypatch.setattr(sentences_mod, "_nltk_checked", True)
    monkeypatch.setattr(sentences_mod, "_nltk_splitter", None)
    monkeypatch.setattr(sentences_mod, "_fallback_warned", False)
    package = logging.getLogger("ernie_doc")
    monkeypatch.setattr(package, "handlers", [])
    monkeypatch.setattr(package, "propagate", True)
    monkeypatch.setattr(package, "level", logging.NOTSET)
    seen = []

    class Collect(logging.Handler):
        def emit(self, record):
            seen.append((self.name, record.levelname, record.getMessage()))
    root = Collect()
    root.name = "root"
    monkeypatch.setattr(logging.root, "handlers", [root])
    monkeypatch.setattr(logging.root, "level", logging.INFO)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert split_sentences("One. Two.") == ["One.", "Two."]
        assert seen == [] and caught == []   # a library user: nothing said
        notes = Collect()
        notes.name = "notes"
        monkeypatch.setattr(package, "handlers", [notes])   # a command's notes
        monkeypatch.setattr(package, "level", logging.INFO)
        assert split_sentences("Three. Four.") == ["Three.", "Four."]
        assert split_sentences("Five. Six.") == ["Five.", "Six."]
        split_sentences("Seven.", use_nltk=False)
    assert caught == []
    assert [(name, level) for name, level, _ in seen] == [("notes", "INFO"), ("root", "INFO")]
    assert seen[0][2] == sentences_mod.FALLBACK_NOTE
    assert seen[0][2].startswith("sentences: nltk with its punkt data is not installed")
    with pytest.raises(RuntimeError):
        split_sentences("x", use_nltk=True)


def test_importing_and_first_use_print_nothing(tmp_path):
    """On a clean install (no nltk, no ccache on PATH): importing ernie_doc and paddle through
    it, `ernie-doc --help`, and the sentence splitter's first use print nothing on stderr."""
    code = ("import sys\nsys.modules['nltk'] = None   # not installed\n"
            "import ernie_doc\nfrom ernie_doc import ErnieDocModel, AutoTokenizer, pipeline\n"
            "import paddle\nfrom ernie_doc.tokenization.sentences import split_sentences\n"
            "print(split_sentences('It rained. Mr. Smith left.'))\n"
            "from ernie_doc.cli import main\nmain(['--help'])\n")
    path = [d for d in os.environ["PATH"].split(os.pathsep)
            if not os.access(os.path.join(d, "ccache"), os.X_OK)]   # paddle's import warns
    env = dict(os.environ, PATH=os.pathsep.join(path),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("PYTHONWARNINGS", None)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.startswith("['It rained.', 'Mr. Smith left.']\nusage: ernie-doc")


def test_nltk_used_when_available():
    """Punkt's real English model against the rules on IMDB: the model is nltk data, not on
    PyPI (`python -m nltk.downloader punkt`), so this skips offline; the tests below build
    what they need."""
    if not sentences_mod.nltk_available():
        pytest.skip("needs nltk and punkt's English model (nltk data, not on PyPI)")
    import nltk

    texts = _imdb_texts(200)
    for text in texts[:20]:
        assert split_sentences(text) == nltk.tokenize.sent_tokenize(text)
    agree = sum(rule_split_sentences(" ".join(t.split())) == nltk.tokenize.sent_tokenize(" ".join(t.split()))
                for t in texts)
    assert agree >= 0.9 * len(texts)


# Punkt of nltk 3.6.2 (ERNIE-Doc's pin; 3.6.6 rewrote the candidate search, 3.8.2 moved the
# English model from a pickle to punkt_tab) with parameters built here: the real English
# model is nltk data, not on PyPI.
def _punkt_3_6():
    nltk = pytest.importorskip("nltk")
    version = tuple(int(x) for x in nltk.__version__.split(".")[:3])
    if version >= (3, 6, 6):
        pytest.skip(f"nltk {nltk.__version__}: the rules follow nltk 3.6.2's Punkt (3.6.6 "
                    f"changed its candidate search)")
    return nltk


def punkt_parameters(extra_abbreviations=()):
    """nltk PunktParameters that the rule splitter's tables stand for: its abbreviations, its
    frequent sentence starters, and every common word seen lower- and upper-case inside a
    sentence (so a capitalised one is never sure evidence of a sentence start, and an initial
    before it is no name's initial: `_COMMON_WORDS`)."""
    from nltk.tokenize.punkt import _ORTHO_MID_LC, _ORTHO_MID_UC, PunktParameters
    params = PunktParameters()
    params.abbrev_types = set(sentences_mod._ABBREVIATIONS) | set(extra_abbreviations)
    params.sent_starters = set(sentences_mod._SENTENCE_STARTERS)
    for word in sentences_mod._COMMON_WORDS:
        params.add_ortho_context(word, _ORTHO_MID_LC | _ORTHO_MID_UC)
    return params


PUNKT_WORDS = ("Mr. Dr. U.S. p.m. e.g. etc. so-called. J. B. C. a. e. 5. 10. 3.14 1999. ... .. -- "
               "The the He he She she It it I Then then But however Smith Washington movie "
               "Movie And and (It was) fine.) \"hello.\" left!' Really?! What? yes! "
               "Wow!!!This end.10/10 end. ; : , ) ( ' \"").split()


def punkt_texts(n, seed=0):
    """Random texts of the words Punkt's decisions turn on."""
    rng = random.Random(seed)
    return [rng.choice((" ", " ", "  ", "\n")).join(
        rng.choice(PUNKT_WORDS) for _ in range(rng.randint(1, 12))) for _ in range(n)]


def test_rule_splitter_is_nltk_3_6_punkt_with_its_tables():
    """The rules are Punkt's decisions (nltk 3.6.2, the official reader's `sent_tokenize`)
    with hand-written tables in place of the English model's statistics: with exactly those
    tables as parameters, nltk splits every text as the rules do."""
    _punkt_3_6()
    from nltk.tokenize.punkt import PunktSentenceTokenizer
    punkt = PunktSentenceTokenizer(punkt_parameters())
    cases = [text for text, _ in RULE_CASES] + punkt_texts(3000)
    for text in cases:
        assert rule_split_sentences(text) == punkt.tokenize(text), text


def test_split_sentences_uses_nltk_when_punkt_loads(tmp_path, monkeypatch):
    """With an English Punkt model on nltk's data path, split_sentences (and so the BPE
    tokenizer) splits with nltk's sent_tokenize, as the official reader and PaddleNLP do. The
    model here knows "e.g", which the rules do not: the two disagree on the text."""
    nltk = _punkt_3_6()
    import pickle

    from nltk.tokenize.punkt import PunktSentenceTokenizer
    model = tmp_path / "tokenizers" / "punkt" / "PY3"   # where nltk 3.6 loads pickles from
    model.mkdir(parents=True)
    with open(model / "english.pickle", "wb") as f:
        pickle.dump(PunktSentenceTokenizer(punkt_parameters(["e.g"])), f)
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])
    monkeypatch.setattr(nltk.data, "_resource_cache", {})
    monkeypatch.setattr(sentences_mod, "_nltk_checked", False)
    monkeypatch.setattr(sentences_mod, "_nltk_splitter", None)
    text = "Some films, e.g. this one, are long. The end."
    assert rule_split_sentences(text) == ["Some films, e.g.", "this one, are long.", "The end."]
    assert sentences_mod.nltk_available()
    assert split_sentences(text) == nltk.tokenize.sent_tokenize(text) == [
        "Some films, e.g. this one, are long.", "The end."]
    assert split_sentences(text, use_nltk=False) == rule_split_sentences(text)


# ---------------------------------------------------------------- SentencePiece
def _spm_corpus(path: Path):
    words = ("the movie was good bad actor story plot great boring film ending scene music really not very "
             "and but I liked hated director camera dialogue sequel character script horror comedy drama "
             "funny sad beautiful terrible performance cast budget effects action romance watching watched "
             "think thought minutes hours better worse best worst original remake version audience").split()
    lines = []
    for i in range(600):
        n = 5 + i % 7
        lines.append(" ".join(words[(i * 7 + j * 3 + i // 50) % len(words)] for j in range(n)) + ".")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.fixture(scope="module")
def spm_dir(tmp_path_factory):
    pytest.importorskip("sentencepiece")
    d = tmp_path_factory.mktemp("spm")
    corpus = d / "corpus.txt"
    _spm_corpus(corpus)
    cli = runpy.run_path(str(REPO / "tools" / "train_tokenizer.py"))
    rc = cli["main"](["--input", str(corpus), "--output-dir", str(d / "tok"), "--vocab-size", "120",
                      "--model-type", "bpe"])
    assert rc == 0
    return d / "tok"


def test_spm_train_and_load(spm_dir):
    assert (spm_dir / "spm.model").is_file() and (spm_dir / "spm.vocab").is_file()
    tok = load_tokenizer(spm_dir)
    assert isinstance(tok, SentencePieceTokenizer)
    assert (tok.pad_token_id, tok.unk_token_id, tok.cls_token_id, tok.sep_token_id, tok.mask_token_id) == (
        0, 1, 2, 3, 4)
    assert tok.vocab_size == 120 == len(tok)
    text = "the movie was really good but the ending was boring."
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.convert_tokens_to_ids(tok.tokenize(text)) == ids
    # User-defined specials are recognised inside raw text.
    assert tok.sep_token_id in tok.encode("good [SEP] bad")
    assert tok.decode([tok.cls_token_id] + ids + [tok.pad_token_id], skip_special_tokens=True) == text


def test_spm_unigram_round_trip(tmp_path):
    pytest.importorskip("sentencepiece")
    from ernie_doc.tokenization.spm import train

    corpus = tmp_path / "c.txt"
    _spm_corpus(corpus)
    model = train([corpus], tmp_path / "uni", vocab_size=80, model_type="unigram")
    tok = SentencePieceTokenizer(model)
    text = "I liked the great plot and the music."
    assert tok.decode(tok.encode(text)) == text
    assert tok.convert_ids_to_tokens([0, 1, 2, 3, 4]) == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def test_train_cli_missing_input(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "train_tokenizer.py"), "--input", str(tmp_path / "nope.txt"),
         "--output-dir", str(tmp_path / "out"), "--vocab-size", "100"],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: {tmp_path / 'nope.txt'}: input file not found"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("content, args, message", [
    (b"", [], "input.txt: input file has no text"),
    (b"ok\n\xff\n", [], "input.txt:2: invalid UTF-8"),
    (b"hello world\n", ["--character-coverage", "2"], "--character-coverage must be in [0.98, 1], got 2.0"),
    (b"hello world\n", ["--num-threads", "-1"], "--num-threads must be in [1, 1024], got -1"),
    (b"hello world\n", ["--vocab-size", "1000"], "sentencepiece training failed: Vocabulary size too high (1000)"),
])
def test_train_cli_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, content, args, message):
    cli = runpy.run_path(str(REPO / "tools" / "train_tokenizer.py"))
    (tmp_path / "input.txt").write_bytes(content)
    out = tmp_path / "out"
    code = cli["main"](["--input", str(tmp_path / "input.txt"), "--output-dir", str(out), "--vocab-size", "20", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not out.exists()


# ------------------------------------------------------------------ load_tokenizer
def test_load_tokenizer_picks_type(tmp_path, spm_dir):
    bpe_dir = tmp_path / "en"
    bpe_dir.mkdir()
    write_tiny_bpe(bpe_dir)
    assert isinstance(load_tokenizer(bpe_dir), BPETokenizer)
    # A params/ subdirectory of a checkpoint looks in its parent too.
    (bpe_dir / "params").mkdir()
    assert isinstance(load_tokenizer(bpe_dir / "params"), BPETokenizer)

    wp_dir = tmp_path / "zh"
    wp_dir.mkdir()
    (wp_dir / "vocab.txt").write_text("[PAD]\t0\n[UNK]\t1\nab\t2\n", encoding="utf-8")
    wp = load_tokenizer(wp_dir)
    assert isinstance(wp, WordPieceTokenizer) and wp.do_lower_case
    assert load_tokenizer(wp_dir / "vocab.txt", do_lower_case=False).do_lower_case is False
    assert wp.encode("AB") == [2]

    assert isinstance(load_tokenizer(spm_dir), SentencePieceTokenizer)
    assert isinstance(load_tokenizer(spm_dir / "spm.model"), SentencePieceTokenizer)


def test_load_tokenizer_errors(tmp_path):
    empty = tmp_path / "ckpt"
    empty.mkdir()
    with pytest.raises(FileNotFoundError) as err:
        load_tokenizer(empty)
    assert str(empty) in str(err.value) and "vocab.txt" in str(err.value) and "encoder.json" in str(err.value)
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path / "missing")


def test_load_tokenizer_real_dirs():
    en = need_shared("assets", "ernie-doc", "base-en")
    zh = need_shared("assets", "ernie-doc", "base-zh")
    assert isinstance(load_tokenizer(en), BPETokenizer)
    assert isinstance(load_tokenizer(zh), WordPieceTokenizer)


# ------------------------------------------------- a folder's recorded type decides
def _one_line(call, *parts):
    with pytest.raises(TokenizerError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message and len(message) < 300, message
    for part in parts:
        assert part in message, (part, message)
    return message


def test_recorded_bpe_folder_without_encoder_json_is_refused(tmp_path):
    """A saved BPE folder loses encoder.json: one line naming the folder and the file, never
    WordPiece over the BPE vocab.txt (every word [UNK])."""
    tok = BPETokenizer.from_dir(write_tiny_bpe_dir(tmp_path / "src"))
    saved = tmp_path / "saved"
    tok.save_pretrained(saved)
    assert json.loads((saved / "tokenizer_config.json").read_text()) == {
        "tokenizer_class": "BPETokenizer", "model_max_length": 512}
    assert isinstance(load_tokenizer(saved), BPETokenizer)
    (saved / "encoder.json").unlink()
    _one_line(lambda: load_tokenizer(saved), str(saved), "records BPETokenizer", "encoder.json")
    # a recorded WordPiece folder needs its vocab.txt, even with BPE files beside it
    wp = tmp_path / "wp"
    write_tiny_bpe_dir(wp)
    (wp / "vocab.txt").unlink()
    (wp / "tokenizer_config.json").write_text('{"tokenizer_class": "WordPieceTokenizer"}')
    _one_line(lambda: load_tokenizer(wp), str(wp), "records WordPieceTokenizer", "vocab.txt")
    (wp / "tokenizer_config.json").write_text('{"tokenizer_class": "SentencePieceTokenizer"}')
    _one_line(lambda: load_tokenizer(wp), str(wp), "records SentencePieceTokenizer", "*.model")


@pytest.mark.parametrize("left", [("vocab.bpe", "vocab.txt"), ("encoder.json", "vocab.txt")])
def test_part_of_a_bpe_folder_without_a_record_is_refused(tmp_path, left):
    """No tokenizer_config.json (a folder written before the type was recorded): BPE files
    without the rest are an error naming the missing one, not a WordPiece tokenizer."""
    write_tiny_bpe_dir(tmp_path)
    missing = ({"encoder.json", "vocab.bpe"} - set(left)).pop()
    (tmp_path / missing).unlink()
    _one_line(lambda: load_tokenizer(tmp_path), str(tmp_path), f"but not {missing}")
    # a plain vocab.txt folder is still WordPiece, a full BPE folder still BPE
    (tmp_path / {"vocab.bpe": "encoder.json", "encoder.json": "vocab.bpe"}[missing]).unlink()
    assert isinstance(load_tokenizer(tmp_path), WordPieceTokenizer)


@pytest.mark.parametrize("name", ["encoder.json", "tokenizer_config.json"])
def test_deeply_nested_tokenizer_json_is_one_line(tmp_path, name):
    write_tiny_bpe_dir(tmp_path)
    (tmp_path / name).write_text("[" * 100_000 + "]" * 100_000)
    _one_line(lambda: load_tokenizer(tmp_path), str(tmp_path / name), "nested too deeply")


def write_tiny_bpe_dir(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    write_tiny_bpe(directory)
    return directory


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
    with pytest.raises(ValueError, match="leaves a gap"):  # what kinds.document.choose_tokenizer catches
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
