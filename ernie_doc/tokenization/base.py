"""The calling convention PaddleNLP and Hugging Face users know, shared by every tokenizer
(usage: docs/tokenizers.md).

Layout `[CLS] A [SEP] B [SEP]`, token types 0 / 1. The tokenizer of a fine-tuned classifier
(its tokenizer_config.json records `segment_layout`) lays every text out as the segment the
model was fine-tuned on instead: model_max_length tokens, `[CLS] A [SEP] [PAD] …`
(`cls_first`) or `A [SEP] [PAD] … [CLS]` (`cls_last`, the official layout). A tokenizer class
supplies `encode(text)`, `encode_with_offsets(text)` and `_files()`. Details:
docs/design-notes.md, "Tokenizers: calling"."""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from ernie_doc.errors import ConfigError, TokenizerError

Offsets = List[Tuple[int, int]]
# max_position_embeddings of every released ERNIE-Doc model: the segment one forward takes
DEFAULT_MODEL_MAX_LENGTH = 512
MAX_MODEL_MAX_LENGTH = 1 << 20   # far above any segment a model takes in one forward
# Hugging Face call options these tokenizers do not implement: named in the TypeError.
_HF_ONLY = {"is_split_into_words", "return_length", "stride", "pad_to_multiple_of",
            "return_special_tokens_mask", "return_overflowing_tokens", "verbose",
            "padding_side", "split_special_tokens"}
TRUNCATIONS = ("longest_first", "only_first", "only_second")
PADDINGS = ("longest", "max_length")
# The segments a fine-tuned classifier's tokenizer lays out (model_max_length tokens each):
# [CLS] first, or last (the official classification layout).
SEGMENT_LAYOUTS = ("cls_first", "cls_last")
CONFIG_FILE = "tokenizer_config.json"
logger = logging.getLogger("ernie_doc.tokenization")
# load_tokenizer, registered here by auto.py when imported (no import cycle)
_loader: Optional[Callable[..., Any]] = None


class BatchEncoding(dict):
    """The dict a tokenizer call returns; keys are also attributes (enc.input_ids)."""

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None


def _truncate(a: list, b: Optional[list], budget: int, strategy: str) -> Tuple[int, int]:
    """Lengths to keep of a (and b) so that they fit `budget` tokens: longest_first takes one
    token at a time from the longer (from the second on a tie, as PaddleNLP and HF do)."""
    la, lb = len(a), len(b) if b is not None else 0
    if la + lb <= budget:
        return la, lb
    if strategy == "only_second" and b is not None or strategy == "only_first":
        other = la if strategy == "only_second" else lb
        if other > budget:   # cannot fit by cutting that one alone: as PaddleNLP and HF, keep
            logger.warning("truncation=%r cannot bring %d tokens to max_length: the %s text "
                           "alone has %d; the input is kept whole (use 'longest_first')",
                           strategy, la + lb, "first" if strategy == "only_second" else
                           "second", other)
            return la, lb
        return (la, budget - la) if strategy == "only_second" else (budget - lb, lb)
    if b is None:
        return budget, 0
    while la + lb > budget:
        if la > lb:
            la -= 1
        else:
            lb -= 1
    return la, lb


