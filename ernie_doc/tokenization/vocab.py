"""Vocabulary files in the format the official ERNIE-Doc reader accepts.

English ``vocab.txt`` has one token per line (id = line number), Chinese ``token<TAB>id``;
the official loader's one rule reads both. Unlike it, the ids must be dense (0..N-1, each
once): anything else is a `TokenizerError` naming the file and line, raised before anything is
sized by the ids. Details: docs/design-notes.md, "Tokenizers: vocabulary files"."""

from __future__ import annotations

import io
import os
from typing import Dict, List, Optional, Union

from ernie_doc.errors import TokenizerError
from ernie_doc.utils import decode_utf8, file_kind, open_regular, parse_json

PathLike = Union[str, "os.PathLike[str]"]


def read_tokenizer_bytes(path: PathLike, what: str = "tokenizer file") -> bytes:
    """The bytes of a regular file: FileNotFoundError if missing, a TokenizerError for anything
    else there (a FIFO would block), never opened."""
    path = os.fspath(path)
    if file_kind(path) == "missing":
        raise FileNotFoundError(f"{path}: {what} does not exist")
    with open_regular(path, what, TokenizerError) as f:
        try:
            return f.read()
        except OSError as e:
            raise TokenizerError(f"{path}: cannot read the {what} ({e.strerror})") from None


def read_tokenizer_text(path: PathLike, what: str = "tokenizer file") -> str:
    """`read_tokenizer_bytes` decoded as UTF-8 (invalid bytes: TokenizerError with the line)."""
    return decode_utf8(read_tokenizer_bytes(path, what), f"{os.fspath(path)}", TokenizerError)


def read_tokenizer_json(path: PathLike, what: str = "tokenizer file"):
    """`read_tokenizer_text` parsed as JSON; invalid or too deeply nested JSON is a
    TokenizerError naming the file (and the line)."""
    return parse_json(read_tokenizer_text(path, what), os.fspath(path), TokenizerError)


def load_vocab(path: PathLike) -> Dict[str, int]:
    """Read ``path`` with the official rule and return ``{token: id}``, ids 0..N-1 (module
    docstring; TokenizerError naming path:line otherwise)."""
    path = os.fspath(path)
    text = read_tokenizer_text(path, "vocabulary file")
    vocab: Dict[str, int] = {}
    id_line: Dict[int, int] = {}  # id -> line that gave it
    # Iterating a StringIO splits lines as iterating the text file did (universal newlines).
    for line_no, line in enumerate(io.StringIO(text, newline=None)):
        at = f"{path}:{line_no + 1}"
        fields = line.strip().split("\t")
        if len(fields) > 2:
            # The official reader treats such a line as the end of the vocab.
            break
        token = fields[0].strip()
        if len(fields) == 2:
            try:
                idx = int(fields[1])
            except ValueError:
                raise TokenizerError(f"{at}: id {fields[1][:40]!r} of token {token!r} is not an "
                                     f"integer") from None
            if idx < 0:
                raise TokenizerError(f"{at}: negative id {idx} of token {token!r}")
        else:
            idx = line_no
        if idx in id_line:
            raise TokenizerError(f"{at}: id {idx} of token {token!r} repeated (first at line "
                                 f"{id_line[idx]})")
        vocab[token], id_line[idx] = idx, line_no + 1   # a repeated token: its last id
    if not vocab:
        raise TokenizerError(f"{path}: vocabulary file has no tokens")
    n = len(id_line)
    beyond = [i for i in id_line if i >= n]
    if beyond:
        # n distinct ids >= 0 that are not 0..n-1: name the first line that leaves a gap.
        line = min(id_line[i] for i in beyond)
        idx = next(i for i in beyond if id_line[i] == line)
        raise TokenizerError(f"{path}:{line}: id {idx} leaves a gap: the {n} lines must have "
                             f"the ids 0..{n - 1}, each once")
    return vocab


def invert_vocab(vocab: Dict[str, int]) -> Dict[int, str]:
    """Return ``{id: token}``; for ids shared by several tokens the last one wins."""
    return {idx: tok for tok, idx in vocab.items()}


class Vocab:
    """A loaded vocabulary with both lookup directions and an [UNK] fallback. (`from_file`
    checks the ids are dense; a dict given directly is taken as it is.)"""

    def __init__(self, token_to_id: Dict[str, int], unk_token: Optional[str] = "[UNK]"):
        self.token_to_id = dict(token_to_id)
        self.id_to_token = invert_vocab(self.token_to_id)
        self.unk_token = unk_token
        self.unk_id = self.token_to_id.get(unk_token) if unk_token is not None else None

    @classmethod
    def from_file(cls, path: PathLike, unk_token: Optional[str] = "[UNK]",
                  require_unk: bool = False) -> "Vocab":
        """`load_vocab`; with require_unk, a vocabulary without `unk_token` is a
        TokenizerError (tokenizers that map every unknown piece to it need it)."""
        vocab = cls(load_vocab(path), unk_token=unk_token)
        if require_unk and unk_token is not None and vocab.unk_id is None:
            raise TokenizerError(f"{os.fspath(path)}: vocabulary file has no {unk_token} token "
                                 f"(every piece outside the vocabulary maps to it)")
        return vocab

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
        """Ids of one whitespace-free word of a longer text (keeping character offsets);
        `after_space`: it follows whitespace (matters to byte-level BPE only)."""
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
