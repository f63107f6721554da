"""Vocabulary files in the format the official ERNIE-Doc reader accepts.

Two layouts exist: English ``vocab.txt`` has one token per line (id = line
number), Chinese ``vocab.txt`` has ``token<TAB>id``. The official loader
reads both with one rule, reproduced here: strip the line, split on TAB;
a line with more than two fields ends the vocabulary (everything after it is
ignored); the token is field 0 (stripped) and the id is field 1 when present,
otherwise the 0-based line number. A repeated token keeps its last id.
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional, Union

PathLike = Union[str, "os.PathLike[str]"]


def load_vocab(path: PathLike) -> Dict[str, int]:
    """Read ``path`` with the official rule and return ``{token: id}``."""
    vocab: Dict[str, int] = {}
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f):
            fields = line.strip().split("\t")
            if len(fields) > 2:
                # The official reader treats such a line as the end of the vocab.
                break
            token = fields[0].strip()
            vocab[token] = int(fields[1]) if len(fields) == 2 else line_no
    return vocab


def invert_vocab(vocab: Dict[str, int]) -> Dict[int, str]:
    """Return ``{id: token}``; for ids shared by several tokens the last one wins."""
    return {idx: tok for tok, idx in vocab.items()}


class Vocab:
    """A loaded vocabulary with both lookup directions and an [UNK] fallback."""

    def __init__(self, token_to_id: Dict[str, int], unk_token: Optional[str] = "[UNK]"):
        self.token_to_id = dict(token_to_id)
        self.id_to_token = invert_vocab(self.token_to_id)
        self.unk_token = unk_token
        self.unk_id = self.token_to_id.get(unk_token) if unk_token is not None else None

    @classmethod
    def from_file(cls, path: PathLike, unk_token: Optional[str] = "[UNK]") -> "Vocab":
        return cls(load_vocab(path), unk_token=unk_token)

    def __len__(self) -> int:
        return len(self.token_to_id)

    def __contains__(self, token: str) -> bool:
        return token in self.token_to_id

    @property
    def size(self) -> int:
        """Number of embedding rows the ids need (max id + 1; ids may have gaps)."""
        return max(self.id_to_token) + 1 if self.id_to_token else 0

    def get_id(self, token: str) -> Optional[int]:
        """Id of ``token`` or None (no [UNK] fallback)."""
        return self.token_to_id.get(token)

    def to_ids(self, tokens: List[str]) -> List[int]:
        unk = self.unk_id
        out = []
        for tok in tokens:
            idx = self.token_to_id.get(tok, unk)
            if idx is None:
                raise KeyError(f"token {tok!r} not in vocab and no unk token is defined")
            out.append(idx)
        return out

    def to_tokens(self, ids: List[int]) -> List[str]:
        out = []
        for idx in ids:
            tok = self.id_to_token.get(int(idx), self.unk_token)
            if tok is None:
                raise KeyError(f"id {idx} not in vocab and no unk token is defined")
            out.append(tok)
        return out


class SpecialTokensMixin:
    """The special-token ids and len() shared by every tokenizer; subclasses provide
    ``vocab_size`` and ``_special_id(token) -> id or None``."""

    def _special_id(self, token: str) -> Optional[int]:
        return self.vocab.get_id(token)

    def token_id(self, token: str) -> Optional[int]:
        """Id of a token kept whole ([q], [p] ...), or None when the vocabulary lacks it."""
        return self._special_id(token)

    def encode_word(self, word: str, after_space: bool = True) -> List[int]:
        """Ids of one whitespace-free word of a longer text (span tasks tokenize a context
        word by word to keep each token's character offsets). `after_space`: the word
        follows whitespace in the text (matters to byte-level BPE only)."""
        return self.encode(word)

    def __len__(self) -> int:
        return self.vocab_size

    @property
    def pad_token_id(self) -> Optional[int]:
        return self._special_id(self.pad_token)

    @property
    def cls_token_id(self) -> Optional[int]:
        return self._special_id(self.cls_token)

    @property
    def sep_token_id(self) -> Optional[int]:
        return self._special_id(self.sep_token)

    @property
    def unk_token_id(self) -> Optional[int]:
        return self._special_id(self.unk_token)

    @property
    def mask_token_id(self) -> Optional[int]:
        return self._special_id(self.mask_token)
