"""Tokenizers for ERNIE-Doc (no paddle dependency).

* ``BPETokenizer``: English, GPT-2 byte-level BPE with the official reader's
  per-sentence encoding and vocab.txt id mapping.
* ``WordPieceTokenizer``: Chinese, BERT basic tokenization + WordPiece.
* ``SentencePieceTokenizer``: trained with ``train_sentencepiece``.
* ``load_tokenizer`` / ``AutoTokenizer.from_pretrained``: choose one from the files in a
  directory (or a released name); ``<Class>.from_pretrained`` loads that class only.
* ``split_sentences``: NLTK Punkt when available, else a rule-based fallback."""

from .auto import AutoTokenizer, load_tokenizer
from .base import BatchEncoding
from .bpe import BPETokenizer
from .sentences import split_sentences
from .spm import SentencePieceTokenizer
from .spm import train as train_sentencepiece
from .vocab import Vocab, load_vocab
from .wordpiece import WordPieceTokenizer

__all__ = [
    "AutoTokenizer",
    "BatchEncoding",
    "BPETokenizer",
    "WordPieceTokenizer",
    "SentencePieceTokenizer",
    "load_tokenizer",
    "split_sentences",
    "train_sentencepiece",
    "load_vocab",
    "Vocab",
]
