"""Keyphrase extraction as n-gram classification (`kind: keyphrase`),
the JointKPE / ETC setting the ERNIE-Doc paper follows on OpenKP.

Reading: the document's words are tokenized one by one, the token sequence is cut into
windows of T−2 tokens laid out `[CLS] tokens [SEP] PAD…` (advancing by the stride) and read
with memory, twice with the retrospective feed. A window's words are those whose first
sub-token lies in it; their token positions (target word_index) reach the head's forward
through model_inputs, and it scores every n-gram (n = 1..5) that starts at one of them.

Which n-grams count: an n-gram belongs to the window that gives its first word's first
sub-token the largest context (max_context_flags, so each is scored once) and counts there
only when all its n words start inside that window. It is positive when its word span is one
of the gold keyphrase_positions.

Loss: binary cross-entropy over the counted n-grams of the training rows (their mean).
Ranking: a phrase (its lower-cased words) scores the max logit over its occurrences
(JointKPE's chunk ranking); the top_k distinct phrases are the prediction, scored by the
official OpenKP F1@1/3/5 (ernie_doc.metrics.keyphrase).

task_options: top_k (phrases predicted per document, default 5); empty_phrases "keep" (the
only value, as the official evaluate.py: a gold or predicted phrase that normalises to "",
such as the word list [" "], keeps its place; the key stays because configs and saved
task.json name it).
"""
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import paddle.nn.functional as F

from ernie_doc.data.segment import Segment, pack_row, step_members, windows
from ernie_doc.data.span import max_context_flags
from ernie_doc.errors import ConfigError, DataError
from ernie_doc.kinds import register_kind
from ernie_doc.kinds.base import (DocumentTask, masked_mean, text_problem, with_gold,
                                  without_training)
from ernie_doc.metrics.keyphrase import DEPTHS
from ernie_doc.metrics.keyphrase import evaluate as keyphrase_metrics

from .head import MAX_GRAM, ErnieDocForKeyphrase
from .reader import URL


@dataclass
class WordTokens:
    """A document tokenized word by word: ids [N] int64, word_starts [W] int64 (the first
    sub-token of each word; increasing)."""
    ids: np.ndarray
    word_starts: np.ndarray

    def __len__(self):
        return len(self.ids)

    def truncate(self, limit):
        """The first `limit` tokens and the words that start among them."""
        return WordTokens(self.ids[:limit], self.word_starts[self.word_starts < limit])


def tokenize_words(words, tokenizer, unk_id=None, cache=None):
    """Words → WordTokens. A word the tokenizer turns into nothing (e.g. only characters it
    strips) becomes [UNK], so every word keeps a first sub-token. `cache`: a dict shared
    across documents (web pages repeat words)."""
    cache = {} if cache is None else cache
    ids, starts = [], []
    for word in words:
        pieces = cache.get(word)
        if pieces is None:
            pieces = list(tokenizer.encode_word(word, after_space=True))
            if not pieces:
                if unk_id is None:
                    raise DataError(f"word {word!r} has no tokens and the tokenizer has no "
                                    "[UNK] token")
                pieces = [unk_id]
            cache[word] = pieces
        starts.append(len(ids))
        ids.extend(pieces)
    return WordTokens(np.asarray(ids, dtype=np.int64), np.asarray(starts, dtype=np.int64))


