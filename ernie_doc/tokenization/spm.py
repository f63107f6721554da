"""SentencePiece tokenizer (training and loading) with ERNIE-style specials, for new corpora
and languages (not part of the official ERNIE-Doc setup).

Reserved ids of a model trained by ``train``: 0 [PAD] (control), 1 [UNK], 2 [CLS], 3 [SEP],
4 [MASK] ([CLS], [SEP] and [MASK] are user-defined pieces, so they are recognised inside raw
text). No BOS/EOS pieces are added."""

from __future__ import annotations

import os
from typing import Dict, List, Optional, Sequence, Tuple, Union

from ernie_doc.errors import ConfigError, TokenizerError
from ernie_doc.utils import file_kind

from .base import TokenizerCallMixin, as_ids, char_offsets_of_bytes
from .vocab import PathLike, SpecialTokensMixin, read_tokenizer_bytes

__all__ = ["SentencePieceTokenizer", "train", "SPECIAL_TOKENS"]

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def _sentencepiece():
    try:
        import sentencepiece
    except ImportError as exc:  # keep the package importable without it
        raise ImportError("SentencePiece support needs the 'sentencepiece' package") from exc
    return sentencepiece


def train(
    files: Union[PathLike, Sequence[PathLike]],
    model_prefix: PathLike,
    vocab_size: int,
    model_type: str = "unigram",
    character_coverage: float = 0.9995,
    normalization_rule_name: str = "nmt_nfkc",
    hard_vocab_limit: bool = True,
    byte_fallback: bool = False,
    input_sentence_size: int = 0,
    num_threads: int = 1,
    seed_sentencepiece_size: Optional[int] = None,
    extra_options: Optional[dict] = None,
) -> str:
    """Train a SentencePiece model on plain-text ``files`` → path of ``<model_prefix>.model``.
    ``input_sentence_size=0`` uses every line (deterministic)."""
    spm = _sentencepiece()
    files = _training_files(files)
    if model_type not in ("unigram", "bpe", "char", "word"):
        raise ConfigError(f"unknown model_type {model_type!r}")
    prefix = os.fspath(model_prefix)
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    options = dict(
        input=files,
        model_prefix=prefix,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        normalization_rule_name=normalization_rule_name,
        hard_vocab_limit=hard_vocab_limit,
        byte_fallback=byte_fallback,
        input_sentence_size=input_sentence_size,
        shuffle_input_sentence=False,
        num_threads=num_threads,
        pad_id=0,
        pad_piece="[PAD]",
        unk_id=1,
        unk_piece="[UNK]",
        bos_id=-1,
        eos_id=-1,
        # [p], [q], [/q]: the paragraph / question markers of the English QA layouts
        user_defined_symbols=["[CLS]", "[SEP]", "[MASK]", "[p]", "[q]", "[/q]"],
        minloglevel=2,
    )
    if seed_sentencepiece_size:
        options["seed_sentencepiece_size"] = seed_sentencepiece_size
    options.update(extra_options or {})
    spm.SentencePieceTrainer.train(**options)
    return prefix + ".model"


def _training_files(files: Union[PathLike, Sequence[PathLike]]) -> List[str]:
    """`files` (one path or several) as a list of str paths, each an existing regular file
    (sentencepiece would block on a FIFO); FileNotFoundError / TokenizerError name it."""
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    files = [os.fspath(f) for f in files]
    if not files:
        raise ConfigError("no training files given")

    for f in files:
        kind = file_kind(f)  # a regular file only: sentencepiece would block on a FIFO
        if kind == "missing":
            raise FileNotFoundError(f"training file not found: {f}")
        if kind is not None:
            raise TokenizerError(f"{f}: training file is {kind}, not a regular file")
    return files