class TokenizerCallMixin:
    """`__call__` and `save_pretrained` for BPETokenizer, WordPieceTokenizer and
    SentencePieceTokenizer (which provide encode / encode_with_offsets / _files)."""

    def encode_with_offsets(self, text: str) -> Tuple[List[int], Offsets]:  # pragma: no cover
        raise NotImplementedError

    def _files(self) -> Dict[str, str]:  # pragma: no cover
        raise NotImplementedError

    def _config(self) -> Dict:
        """Constructor options that change ids, for tokenizer_config.json."""
        return {}

    # -- loading, limits ------------------------------------------------------------------------
    # None: nothing recorded it (see model_max_length)
    _model_max_length: Optional[int] = None
    # the segment a call lays out (SEGMENT_LAYOUTS) and the most tokens of a document it
    # reads (the run's max_doc_tokens, 0: all), as a fine-tuned classifier's folder records;
    # None: a plain `[CLS] A [SEP]` call
    _segment_layout: Optional[str] = None
    max_doc_tokens: int = 0
    # how far apart the run's segments of a document start (its stride; 0: not recorded):
    # segment_batches cuts a document so with this tokenizer
    segment_stride: int = 0

    @property
    def segment_layout(self) -> Optional[str]:
        """None: a call gives `[CLS] A [SEP] (B [SEP])`; else every row is one segment of
        model_max_length tokens, as fine-tuning built it: "cls_first" `[CLS] A [SEP] [PAD] …`
        or "cls_last" `A [SEP] [PAD] … [CLS]`."""
        return self._segment_layout

    @segment_layout.setter
    def segment_layout(self, value: Optional[str]) -> None:
        if value is not None and value not in SEGMENT_LAYOUTS:
            raise TokenizerError(f"segment_layout must be None or one of "
                                 f"{', '.join(SEGMENT_LAYOUTS)}, got {value!r}")
        self._segment_layout = value

    @property
    def model_max_length(self) -> int:
        """The longest input (special tokens included) one forward of the model takes: what
        the folder recorded (module docstring), else DEFAULT_MODEL_MAX_LENGTH."""
        return self._model_max_length or DEFAULT_MODEL_MAX_LENGTH

    @model_max_length.setter
    def model_max_length(self, value: int) -> None:
        self._model_max_length = check_model_max_length(value, "model_max_length")

    @classmethod
    def from_pretrained(cls, path, *, do_lower_case: Optional[bool] = None,
                        model_max_length: Optional[int] = None):
        """Load the tokenizer of `path` (anything load_tokenizer reads); a folder holding another
        class is a TokenizerError (AutoTokenizer.from_pretrained takes whichever it holds)."""
        tokenizer = _loader(path, do_lower_case=do_lower_case,
                            model_max_length=model_max_length)
        if not isinstance(tokenizer, cls):
            raise TokenizerError(f"{os.fspath(path)}: holds a {type(tokenizer).__name__}, not a "
                                 f"{cls.__name__} (AutoTokenizer.from_pretrained loads "
                                 f"whichever it holds)")
        return tokenizer

    # -- decoding -----------------------------------------------------------------------------
    def decode(self, ids, skip_special_tokens: bool = False) -> str:  # pragma: no cover
        raise NotImplementedError

    # -- a long document ----------------------------------------------------------------------
    def encode_array(self, text: str) -> np.ndarray:
        """encode(text) as int64 [n], built a piece of the text at a time: a million-token
        document's ids as one list of Python ints take some 36 bytes each, as an array 8."""
        parts = [np.asarray(ids, dtype=np.int64) for ids in self._id_chunks(text)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def _id_chunks(self, text: str) -> Iterator[List[int]]:
        """The ids of `text` in consecutive chunks that join into encode(text) exactly: whole
        here (SentencePiece: its segmentation of a word can depend on the text around it, in
        near ties of the scores, so no cut is exact)."""
        yield self.encode(text)

    def batch_decode(self, sequences, skip_special_tokens: bool = False) -> List[str]:
        """decode() of every row of `sequences` (lists of ids, a [B, T] numpy array or paddle
        tensor, a call's input_ids)."""
        if hasattr(sequences, "numpy"):
            sequences = sequences.numpy()
        return [self.decode(row, skip_special_tokens=skip_special_tokens) for row in sequences]

    # -- one example ------------------------------------------------------------------------
    def _one(self, text: str, pair: Optional[str], add_special_tokens: bool,
             max_length: Optional[int], truncation, offsets: bool) -> Dict[str, list]:
        for value, name in ((text, "text"), (pair, "text_pair")):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{name}: expected a str (or a list of str), got "
                                f"{type(value).__name__}")
        if offsets:
            a, oa = self.encode_with_offsets(text)
            b, ob = self.encode_with_offsets(pair) if pair is not None else (None, None)
        else:
            a, oa = self.encode(text), None
            b, ob = (self.encode(pair), None) if pair is not None else (None, None)
        if add_special_tokens and self.segment_layout and self.max_doc_tokens:
            # the document as the run read it: its first max_doc_tokens tokens
            a, oa = a[:self.max_doc_tokens], oa[:self.max_doc_tokens] if oa else oa
        specials = (3 if b is not None else 2) if add_special_tokens else 0
        if truncation and max_length is not None:
            keep_a, keep_b = _truncate(a, b, max(0, max_length - specials), truncation)
            a, oa = a[:keep_a], oa[:keep_a] if oa is not None else None
            if b is not None:
                b, ob = b[:keep_b], ob[:keep_b] if ob is not None else None
        cls, sep = [self.cls_token_id], [self.sep_token_id]
        last = add_special_tokens and self.segment_layout == "cls_last"
        first = cls if add_special_tokens and not last else []
        if add_special_tokens:   # [CLS] takes type 0 wherever it sits
            ids = first + a + sep + (b + sep if b is not None else []) + (cls if last else [])
            types = [0] * (len(a) + 2) + ([1] * (len(b) + 1) if b is not None else [])
            if last and b is not None:
                types = [0] * (len(a) + 1) + [1] * (len(b) + 1) + [0]
        else:
            ids = a + (b if b is not None else [])
            types = [0] * len(a) + ([1] * len(b) if b is not None else [])
        out = {"input_ids": ids, "token_type_ids": types}
        if offsets:
            edge = [(0, 0)] if add_special_tokens else []
            out["offset_mapping"] = (edge if first else []) + oa + edge + \
                ((ob + edge) if ob is not None else []) + (edge if last else [])
        return out

    def __call__(self, text: Union[str, Sequence[str]],
                 text_pair: Union[str, Sequence[str], None] = None, *,
                 max_length: Optional[int] = None, truncation: Union[bool, str] = False,
                 padding: Union[bool, str] = False, add_special_tokens: bool = True,
                 return_offsets_mapping: bool = False,
                 return_attention_mask: Optional[bool] = None,
                 return_token_type_ids: bool = True,
                 return_tensors: Optional[str] = None, **unsupported: Any) -> BatchEncoding:
        """Encode one text (or pair), or a batch, as Hugging Face's tokenizers do (truncation,
        padding, return_tensors None / "np" / "pd": int64 [B, T]; [1, T] for one str)."""
        self._check_call(text, max_length, unsupported)
        batched = not isinstance(text, str)
        texts = list(text) if batched else [text]
        pairs = self._pairs_of(texts, text_pair, batched)
        segments = add_special_tokens and self.segment_layout is not None
        if segments and max_length not in (None, self.model_max_length):
            raise TokenizerError(f"max_length={max_length}: this tokenizer lays a text out as "
                                 f"the segment its model was fine-tuned on, "
                                 f"{self.model_max_length} tokens; another length is another "
                                 f"reading (leave max_length out)")
        if max_length is None and (truncation not in (False, None) or padding == "max_length"
                                   or segments):
            max_length = self.model_max_length
        if truncation is True:
            truncation = "longest_first"
        if truncation not in (False, None) and truncation not in TRUNCATIONS:
            raise ConfigError(f"truncation={truncation!r}: choose True, False or one of "
                              f"{', '.join(TRUNCATIONS)}")
        if padding is True:
            padding = "longest"
        if padding not in (False, None) and padding not in PADDINGS:
            raise ConfigError(f"padding={padding!r}: choose True, False, 'longest' or "
                              f"'max_length'")
        if return_tensors not in (None, "np", "pd"):
            raise ConfigError(f"return_tensors={return_tensors!r}: choose None, 'np' or 'pd'")
        rows = [self._one(t, p, add_special_tokens, max_length, truncation or False,
                          return_offsets_mapping) for t, p in zip(texts, pairs)]
        mask = return_attention_mask is not False
        for row in rows:
            if mask:
                row["attention_mask"] = [1] * len(row["input_ids"])
            if not return_token_type_ids:
                del row["token_type_ids"]
        if segments:
            self._lay_out_segments(rows, max_length)
        if padding:
            self._pad(rows, max_length if padding == "max_length" else
                      max(len(r["input_ids"]) for r in rows))
        return self._encoding(rows, batched, return_tensors)

    def _check_call(self, text: Any, max_length: Optional[int],
                    unsupported: Dict[str, Any]) -> None:
        """Refuse, before any encoding, an option this tokenizer does not have, a text that is
        neither a str nor a list of them, and a max_length out of range."""
        if unsupported:
            name = sorted(unsupported)[0]
            known = "a Hugging Face option" if name in _HF_ONLY else "an option"
            raise TypeError(f"{type(self).__name__}(): {name}= is {known} this tokenizer does "
                            f"not support; it takes max_length, truncation, padding, "
                            f"add_special_tokens, return_offsets_mapping, "
                            f"return_attention_mask, return_token_type_ids, return_tensors")
        if text is None or isinstance(text, (bytes, bytearray)) or \
                not hasattr(text, "__iter__"):
            raise TypeError(f"text: expected a str or a list of str, got {type(text).__name__}"
                            + (" (decode bytes first: text.decode('utf-8'))"
                               if isinstance(text, (bytes, bytearray)) else ""))
        if max_length is not None and (isinstance(max_length, bool)
                                       or not isinstance(max_length, int)
                                       or not 1 <= max_length <= MAX_MODEL_MAX_LENGTH):
            raise TokenizerError(f"max_length must be an integer from 1 to "
                                 f"{MAX_MODEL_MAX_LENGTH}, got {max_length!r}")

    @staticmethod
    def _pairs_of(texts: List[str], text_pair: Union[str, Sequence[str], None],
                  batched: bool) -> List[Optional[str]]:
        """The second text of each example (None without pairs): one str for one text, a list
        as long as the batch for a batch."""
        if text_pair is None:
            return [None] * len(texts)
        if batched and isinstance(text_pair, str):
            raise TypeError(f"text is a batch of {len(texts)} texts and text_pair one str: pass "
                            f"one pair per text, a list of {len(texts)} str (as Hugging Face and "
                            f"PaddleNLP)")
        if not batched and not isinstance(text_pair, str):
            raise TypeError(f"text is one str and text_pair a {type(text_pair).__name__}: pass a "
                            f"str, or a list of texts with a list of pairs")
        pairs = list(text_pair) if batched else [text_pair]
        if len(pairs) != len(texts):
            raise ConfigError(f"text_pair must match text: {len(texts)} text(s), "
                              f"{len(pairs)} pair(s)")
        return pairs

    def _pad(self, rows: List[Dict[str, list]], width: int, before_last: bool = False) -> None:
        """Pad every row's lists to `width` in place: [PAD], token type 0, attention 0, offset
        (0, 0); at the end, or `before_last` (the [CLS] of a cls_last segment stays last)."""
        fill = {"input_ids": self.pad_token_id, "token_type_ids": 0, "attention_mask": 0,
                "offset_mapping": (0, 0)}
        for row in rows:
            short = max(0, width - len(row["input_ids"]))
            for key in row:
                cut = len(row[key]) - 1 if before_last else len(row[key])
                row[key] = row[key][:cut] + [fill[key]] * short + row[key][cut:]

    def _lay_out_segments(self, rows: List[Dict[str, list]], width: int) -> None:
        """Every row becomes one segment of `width` tokens as fine-tuning laid it out (padding
        before a last [CLS]); a row that does not fit is a TokenizerError."""
        for row in rows:
            n = len(row["input_ids"])
            if n > width:
                raise TokenizerError(
                    f"a text of {n} tokens with [CLS] and [SEP] does not fit one segment of "
                    f"{width} (this tokenizer lays a text out as the segment its model was "
                    f"fine-tuned on): pass truncation=True to keep what fits, or read the whole "
                    f"document with ernie_doc.pipeline(<model folder>) or "
                    f"ernie_doc.segment_batches")
        self._pad(rows, width, before_last=self.segment_layout == "cls_last")

    def _encoding(self, rows: List[Dict[str, list]], batched: bool,
                  return_tensors: Optional[str]) -> BatchEncoding:
        """The rows as __call__ returns them: lists per key (per example for a batch, flat for
        one str), or [B, T] arrays / tensors when return_tensors is given."""
        keys = list(rows[0]) if rows else ["input_ids"]
        out = BatchEncoding({k: [r[k] for r in rows] for k in keys})
        if return_tensors is not None:
            lengths = {len(r["input_ids"]) for r in rows}
            if len(lengths) > 1:
                raise ConfigError(f"return_tensors={return_tensors!r}: the texts have "
                                  f"{len(lengths)} different lengths; pass padding=True")
            # one str keeps its batch axis of 1 here: tensors go to a model, which takes [B, T]
            return BatchEncoding({k: self._tensor(v, return_tensors) for k, v in out.items()})
        if not batched:
            out = BatchEncoding({k: v[0] for k, v in out.items()})
        return out

    @staticmethod
    def _tensor(values, kind):
        array = np.asarray(values, dtype=np.int64)
        if kind == "pd":
            import paddle
            return paddle.to_tensor(array)
        return array

    # -- saving -------------------------------------------------------------------------------
    def saved_config(self) -> Dict:
        """What tokenizer_config.json records: the class (it decides how the folder loads),
        the options that change ids, and model_max_length when the tokenizer has its own."""
        config = dict(self._config(), tokenizer_class=type(self).__name__)
        if self._model_max_length is not None:
            config["model_max_length"] = self._model_max_length
        if self.segment_layout is not None:
            config["segment_layout"] = self.segment_layout
            if self.max_doc_tokens:
                config["max_doc_tokens"] = self.max_doc_tokens
            if self.segment_stride:
                config["segment_stride"] = self.segment_stride
        return config

    def save_pretrained(self, directory) -> List[str]:
        """Write the tokenizer's files (byte copies) and tokenizer_config.json into `directory`,
        all or none, others kept → the written paths."""
        directory = os.fspath(directory)
        os.makedirs(directory, exist_ok=True)
        files = dict(self._files())
        config = dict(self.saved_config(), model_max_length=self.model_max_length)
        stage = tempfile.mkdtemp(prefix=".tmp-tokenizer-", dir=directory)
        try:
            for name, source in files.items():
                shutil.copyfile(source, os.path.join(stage, name))
            with open(os.path.join(stage, CONFIG_FILE), "w", encoding="utf-8") as f:
                json.dump(config, f, indent=2, sort_keys=True)
                f.write("\n")
            names = [*files, CONFIG_FILE]
            for name in names:
                os.replace(os.path.join(stage, name), os.path.join(directory, name))
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        return [os.path.join(directory, name) for name in names]