class KeyphraseSegmenter:
    """(WordTokens, gold word spans) → [Segment] laid out `[CLS] window [SEP] PAD…`.

    Targets (fixed shapes; a window holds at most T−2 words):
      word_index [T] int32   token position of the window's i-th word (0 = [CLS] on padding)
      gold       [T, 5] bool the n-gram of n words starting at the i-th word is a keyphrase
      counted    [T, 5] bool that n-gram trains and is predicted in this window
    meta: {"first_word": index in the document of the window's first word,
           "num_words": words starting in the window}."""

    def __init__(self, seq_len, stride, cls_id, sep_id, pad_id):
        if seq_len < MAX_GRAM:
            raise ValueError(f"max_seq_len {seq_len} is shorter than the longest n-gram "
                             f"({MAX_GRAM} words)")
        self.seq_len, self.stride = seq_len, stride
        self.cls_id, self.sep_id, self.pad_id = cls_id, sep_id, pad_id

    def __call__(self, tokens, gold_spans, doc_index):
        T = self.seq_len
        spans = windows(len(tokens.ids), T - 2, self.stride)
        flags = max_context_flags(spans)
        # (first word, length) of each gold phrase the head can score
        gold = {(s, e - s + 1) for s, e in gold_spans if e - s + 1 <= MAX_GRAM}
        segments = []
        for k, ((a, b), max_ctx) in enumerate(zip(spans, flags)):
            ids, mask = pack_row([tokens.ids[a:b]], T, self.cls_id, self.sep_id, self.pad_id)
            w0, w1 = np.searchsorted(tokens.word_starts, [a, b])
            first_tokens = tokens.word_starts[w0:w1] - a           # in the window, 0-based
            n_words = w1 - w0
            word_index = np.zeros(T, dtype=np.int32)
            word_index[:n_words] = first_tokens + 1                # after [CLS]
            owned = max_ctx[first_tokens]                          # [n_words]
            counted = np.zeros((T, MAX_GRAM), dtype=bool)
            for n in range(1, min(MAX_GRAM, n_words) + 1):
                counted[:n_words - n + 1, n - 1] = owned[:n_words - n + 1]
            is_gold = np.zeros((T, MAX_GRAM), dtype=bool)
            for s, n in gold:
                if w0 <= s and s + n <= w1:
                    is_gold[s - w0, n - 1] = True
            segments.append(Segment(
                ids, mask, doc_index, k, len(spans),
                targets={"word_index": word_index, "gold": is_gold, "counted": counted},
                meta={"first_word": int(w0), "num_words": int(n_words)}))
        return segments


def rank_phrases(words, windows_scores, top_k=5):
    """The top_k distinct phrases of a document, best first.

    words: the document's words; windows_scores: [(first_word, counted [T, 5] bool,
    logits [T, 5])] of its predicted windows. A phrase is its lower-cased word tuple; its
    score the max logit over its counted occurrences (ties: the earlier window, word,
    shorter n-gram first). → [(words of the first occurrence, score)]"""
    starts, lengths, scores = [], [], []
    for first_word, counted, logits in windows_scores:
        i, n = np.nonzero(counted)
        starts.append(first_word + i)
        lengths.append(n + 1)
        scores.append(np.asarray(logits, dtype=np.float64)[i, n])
    if not scores:
        return []
    starts, lengths, scores = (np.concatenate(x) for x in (starts, lengths, scores))
    seen, ranked = set(), []
    # descending scores: a phrase is met first at its best occurrence, so stop at top_k
    for j in np.argsort(-scores, kind="stable"):
        phrase = words[starts[j]:starts[j] + lengths[j]]
        key = tuple(w.lower() for w in phrase)
        if key in seen:
            continue
        seen.add(key)
        ranked.append((phrase, float(scores[j])))
        if len(ranked) == top_k:
            break
    return ranked


