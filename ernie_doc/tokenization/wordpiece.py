"""Chinese tokenizer of ERNIE-Doc: BERT basic tokenization + WordPiece.

Mirrors the official ``FullTokenizer``: clean control characters, space out CJK ideographs,
optionally lower-case and strip accents, split off punctuation, then greedy longest-match
WordPiece with "##" continuations. ``split_symbols=True`` also splits off Unicode symbols, as
PaddleNLP's BasicTokenizer does; the official reader does not. Details: docs/design-notes.md,
"Tokenizers: Chinese WordPiece"."""

from __future__ import annotations

import os
import re
import unicodedata
from typing import Dict, Iterator, List, Sequence, Tuple

from .base import TokenizerCallMixin, as_ids, whitespace_chunks
from .vocab import PathLike, SpecialTokensMixin, Vocab

__all__ = ["WordPieceTokenizer", "basic_tokenize", "is_cjk_char", "is_punctuation"]

# Extra characters PaddleNLP treats as symbols although they are not S*.
_PADDLENLP_EXTRA_SYMBOLS = frozenset(map(chr, (0x00AD, 0x00B2, 0x00BA, 0x3007, 0x00B5, 0x00D8,
                                               0x014B, 0x01B1)))
_CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)


# A space that basic_tokenize put next to a CJK character or CJK / full-width punctuation.
_CJK_CLASS = "".join(f"\\U{lo:08x}-\\U{hi:08x}" for lo, hi in _CJK_RANGES) + \
    "\u3000-\u303f\uff00-\uffef"