class SentencePieceTokenizer(TokenizerCallMixin, SpecialTokensMixin):
    """Tokenizer over a trained ``.model`` file, same API as the others."""

    def __init__(
        self,
        model_file: PathLike,
        unk_token: str = "[UNK]",
        pad_token: str = "[PAD]",
        cls_token: str = "[CLS]",
        sep_token: str = "[SEP]",
        mask_token: str = "[MASK]",
    ):
        spm = _sentencepiece()
        self.model_file = os.fspath(model_file)
        # Read here (a regular file only), parsed from memory: sentencepiece's own errors are
        # multi-line C++ traces, and it would open a FIFO and block.
        data = read_tokenizer_bytes(self.model_file, "SentencePiece model")
        if not data:
            raise TokenizerError(f"{self.model_file}: SentencePiece model is empty")
        try:
            self.sp = spm.SentencePieceProcessor(model_proto=data)
        except (RuntimeError, OSError, ValueError) as e:
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
            if "ParseFromArray" in reason or "src/" in reason:
                reason = "not a serialized SentencePiece ModelProto"
            raise TokenizerError(f"{self.model_file}: not a usable SentencePiece model "
                                 f"({reason})") from None
        self.unk_token, self.pad_token, self.cls_token = unk_token, pad_token, cls_token
        self.sep_token, self.mask_token = sep_token, mask_token

    @classmethod
    def from_dir(cls, path: PathLike, **kwargs) -> "SentencePieceTokenizer":
        return cls(os.path.join(path, "spm.model"), **kwargs)

    def tokenize(self, text: str) -> List[str]:
        return self.sp.encode(text, out_type=str)

    def encode(self, text: str) -> List[int]:
        """Model ids of ``text`` (no [CLS]/[SEP] added)."""
        return self.sp.encode(text, out_type=int)

    def encode_with_offsets(self, text: str) -> Tuple[List[int], List[Tuple[int, int]]]:
        """encode(text) and each piece's (start, end) character offsets in `text`, from
        sentencepiece's byte alignment ("▁" covers no character)."""
        proto = self.sp.encode(text, return_type="proto")
        chars = char_offsets_of_bytes(text)
        ids, offsets = [], []
        for piece in proto.pieces:
            ids.append(piece.id)
            begin = chars[min(piece.begin, len(chars) - 1)]
            end = chars[piece.end - 1] + 1 if piece.end > piece.begin else begin
            if end == begin and self.sp.is_byte(piece.id) and begin < len(text):
                end = begin + 1   # one byte of a character spelled in bytes: that character
            while begin < end and text[begin].isspace():
                begin += 1        # the "▁" marker's space is not part of the token
            offsets.append((begin, max(begin, end)))
        return ids, offsets

    def _files(self) -> Dict[str, str]:
        return {"spm.model": self.model_file}

    def convert_tokens_to_ids(self, tokens: Sequence[str]) -> List[int]:
        # piece_to_id maps unknown pieces to the unk id itself.
        return [self.sp.piece_to_id(t) for t in tokens]

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> List[str]:
        size = self.sp.get_piece_size()
        return [self.sp.id_to_piece(i) if 0 <= i < size else self.unk_token for i in as_ids(ids)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """sentencepiece's own decoding ("▁" is the space before a word); `ids`: a list, a
        1-D array or tensor. skip_special_tokens drops [PAD] [CLS] [SEP] [MASK] [UNK]."""
        size = self.sp.get_piece_size()
        ids = [i if 0 <= i < size else self.sp.unk_id() for i in as_ids(ids)]
        if skip_special_tokens:
            drop = {self.pad_token_id, self.cls_token_id, self.sep_token_id, self.mask_token_id,
                    self.unk_token_id}
            ids = [i for i in ids if i not in drop]
        return self.sp.decode(ids)

    def _special_id(self, token: str) -> Optional[int]:
        idx = self.sp.piece_to_id(token)
        # piece_to_id answers the unk id for absent pieces.
        if idx == self.sp.unk_id() and token != self.sp.id_to_piece(idx):
            return None
        return idx

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

