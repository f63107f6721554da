"""English tokenizer of ERNIE-Doc: GPT-2 byte-level BPE, ids through vocab.txt.

Reproduces the official reader: each sentence encoded on its own (its first word without "Ġ"),
GPT-2 merges, each GPT-2 id looked up as a decimal string in ``vocab.txt``. Details:
docs/design-notes.md, "Tokenizers: English BPE"."""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import regex

from ernie_doc.errors import TokenizerError

from .base import ENCODE_CHUNK_CHARS, TokenizerCallMixin, as_ids, char_offsets_of_bytes
from .sentences import rule_split_sentences, split_sentences
from .vocab import PathLike, SpecialTokensMixin, Vocab, read_tokenizer_json, read_tokenizer_text

__all__ = ["BPETokenizer", "GPT2_PATTERN", "OFFICIAL_SPECIAL_TOKENS", "bytes_to_unicode"]

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# Words the official encoder passes through unsplit.
OFFICIAL_SPECIAL_TOKENS: Tuple[str, ...] = ("[SEP]", "[p]", "[q]", "[/q]")
DEFAULT_SPECIAL_TOKENS: Tuple[str, ...] = OFFICIAL_SPECIAL_TOKENS + ("[CLS]", "[MASK]", "[PAD]",
                                                                   "[UNK]")


@lru_cache(maxsize=1)
def bytes_to_unicode() -> Dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character table."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table = {b: chr(b) for b in printable}
    shift = 0
    for b in range(256):
        if b not in table:
            # Whitespace/control bytes get characters above U+00FF.
            table[b] = chr(256 + shift)
            shift += 1
    return table


def load_merges(path: PathLike) -> List[Tuple[str, str]]:
    """Read GPT-2 ``vocab.bpe`` (a "#version" line, then "a b" merges in rank order); no merge,
    or a line not two symbols, is a TokenizerError."""
    path = os.fspath(path)
    lines = read_tokenizer_text(path, "BPE merges file").split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the file
    if not lines:
        raise TokenizerError(f"{path}: BPE merges file is empty (no merges)")
    if not lines[0].startswith("#"):
        # The official reader drops the first line whatever it holds.
        raise TokenizerError(f"{path}:1: BPE merges file does not start with its '#version' "
                             f"header line")
    merges: List[Tuple[str, str]] = []
    for number, line in enumerate(lines[1:], 2):
        pair = tuple(line.split())
        if len(pair) != 2:
            raise TokenizerError(f"{path}:{number}: expected a merge of two symbols "
                                 f"'a b', got {line[:60]!r}")
        merges.append(pair)
    if not merges:
        raise TokenizerError(f"{path}: BPE merges file has no merges (only its header)")
    return merges


def load_encoder(path: PathLike) -> Dict[str, int]:
    """GPT-2 ``encoder.json``: a JSON object {byte-mapped piece: GPT-2 id}; anything else is a
    TokenizerError naming the file."""
    path = os.fspath(path)
    encoder = read_tokenizer_json(path, "BPE encoder file")
    if not isinstance(encoder, dict):
        raise TokenizerError(f"{path}: expected a JSON object {{piece: id}}, got "
                             f"{type(encoder).__name__}")
    if not encoder:
        raise TokenizerError(f"{path}: BPE encoder file has no pieces")
    for piece, idx in encoder.items():
        if isinstance(idx, bool) or not isinstance(idx, int) or idx < 0:
            raise TokenizerError(f"{path}: piece {piece!r} has the id {idx!r}, not an "
                                 f"integer >= 0")
    return encoder


def _is_gpt2_id(string: str) -> bool:
    return string.isascii() and string.isdigit()


# decode: a piece ending a sentence, and the first byte of a piece that may start the next one
# (an upper-case letter, a quote or bracket, the lead byte of a non-ASCII character)
_SENTENCE_END = regex.compile(rb"[.!?][\"')\]]*$")
_SENTENCE_START = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ\"'([`") | frozenset(range(0xC2, 0xF5))