ENCODE_CHUNK_CHARS = 1 << 16   # what a long text is encoded a piece of at a time


def whitespace_chunks(text: str, size: int = ENCODE_CHUNK_CHARS) -> Iterator[str]:
    """`text` cut into consecutive pieces of about `size` characters, each cut just before a
    whitespace character (a text without one is one piece); the pieces join into `text`."""
    start = 0
    while len(text) - start > size:
        cut = next((i for i in range(start + size, len(text)) if text[i].isspace()), None)
        if cut is None:
            break
        yield text[start:cut]
        start = cut
    yield text[start:]


def check_model_max_length(value: Any, where: str) -> int:
    """`value` as a model_max_length: an int in [1, MAX_MODEL_MAX_LENGTH] (not a bool), else a
    TokenizerError naming `where`."""
    if isinstance(value, bool) or not isinstance(value, int) or \
            not 1 <= value <= MAX_MODEL_MAX_LENGTH:
        raise TokenizerError(f"{where}: model_max_length must be an integer from 1 to "
                             f"{MAX_MODEL_MAX_LENGTH}, got {value!r}")
    return value


def as_ids(ids: Any) -> List[int]:
    """One sequence of ids as ints (a list, 1-D array or tensor, one id, or a [1, T] row);
    several rows are a TypeError pointing at batch_decode."""
    if hasattr(ids, "numpy"):
        ids = ids.numpy()
    shape = getattr(ids, "shape", None)
    if shape is not None and len(shape) > 1:
        if len(shape) == 2 and shape[0] == 1:
            ids = ids[0]
        else:
            raise TypeError(f"expected one sequence of ids, got shape {list(shape)}: use "
                            f"batch_decode for a batch")
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if isinstance(ids, int):
        return [ids]
    return [int(i) for i in ids]


def char_offsets_of_bytes(text: str) -> List[int]:
    """For every byte of text.encode("utf-8") (and one past the end), the index of the
    character it belongs to."""
    table: List[int] = []
    for i, ch in enumerate(text):
        table.extend([i] * len(ch.encode("utf-8")))
    table.append(len(text))
    return table