_CJK_SPACE = re.compile(f"(?<=[{_CJK_CLASS}]) | (?=[{_CJK_CLASS}])")
# Hugging Face's clean_up_tokenization: the spaces decode() would put before punctuation.
_CLEANUP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
            (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def is_cjk_char(ch: str) -> bool:
    cp = ord(ch)
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


def is_whitespace(ch: str) -> bool:
    return ch in " \t\n\r" or unicodedata.category(ch) == "Zs"


def is_control(ch: str) -> bool:
    # TAB/LF/CR are categorised Cc but count as whitespace.
    return ch not in "\t\n\r" and unicodedata.category(ch).startswith("C")


def is_punctuation(ch: str) -> bool:
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True  # all ASCII non-alphanumerics, e.g. "$", "^", "`"
    return unicodedata.category(ch).startswith("P")


def is_symbol(ch: str) -> bool:
    return unicodedata.category(ch).startswith("S") or ch in _PADDLENLP_EXTRA_SYMBOLS


def strip_accents(word: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFD", word) if unicodedata.category(c) != "Mn")


def basic_tokenize(text: str, do_lower_case: bool = True, split_symbols: bool = False) -> List[str]:
    """BERT BasicTokenizer (see module docstring)."""
    cleaned = []
    for ch in text:
        if ch == "\x00" or ch == "\ufffd" or is_control(ch):
            continue
        if is_whitespace(ch):
            cleaned.append(" ")
        elif is_cjk_char(ch):
            cleaned.append(" " + ch + " ")
        else:
            cleaned.append(ch)
    words: List[str] = []
    for word in "".join(cleaned).split():
        if do_lower_case:
            word = strip_accents(word.lower())
        current = []
        for ch in word:
            if is_punctuation(ch) or (split_symbols and is_symbol(ch)):
                if current:
                    words.append("".join(current))
                    current = []
                words.append(ch)
            else:
                current.append(ch)
        if current:
            words.append("".join(current))
    # Accent stripping can leave a word that str.split() would have removed.
    return [w for piece in words for w in piece.split()]


class WordPieceTokenizer(TokenizerCallMixin, SpecialTokensMixin):
    """ERNIE-Doc Chinese (BERT-style) tokenizer. vocab_file: vocab.txt; do_lower_case: also
    strip accents; split_symbols: split on Unicode symbols (PaddleNLP 2.x)."""

    def __init__(
        self,
        vocab_file: PathLike,
        do_lower_case: bool = True,
        split_symbols: bool = False,
        max_input_chars_per_word: int = 100,
        unk_token: str = "[UNK]",
        pad_token: str = "[PAD]",
        cls_token: str = "[CLS]",
        sep_token: str = "[SEP]",
        mask_token: str = "[MASK]",
    ):
        self.vocab = Vocab.from_file(vocab_file, unk_token=unk_token, require_unk=True)
        self.vocab_file = os.fspath(vocab_file)
        self.do_lower_case = do_lower_case
        self.split_symbols = split_symbols
        self.max_input_chars_per_word = max_input_chars_per_word
        self.unk_token, self.pad_token, self.cls_token = unk_token, pad_token, cls_token
        self.sep_token, self.mask_token = sep_token, mask_token

    @classmethod
    def from_dir(cls, path: PathLike, **kwargs) -> "WordPieceTokenizer":
        return cls(os.path.join(path, "vocab.txt"), **kwargs)

    def wordpiece(self, word: str) -> List[str]:
        """Greedy longest-match-first split of one basic token."""
        if len(word) > self.max_input_chars_per_word:
            return [self.unk_token]
        vocab = self.vocab.token_to_id
        pieces: List[str] = []
        start = 0
        while start < len(word):
            end = len(word)
            while end > start:
                candidate = word[start:end] if start == 0 else "##" + word[start:end]
                if candidate in vocab:
                    pieces.append(candidate)
                    break
                end -= 1
            else:
                return [self.unk_token]  # some suffix has no piece at all
            start = end
        return pieces

    def tokenize(self, text: str) -> List[str]:
        tokens: List[str] = []
        for word in basic_tokenize(text, self.do_lower_case, self.split_symbols):
            tokens.extend(self.wordpiece(word))
        return tokens

    def _words_with_offsets(self, text: str) -> List[Tuple[str, List[int]]]:
        """basic_tokenize's words, each with the index in `text` of each character (a word
        whose length changed maps all to its whole span)."""
        raw: List[List[int]] = []   # words as lists of indices into text, before normalising
        current: List[int] = []
        for i, ch in enumerate(text):
            if ch == "\x00" or ch == "\ufffd" or is_control(ch):
                continue
            if is_whitespace(ch) or is_cjk_char(ch):
                if current:
                    raw.append(current)
                current = []
                if is_cjk_char(ch):
                    raw.append([i])
            else:
                current.append(i)
        if current:
            raw.append(current)
        out: List[Tuple[str, List[int]]] = []
        for indices in raw:
            word = "".join(text[i] for i in indices)
            index = indices
            if self.do_lower_case:
                normal = strip_accents(word.lower())
                per_char = [strip_accents(text[i].lower()) for i in indices]
                if "".join(per_char) == normal:
                    index = [i for i, part in zip(indices, per_char) for _ in part]
                else:   # a context-dependent change (final sigma ...): the whole span
                    index = [indices[0]] * len(normal)
                    if index:
                        index[-1] = indices[-1]
                word = normal
            current_chars, current_index = [], []
            for ch, i in zip(word, index):
                if is_punctuation(ch) or (self.split_symbols and is_symbol(ch)) or ch.isspace():
                    if current_chars:
                        out.append(("".join(current_chars), current_index))
                    current_chars, current_index = [], []
                    if not ch.isspace():
                        out.append((ch, [i]))
                else:
                    current_chars.append(ch)
                    current_index.append(i)
            if current_chars:
                out.append(("".join(current_chars), current_index))
        return out

    def encode_with_offsets(self, text: str) -> Tuple[List[int], List[Tuple[int, int]]]:
        """encode(text) and each token's (start, end) character offsets in `text` (a "##"
        piece covers its own characters; [UNK] covers its whole word)."""
        tokens: List[str] = []
        offsets: List[Tuple[int, int]] = []
        for word, index in self._words_with_offsets(text):
            start = 0
            for piece in self.wordpiece(word):
                if piece == self.unk_token:
                    tokens.append(piece)
                    offsets.append((index[0], index[-1] + 1))
                    break
                length = len(piece) - (2 if piece.startswith("##") and start else 0)
                tokens.append(piece)
                offsets.append((index[start], index[start + length - 1] + 1))
                start += length
        return self.convert_tokens_to_ids(tokens), offsets

    def _files(self) -> Dict[str, str]:
        return {"vocab.txt": self.vocab_file}

    def _config(self) -> Dict:
        return {"do_lower_case": self.do_lower_case, "split_symbols": self.split_symbols}

    def encode(self, text: str) -> List[int]:
        """Model ids of ``text`` (no [CLS]/[SEP] added)."""
        return self.convert_tokens_to_ids(self.tokenize(text))

    def _id_chunks(self, text: str) -> Iterator[List[int]]:
        # words never cross whitespace: a text cut before one encodes piece by piece
        for piece in whitespace_chunks(text):
            yield self.encode(piece)

    def convert_tokens_to_ids(self, tokens: Sequence[str]) -> List[int]:
        return self.vocab.to_ids(list(tokens))

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> List[str]:
        """Tokens of `ids` (a list, a 1-D array or tensor, or one id)."""
        return self.vocab.to_tokens(as_ids(ids))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Best-effort text, as Hugging Face's BERT decode ("##" glued, no space before
        punctuation, contractions or around CJK). `ids`: a list, 1-D array or tensor."""
        specials = {self.pad_token, self.cls_token, self.sep_token, self.mask_token, self.unk_token}
        text = ""
        for tok in self.convert_ids_to_tokens(as_ids(ids)):
            if skip_special_tokens and tok in specials:
                continue
            if tok.startswith("##") and text:
                text += tok[2:]
            else:
                text += (" " if text else "") + tok
        text = _CJK_SPACE.sub("", text)
        for spaced, tight in _CLEANUP:
            text = text.replace(spaced, tight)
        return text

    @property
    def vocab_size(self) -> int:
        return self.vocab.size