@register_kind("keyphrase")   # the task folders' register_kinds() imports this module
class KeyphraseTask(DocumentTask):
    head_class = ErnieDocForKeyphrase
    main_metric = "f1@3"
    metric_names = tuple(f"{m}@{k}" for m in ("f1", "p", "r") for k in DEPTHS)
    # top_k: phrases predicted per document (F1@5 needs 5); empty_phrases: see the docstring
    option_defaults = {"top_k": 5, "empty_phrases": "keep"}
    # The text, whitespace-separated words; a document read by the reader also has `words`
    # (the text's words without URLs, which the text then equals joined), which are read
    # instead when present. See _words.
    input_fields = ("text",)
    pipeline_tasks = ("token-classification",)

    def __init__(self, cfg, reader):
        super().__init__(cfg, reader)
        self.check_options(("top_k",), {"empty_phrases": ("keep",)})
        self._word_cache = {}

    def setup(self, special_ids, max_seq_len, stride, tokenizer=None):
        if tokenizer is None:
            raise ConfigError(f"task {self.cfg.task}: keyphrase extraction needs a tokenizer")
        try:
            self.segmenter = KeyphraseSegmenter(max_seq_len, stride, special_ids["cls"],
                                                special_ids["sep"], special_ids["pad"])
        except ValueError as e:
            raise ConfigError(f"{self.cfg.source}: {e}") from None
        self.unk_id = tokenizer.unk_token_id

    def model_config_overrides(self):
        return {"cls_token_idx": 0}

    def document_segments(self, doc, doc_index, tokenizer):
        try:
            tokens = tokenize_words(self._words(doc), tokenizer, self.unk_id,
                                    self._word_cache)
        except DataError as e:
            raise DataError(f"document {doc.doc_id!r}: {e}") from None
        tokens = self.cap(tokens, doc)
        # the reader always gives keyphrase_positions (maybe []); a document to predict has
        # none: no n-gram is gold, and its rows do not train
        segments = self.segmenter(tokens, doc.fields.get("keyphrase_positions") or [],
                                  doc_index)
        return segments if "keyphrase_positions" in doc.fields else without_training(segments)

    def _words(self, doc) -> List[str]:
        """The words the model reads and phrases are made of: the reader's `words`, or for a
        document to predict given as text, the text's words cleaned as the reader cleans
        them (reader option remove_urls), so it is read as in training."""
        words = doc.fields.get("words")
        if words is not None:
            return words
        words = doc.text.split()
        if dict(self.cfg.reader).get("remove_urls", True):
            words = [w for w in words if not URL.match(w)]
        return words

    def check_input(self, doc) -> Optional[str]:
        words = doc.fields.get("words")
        if words is not None:
            if not isinstance(words, list) or not words or \
                    not all(isinstance(w, str) and w.strip() for w in words):
                return "words must be a non-empty list of non-empty strings"
            return None
        problem = super().check_input(doc)
        if problem is None and not self._words(doc):
            return "no words left once URLs are removed (reader option remove_urls)"
        return problem

    def input_problem(self, name: str, value: Any) -> Optional[str]:
        return text_problem(name, value)   # text only: token ids carry no words to rank

    def model_inputs(self, batch):
        return {"word_index": batch["target_word_index"]}

    def loss(self, out, batch, weight):
        counted = batch["target_counted"].astype("float32") * weight.reshape([-1, 1, 1])
        bce = F.binary_cross_entropy_with_logits(out.logits,
                                                 batch["target_gold"].astype("float32"),
                                                 reduction="none")
        return masked_mean(bce, counted)

    def row_outputs(self, out, batch=None):
        return out.logits.numpy()

    def predict_document(self, doc, rows: List[Tuple[int, Any]],
                         steps: Sequence) -> Dict[str, Any]:
        """→ {doc_id, pred: the top_k distinct phrases (words joined by a space, as first met),
        best first; scores: their max logit over occurrences (4 decimals), segments}."""
        final = {m.seg_index: m for step in steps for m in step_members(step) if m.final}
        # `counted` is a layout target (which n-grams a window scores), not gold
        windows_scores = [(final[s].meta["first_word"], final[s].targets["counted"], lg)
                          for s, lg in sorted(rows, key=lambda x: x[0])]
        ranked = rank_phrases(self._words(doc), windows_scores, self.options["top_k"])
        return {"doc_id": doc.doc_id, "pred": [" ".join(p) for p, _ in ranked],
                "scores": [round(x, 4) for _, x in ranked], "segments": len(rows)}

    def evaluate(self, docs, rows, passes):
        predictions = self.predict(docs, rows, passes)
        preds = {p["doc_id"]: p["pred"] for p in predictions}
        gold = [d.fields.get("keyphrases") or [] for d in docs]
        # documents without gold phrases (the unlabelled eval file) are not scored
        refs = {d.doc_id: g for d, g in zip(docs, gold) if g}
        result = keyphrase_metrics(preds, refs) if refs else {}
        metrics = {f"{m}@{k}": float(result.get(f"{m}@{k}", 0.0))
                   for m in ("f1", "p", "r") for k in DEPTHS}
        return metrics, [with_gold(p, references=[" ".join(x) for x in g])
                         for p, g in zip(predictions, gold)]