def _keep_sentence_spaces(text: str, tentative: List[int]) -> str:
    """`text` without the spaces at `tentative` positions after which the rule-based
    splitter does not start a sentence."""
    if not tentative:
        return text
    starts, position = set(), 0
    for sentence in rule_split_sentences(text):
        found = text.find(sentence, position)
        if found >= 0:
            starts.add(found)
            position = found + len(sentence)
    drop = {i for i in tentative if i + 1 not in starts}
    return "".join(ch for i, ch in enumerate(text) if i not in drop)


class BPETokenizer(TokenizerCallMixin, SpecialTokensMixin):
    """ERNIE-Doc English tokenizer (official reader semantics): vocab.txt, GPT-2 encoder.json
    and vocab.bpe. special_tokens: words kept whole (OFFICIAL_SPECIAL_TOKENS: the official set).
    sentence_splitter: text -> sentences (default ``split_sentences``)."""

    def __init__(
        self,
        vocab_file: PathLike,
        encoder_json_file: PathLike,
        vocab_bpe_file: PathLike,
        special_tokens: Iterable[str] = DEFAULT_SPECIAL_TOKENS,
        sentence_splitter: Optional[Callable[[str], List[str]]] = None,
        unk_token: str = "[UNK]",
        pad_token: str = "[PAD]",
        cls_token: str = "[CLS]",
        sep_token: str = "[SEP]",
        mask_token: str = "[MASK]",
    ):
        self.vocab = Vocab.from_file(vocab_file, unk_token=unk_token, require_unk=True)
        self.files = {"vocab.txt": os.fspath(vocab_file),
                      "encoder.json": os.fspath(encoder_json_file),
                      "vocab.bpe": os.fspath(vocab_bpe_file)}
        self.encoder: Dict[str, int] = load_encoder(encoder_json_file)
        self.decoder = {idx: piece for piece, idx in self.encoder.items()}
        self.bpe_ranks = {pair: rank for rank, pair in enumerate(load_merges(vocab_bpe_file))}
        self.byte_encoder = bytes_to_unicode()
        self.byte_decoder = {ch: b for b, ch in self.byte_encoder.items()}
        self.pattern = regex.compile(GPT2_PATTERN)
        self.special_tokens = frozenset(special_tokens)
        self.sentence_splitter = sentence_splitter or split_sentences
        self.unk_token, self.pad_token, self.cls_token = unk_token, pad_token, cls_token
        self.sep_token, self.mask_token = sep_token, mask_token
        self.cache: Dict[str, Tuple[str, ...]] = {}

    @classmethod
    def from_dir(cls, path: PathLike, **kwargs) -> "BPETokenizer":
        """Load ``vocab.txt``, ``encoder.json`` and ``vocab.bpe`` from a directory."""
        return cls(
            os.path.join(path, "vocab.txt"),
            os.path.join(path, "encoder.json"),
            os.path.join(path, "vocab.bpe"),
            **kwargs,
        )

    # --- BPE core ----------------------------------------------------------------
    def bpe(self, piece: str) -> Tuple[str, ...]:
        """Apply the merges to one byte-mapped piece (memoised)."""
        cached = self.cache.get(piece)
        if cached is not None:
            return cached
        word = tuple(piece)
        ranks = self.bpe_ranks
        while len(word) > 1:
            pairs = set(zip(word, word[1:]))
            best = min(pairs, key=lambda p: ranks.get(p, float("inf")))
            if best not in ranks:
                break
            first, second = best
            merged: List[str] = []
            i = 0
            while i < len(word):
                if i < len(word) - 1 and word[i] == first and word[i + 1] == second:
                    merged.append(first + second)
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = tuple(merged)
        self.cache[piece] = word
        return word

    def pretokenize(self, sentence: str) -> List[str]:
        """Split one sentence into special-token words and GPT-2 regex pieces."""
        pieces: List[str] = []
        for i, word in enumerate(sentence.split(" ")):
            if word in self.special_tokens:
                pieces.append(word)
            else:
                pieces.extend(self.pattern.findall(word if i == 0 else " " + word))
        return pieces

    def _pieces(self, sentence: str) -> List[Tuple[str, bool]]:
        """(byte-mapped BPE piece, False) and (special word, True) of one sentence."""
        out: List[Tuple[str, bool]] = []
        for piece in self.pretokenize(sentence):
            if piece in self.special_tokens:
                out.append((piece, True))
                continue
            mapped = "".join(self.byte_encoder[b] for b in piece.encode("utf-8"))
            out.extend((sub, False) for sub in self.bpe(mapped))
        return out

    def _vocab_string(self, piece: str) -> str:
        # A piece the encoder lacks (never with GPT-2's, which covers all 256 bytes) has no
        # GPT-2 id: it becomes [UNK], like a GPT-2 id that vocab.txt lacks.
        return str(self.encoder[piece]) if piece in self.encoder else self.unk_token

    def encode_sentence_gpt2(self, sentence: str) -> List[str]:
        """vocab.txt strings of one sentence: GPT-2 ids (as decimal strings) and special words."""
        return [token if special else self._vocab_string(token)
                for token, special in self._pieces(sentence)]

    # --- public API ----------------------------------------------------------------
    def _sentences(self, text: str, sentence_split: bool) -> List[str]:
        text = " ".join(text.split())
        if not text:
            return []
        return self.sentence_splitter(text) if sentence_split else [text]

    def tokenize(self, text: str, sentence_split: bool = True) -> List[str]:
        """Tokens as Hugging Face shows byte-level BPE ("Ġworld") and special words;
        convert_tokens_to_ids(tokenize(text)) == encode(text)."""
        return [token for sentence in self._sentences(text, sentence_split)
                for token, _ in self._pieces(sentence)]

    def encode(self, text: str, sentence_split: bool = True) -> List[int]:
        """Model ids of ``text`` (no [CLS]/[SEP] added)."""
        return self.vocab.to_ids([token for sentence in self._sentences(text, sentence_split)
                                  for token in self.encode_sentence_gpt2(sentence)])

    def _id_chunks(self, text: str) -> Iterator[List[int]]:
        # encode() is its sentences' tokens one after the other: a group of sentences at a time
        group: List[str] = []
        size = 0
        for sentence in self._sentences(text, True):
            group.append(sentence)
            size += len(sentence)
            if size >= ENCODE_CHUNK_CHARS:
                yield self.vocab.to_ids([t for s in group for t in self.encode_sentence_gpt2(s)])
                group, size = [], 0
        yield self.vocab.to_ids([t for s in group for t in self.encode_sentence_gpt2(s)])

    def encode_with_offsets(self, text: str,
                            sentence_split: bool = True) -> Tuple[List[int], List[Tuple[int, int]]]:
        """encode(text) and each token's (start, end) character offsets in `text` (without
        GPT-2's leading "Ġ", as Hugging Face's trim_offsets)."""
        # " ".join(text.split()) with, for each of its characters, the index in `text`
        normal_chars, index = [], []
        i, n = 0, len(text)
        while i < n:
            if text[i].isspace():
                i += 1
                continue
            if normal_chars:
                normal_chars.append(" ")
                index.append(i - 1)
            while i < n and not text[i].isspace():
                normal_chars.append(text[i])
                index.append(i)
                i += 1
        normal = "".join(normal_chars)
        index.append(n)
        if not normal:
            return [], []
        tokens: List[str] = []
        offsets: List[Tuple[int, int]] = []
        position = 0
        for sentence in (self.sentence_splitter(normal) if sentence_split else [normal]):
            found = normal.find(sentence, position)
            if found < 0:   # the splitter changed the text: coarse offsets for this sentence
                pieces = self.encode_sentence_gpt2(sentence)
                tokens.extend(pieces)
                offsets.extend([(index[position], index[len(normal) - 1] + 1)] * len(pieces))
                continue
            for token, (a, b) in self._sentence_offsets(sentence):
                tokens.append(token)
                offsets.append((index[found + a], index[found + b - 1] + 1) if b > a
                               else (index[found + a], index[found + a]))
            position = found + len(sentence)
        return self.vocab.to_ids(tokens), offsets

    def _sentence_offsets(self, sentence: str) -> List[Tuple[str, Tuple[int, int]]]:
        """encode_sentence_gpt2's tokens with their character spans in `sentence`."""
        out: List[Tuple[str, Tuple[int, int]]] = []
        start = 0
        for i, word in enumerate(sentence.split(" ")):
            if i:
                start += 1
            end = start + len(word)
            if word in self.special_tokens:
                out.append((word, (start, end)))
                start = end
                continue
            lead = 0 if i == 0 else 1   # the space GPT-2 folds into the first piece
            for match in self.pattern.finditer(word if i == 0 else " " + word):
                piece = match.group()
                mapped_bytes = piece.encode("utf-8")
                chars = char_offsets_of_bytes(piece)
                mapped = "".join(self.byte_encoder[b] for b in mapped_bytes)
                byte = 0
                for sub in self.bpe(mapped):
                    first, last = chars[byte], chars[byte + len(sub) - 1]
                    byte += len(sub)
                    a = start + match.start() + first - lead
                    b = start + match.start() + last + 1 - lead
                    token = self._vocab_string(sub)
                    out.append((token, (max(a, start), max(b, start))))
            start = end
        return out

    def _files(self) -> Dict[str, str]:
        return dict(self.files)

    def encode_word(self, word: str, after_space: bool = True) -> List[int]:
        # a word after whitespace carries GPT-2's leading-space marker, as it would inside
        # a sentence; a special token ([q], [SEP] ...) stays whole
        if word in self.special_tokens:
            return self.vocab.to_ids([word])
        return self.vocab.to_ids(self.encode_sentence_gpt2((" " if after_space else "") + word))

    def convert_tokens_to_ids(self, tokens: Sequence[str]) -> List[int]:
        """Ids of tokens as `tokenize` gives them: special words and byte-mapped pieces
        ("Ġworld"); anything else is [UNK]."""
        strings = []
        for token in tokens:
            if token in self.special_tokens or (token in self.vocab and not _is_gpt2_id(token)):
                strings.append(token)
            else:
                strings.append(self._vocab_string(token))
        return self.vocab.to_ids(strings)

    def _piece_of(self, string: str) -> Optional[str]:
        """The byte-mapped piece of a vocab.txt string, None for a special word."""
        return self.decoder.get(int(string)) if _is_gpt2_id(string) else None

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> List[str]:
        """Readable tokens: byte-mapped pieces ("Ġworld") and special words."""
        strings = self.vocab.to_tokens(as_ids(ids))
        return [piece if piece is not None else string
                for string, piece in zip(strings, map(self._piece_of, strings))]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Best-effort text for ``ids`` (UTF-8 bytes, special words spaced); the space between
        sentences is put back where the rule-based splitter starts one ("end.Next")."""
        text = ""
        tentative: List[int] = []   # where a space was put back between two sentences
        run: List[str] = []         # byte-mapped pieces not yet decoded

        def flush() -> str:
            raw = bytes(self.byte_decoder[ch] for ch in "".join(run))
            run.clear()
            return raw.decode("utf-8", errors="replace")

        after_special = False
        for string in self.vocab.to_tokens(as_ids(ids)):
            piece = self._piece_of(string)
            if piece is None:   # a special word
                text += flush()
                if not skip_special_tokens:
                    text += (" " if text else "") + string
                after_special = True
                continue
            first = self.byte_decoder[piece[0]]
            if after_special and text and first != ord(" "):
                text += " "   # the text after a special word (a pair's second text ...)
            elif run and first in _SENTENCE_START and \
                    _SENTENCE_END.search(bytes(self.byte_decoder[c] for c in "".join(run[-2:]))):
                text += flush()
                tentative.append(len(text))
                text += " "
            after_special = False
            run.append(piece)
        text += flush()
        return _keep_sentence_spaces(text, tentative)

    # --- vocabulary facts ---------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

