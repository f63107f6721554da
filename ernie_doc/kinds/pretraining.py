"""The pretraining task (paper §3.4): MLM on every segment + segment reordering at a
document's last segment, behind the same Task interface the fine-tuning trainer drives.

    text ─tokenize─▶ ids ─reorder_document─▶ k chunks shuffled, label ∈ [0, K)
         ─mask_tokens─▶ 15 % masked (80/10/10) ─segmenter─▶ windows of T−2 tokens
         ─reading_passes─▶ skim + retrospective pass when retro_feed

All draws come from (seed, epoch, document id), so a resume rebuilds exactly the same rows.
Targets per segment: `mlm_labels` [T] (the original id at masked positions, −1 elsewhere)
and `reorder_label` (the document's label; its loss is taken on the last segment only)."""
import dataclasses
import math
import zlib
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import paddle
import paddle.nn.functional as F

from ernie_doc import distributed as dist
from ernie_doc.data.document import Document
from ernie_doc.data.segment import CLS_INDEX, ClassificationSegmenter, reading_passes
from ernie_doc.data.splits import Split
from ernie_doc.errors import ConfigError, DataError
from ernie_doc.heads import NUM_REORDER_CLASSES, ErnieDocForPretraining
from ernie_doc.kinds.base import Config, DocumentTask
from ernie_doc.kinds.folders import missing_key
from ernie_doc.pretraining import corpus
from ernie_doc.pretraining.objectives import (mask_tokens, num_reorder_classes, reorder_document,
                                              tokenizer_special_ids, wordpiece_word_starts)
from ernie_doc.pretraining.stream import StreamSplit

# options of the corpus (config `reader`) and of the objectives (config `task_options`)
READER_DEFAULTS = {
    "format": "blank_lines",      # plain text: blank_lines | wikitext (JSON lines: by suffix)
    "text_field": "text",         # JSON lines: the field holding the text
    "min_chars": 1,               # shorter documents are skipped (counted)
    "eval_corpus": None,          # path(s) of held-out documents: the "dev" split
    "eval_docs": 200,             # read at most this many of them (held in memory)
    "shuffle_buffer": 1000,       # documents shuffled within a buffer of this many (0 = off)
    "data_shards": 0,             # independent document streams (0 = one per rank)
    "check_corpus": True,         # read the whole corpus once before training (bad files fail
                                  # on every rank at once, never mid-run on one)
    "tokenizer_sample_docs": 20000,   # tokenizer=train: train SentencePiece on these
}
OBJECTIVE_DEFAULTS = {
    "mask_prob": 0.15,
    "whole_word_mask": False,     # all pieces of a word masked together (WordPiece, SPM)
    "max_chunks": 4,              # m: a document is cut into 1..m chunks
    "reorder_classes": NUM_REORDER_CLASSES,   # K of the head (33: the official checkpoints)
    "min_doc_tokens": 0,          # shorter documents are skipped (0 = max_chunks)
    "mlm_weight": 1.0,
    "reorder_weight": 1.0,
}


def _seed(*parts):
    return [int(p) & 0x7FFFFFFF for p in parts]


class PretrainingTask(DocumentTask):
    head_class = ErnieDocForPretraining
    main_metric = "mlm_accuracy"
    metric_names = ("mlm_accuracy", "mlm_loss", "mlm_perplexity", "reorder_accuracy",
                    "masked_tokens", "documents")
    option_defaults = OBJECTIVE_DEFAULTS
    streaming = True   # the trainer streams the train split (pretraining.stream)
    task_reader = False   # its corpus is data_dir, read by pretraining.stream
    refused = {"eval_only": "not for pretraining (its held-out MLM metrics come with training "
                            "runs: reader.eval_corpus)"}

    def __init__(self, cfg: Config, reader: Any = None):
        super().__init__(cfg, None)
        unknown = set(cfg.reader) - set(READER_DEFAULTS)
        if unknown:
            raise ConfigError(f"{cfg.source}: reader: unknown option {sorted(unknown)[0]!r} "
                              f"(known: {sorted(READER_DEFAULTS)})")
        self.corpus_options = dict(READER_DEFAULTS, **cfg.reader)
        o = self.options
        self.check_options(positive=("max_chunks", "reorder_classes"))
        if not 0 < o["mask_prob"] <= 1:
            raise self.option_error("mask_prob", f"must be in (0, 1], got {o['mask_prob']!r}")
        if num_reorder_classes(o["max_chunks"]) > o["reorder_classes"]:
            raise self.option_error(
                "max_chunks", f"{o['max_chunks']} chunks need "
                f"{num_reorder_classes(o['max_chunks'])} reorder classes but the head has "
                f"{o['reorder_classes']} (task_options.reorder_classes)")
        self.min_doc_tokens = o["min_doc_tokens"] or o["max_chunks"]
        c = self.corpus_options
        if c["format"] not in corpus.SPLITS:
            raise ConfigError(f"{cfg.source}: reader.format: {c['format']!r} is not one of "
                              f"{list(corpus.SPLITS)}")
        for key in ("eval_docs", "tokenizer_sample_docs"):
            if not isinstance(c[key], int) or c[key] < 1:
                raise ConfigError(f"{cfg.source}: reader.{key}: must be a positive integer")
        for key in ("shuffle_buffer", "data_shards", "min_chars"):
            if not isinstance(c[key], int) or c[key] < 0:
                raise ConfigError(f"{cfg.source}: reader.{key}: must be a non-negative "
                                  f"integer")
        if not cfg.data_dir:
            raise missing_key(cfg.source, cfg.task, "data_dir", "the pretraining corpus "
                              "(files or directories, or a list of them)")
        # evaluation: the held-out corpus, as split "dev" (none without one); the run reads
        # its config from here (task.cfg)
        self.cfg = cfg = dataclasses.replace(cfg, eval_splits=["dev"] if c["eval_corpus"]
                                             else [])
        if cfg.test_splits:
            raise ConfigError(f"{cfg.source}: test_splits: pretraining has none (its held-out "
                              f"documents are reader.eval_corpus)")

    # -- corpus -------------------------------------------------------------------------------
    def corpus_args(self) -> Dict[str, Any]:
        c = self.corpus_options
        return dict(text_field=c["text_field"], min_chars=c["min_chars"], split=c["format"])

    def num_shards(self, world: int) -> int:
        shards = self.corpus_options["data_shards"] or world
        if shards % world:
            raise ConfigError(f"{self.cfg.source}: reader.data_shards {shards} must be a "
                              f"multiple of the number of ranks ({world})")
        if (self.cfg.batch_size * world) % shards:
            raise ConfigError(f"{self.cfg.source}: reader.data_shards {shards} must divide "
                              f"the {self.cfg.batch_size * world} rows of a global batch")
        return shards

    def check_data(self, world: int) -> int:
        """Before any collective call, on every rank alike: bad corpus files and empty
        corpora raise here, on every rank at once."""
        shards = self.num_shards(world)
        if self.corpus_options["check_corpus"]:
            n = corpus.check_corpus(self.cfg.data_dir, shards, **self.corpus_args())
        else:
            n = len(list(zip(range(shards), corpus.iter_documents(
                self.cfg.data_dir, skips=corpus.Skips("corpus", "documents"),
                **self.corpus_args()))))
            if n < shards:
                raise DataError(f"{self.cfg.data_dir}: {n} documents for {shards} streams")
        if self.corpus_options["eval_corpus"]:
            corpus.check_corpus(self.corpus_options["eval_corpus"], 1, **self.corpus_args())
        return n

    def read(self, split: str) -> list:
        """Held-out documents for evaluation (the `dev` split = reader.eval_corpus)."""
        paths = self.corpus_options["eval_corpus"]
        if split != "dev" or not paths:
            raise DataError(f"pretraining: no split {split!r} (evaluation reads "
                            f"reader.eval_corpus as 'dev')")
        limit = (self.cfg.max_examples or {}).get(split) or self.corpus_options["eval_docs"]
        docs = []
        for doc in corpus.iter_documents(paths, **self.corpus_args()):
            docs.append(doc)
            if len(docs) == limit:
                break
        return docs

    def train_stream(self, rank: int, world: int, rows: int, seq_len: int, pad_id: int,
                     seed: int) -> Optional[Split]:
        """The streamed train split (pretraining.stream)."""
        return StreamSplit(self, rank, world, rows, seq_len, pad_id, seed)

    def tokenizer_sample(self) -> Optional[list]:
        """The first documents of the corpus (tokenizer=train trains on them)."""
        limit = self.corpus_options["tokenizer_sample_docs"]
        return [d for _, d in zip(range(limit), corpus.iter_documents(self.cfg.data_dir,
                                                                     **self.corpus_args()))]

    # -- documents → segments -----------------------------------------------------------------
    def setup(self, special_ids: Dict[str, int], max_seq_len: int, stride: int,
              tokenizer: Any = None) -> None:
        if tokenizer is None or tokenizer.mask_token_id is None:
            raise ConfigError(f"{self.cfg.source}: tokenizer: pretraining needs a tokenizer "
                              f"with a [MASK] token")
        self.tokenizer = tokenizer
        self.mask_id = tokenizer.mask_token_id
        self.special = tokenizer_special_ids(tokenizer)
        self.vocab_size = len(tokenizer)
        self.seq_len = max_seq_len
        # windows do not overlap unless asked: the memory already holds the previous tokens
        window = max_seq_len - 2
        self.segmenter = ClassificationSegmenter(
            max_seq_len, self.cfg.stride or window, special_ids["cls"], special_ids["sep"],
            special_ids["pad"], self.cfg.segment_layout)
        if self.options["whole_word_mask"]:
            self._word_starts(np.asarray([self.mask_id]))   # fails early when unsupported

    def _word_starts(self, ids):
        tokens = self.tokenizer.convert_ids_to_tokens([int(i) for i in ids])
        kind = type(self.tokenizer).__name__
        if "SentencePiece" in kind:
            return np.asarray([t.startswith("\u2581") for t in tokens], dtype=bool)
        if "WordPiece" in kind:
            return wordpiece_word_starts(tokens)
        raise ConfigError(f"{self.cfg.source}: task_options.whole_word_mask: needs a WordPiece "
                          f"or SentencePiece tokenizer, got {kind}")

    def document_steps(self, doc: corpus.CorpusDocument, epoch: int, doc_index: int
                       ) -> Optional[Sequence]:
        """One corpus document → its reading passes (steps), or None when it is too short
        to train on (the caller counts the skip)."""
        segments = self._segments(doc, epoch, doc_index)
        if segments is None:
            return None
        return reading_passes(segments, self.cfg.retro_feed, self.cfg.train_skim)

    def _segments(self, doc, epoch, doc_index):
        ids = self.cap(np.asarray(self.tokenizer.encode(doc.text), dtype=np.int64), doc)
        if len(ids) < self.min_doc_tokens:
            return None
        o = self.options
        rng = np.random.default_rng(_seed(self.cfg.seed, epoch,
                                          zlib.crc32(doc.doc_id.encode("utf-8"))))
        permuted, label, _ = reorder_document(ids, rng, o["max_chunks"], o["reorder_classes"])
        starts = self._word_starts(permuted) if o["whole_word_mask"] else None
        masked, positions, labels = mask_tokens(permuted, rng, self.vocab_size, self.mask_id,
                                                self.special, o["mask_prob"], starts)
        mlm = np.full(len(permuted), -1, dtype=np.int64)
        mlm[positions] = labels
        return self.segmenter(masked, doc_index, targets={"reorder_label": label},
                              aligned={"mlm_labels": mlm})

    def document_segments(self, doc: Any, doc_index: int, tokenizer: Any) -> list:
        """Held-out documents (corpus.CorpusDocument): one pass, with the masks and shuffle of
        epoch 0 (fixed)."""
        segments = self._segments(doc, 0, doc_index)
        if segments is None:
            raise DataError(f"{doc.path}:{doc.line}: held-out document shorter than "
                            f"{self.min_doc_tokens} tokens")
        return segments

    def tokenizer_texts(self, doc: Any) -> List[str]:   # a corpus.CorpusDocument
        return [doc.text]

    # -- model ---------------------------------------------------------------------------------
    def head_flops(self, config: Any, head_params: int, tokens: int) -> Tuple[float, str]:
        share, hidden = self.options["mask_prob"], config.hidden_size
        return share * 2 * hidden * (hidden + config.vocab_size) * tokens, (
            f"masked LM on {share:.0%} of the tokens: transform and the tied decoder over "
            f"{config.vocab_size:,} words")

    def model_kwargs(self) -> Dict[str, Any]:
        return {"num_reorder_classes": self.options["reorder_classes"]}

    def model_config_overrides(self) -> Dict[str, Any]:
        return {"cls_token_idx": CLS_INDEX[self.cfg.segment_layout]}

    def model_inputs(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        """The flat positions [N] the MLM head reads: while gradients are recorded (training),
        the masked tokens of the rows that train only (a skim pass's rows have no loss, so
        their logits would only add zeros), else every masked token."""
        labels = batch["target_mlm_labels"]   # [B, T]
        if paddle.is_grad_enabled():
            rows: Any = self.train_weight(batch)   # on the batch's tensors: a tensor
            labels = paddle.where(rows.unsqueeze(-1), labels, paddle.full_like(labels, -1))
        positions = paddle.nonzero(labels.reshape([-1]) >= 0).reshape([-1])
        if positions.shape[0] == 0:   # no masked token in this batch: one dummy, weight 0
            positions = paddle.zeros([1], dtype="int64")
        return {"masked_positions": positions}

    def _terms(self, out, batch, weight):
        """→ per-masked-token (nll, correct, weight) and per-row (nll, correct, weight) of
        the reorder objective (rows at their document's last segment)."""
        labels = batch["target_mlm_labels"].reshape([-1])
        positions = self.model_inputs(batch)["masked_positions"]   # those the forward read
        targets = paddle.gather(labels, positions)
        rows = positions // self.seq_len
        w_mlm = paddle.gather(weight, rows) * (targets >= 0).astype("float32")
        logits = out.mlm_logits.astype("float32")
        nll = F.cross_entropy(logits, targets.clip(min=0).unsqueeze(-1), reduction="none")
        mlm = (nll.reshape([-1]), (logits.argmax(-1) == targets).astype("float32"), w_mlm)
        reorder_labels = batch["target_reorder_label"].reshape([-1])
        w_reorder = weight * batch["is_last"].astype("float32")
        r_logits = out.reorder_logits.astype("float32")
        r_nll = F.cross_entropy(r_logits, reorder_labels.unsqueeze(-1), reduction="none")
        reorder = (r_nll.reshape([-1]),
                   (r_logits.argmax(-1) == reorder_labels).astype("float32"), w_reorder)
        return mlm, reorder

    def _loss(self, terms, denominators):
        o = self.options
        total = 0.0
        for (nll, _, w), coef, n in zip(terms, (o["mlm_weight"], o["reorder_weight"]),
                                        denominators):
            total = total + coef * (nll * w).sum() / n
        return total

    def loss(self, out: Any, batch: Dict[str, Any], weight: paddle.Tensor) -> paddle.Tensor:
        """Mean MLM loss over masked tokens + mean reorder loss over last segments (the
        official total), over this batch."""
        terms = self._terms(out, batch, weight)
        return self._loss(terms, [max(float(w.sum()), 1.0) for _, _, w in terms])

    def train_loss(self, out: Any, batch: Dict[str, Any], weight: paddle.Tensor
                   ) -> Tuple[paddle.Tensor, Dict[str, Tuple[float, float]]]:
        """Means over the masked tokens (last segments) of ALL ranks, so the averaged gradient
        equals one process's on all rows. Scalars: MLM / reorder loss and accuracy."""
        terms = self._terms(out, batch, weight)
        counts = [float(w.sum()) for _, _, w in terms]
        least = 1.0 / dist.world_size()
        loss = self._loss(terms, [max(n, least) for n in dist.mean_over_ranks(counts)])
        metrics = {}
        for name, (nll, correct, w), n in zip(("mlm", "reorder"), terms, counts):
            metrics[f"{name}_loss"] = (float((nll * w).sum()), n)
            metrics[f"{name}_accuracy"] = (float((correct * w).sum()), n)
        return loss, metrics

    def combine_metrics(self, means: Dict[str, float]) -> Dict[str, float]:
        o = self.options
        if "mlm_loss" in means:
            means["loss"] = (o["mlm_weight"] * means["mlm_loss"]
                             + o["reorder_weight"] * means.get("reorder_loss", 0.0))
        return means

    # -- evaluation ----------------------------------------------------------------------------
    def row_outputs(self, out: Any, batch: Optional[Dict[str, Any]] = None) -> Any:
        """Per row: MLM (nll sum, correct, count) and the reorder (prediction, label)."""
        assert batch is not None   # read from the batch: evaluation always gives it
        mlm, reorder = self._terms(out, batch, paddle.ones([batch["input_ids"].shape[0]]))
        nll, correct, w = (t.numpy() for t in mlm)
        rows = (self.model_inputs(batch)["masked_positions"] // self.seq_len).numpy()
        B = batch["input_ids"].shape[0]
        sums = [np.bincount(rows, weights=v * w, minlength=B) for v in (nll, correct)]
        counts = np.bincount(rows, weights=w, minlength=B)
        pred = out.reorder_logits.argmax(-1).numpy()
        labels = batch["target_reorder_label"].numpy().reshape([-1])
        last = batch["is_last"].numpy()
        return [{"nll": float(sums[0][r]), "correct": float(sums[1][r]),
                 "count": float(counts[r]), "last": bool(last[r]),
                 "reorder_pred": int(pred[r]), "reorder_label": int(labels[r])}
                for r in range(B)]

    def predict(self, docs: Sequence[Document], rows: Mapping[int, List[Tuple[int, Any]]],
                passes: Optional[Sequence[Sequence]]) -> List[Dict[str, Any]]:
        """Pretraining scores how well masked tokens and the chunk order are recovered, from
        masks and a shuffle it draws itself: there is no per-document prediction to make."""
        raise NotImplementedError("pretraining has no per-document prediction (its evaluation "
                                  "scores the masked tokens and chunk order it hides itself); "
                                  "predict with a fine-tuned model")

    def evaluate(self, docs: Sequence[Document], rows: Mapping[int, List[Tuple[int, Any]]],
                 passes: Any = None) -> Tuple[Dict[str, float], List[Dict[str, Any]]]:
        nll = correct = count = 0.0
        r_right = r_total = 0
        predictions = []
        for d, items in sorted(rows.items()):
            doc_right = doc_count = 0.0
            reorder = None
            for _, o in items:
                nll, correct, count = nll + o["nll"], correct + o["correct"], count + o["count"]
                doc_right, doc_count = doc_right + o["correct"], doc_count + o["count"]
                if o["last"]:
                    reorder = o
            if reorder is not None:
                r_total += 1
                r_right += reorder["reorder_pred"] == reorder["reorder_label"]
            predictions.append({
                "doc_id": docs[d].doc_id,
                "mlm_accuracy": doc_right / doc_count if doc_count else None,
                "reorder_pred": reorder and reorder["reorder_pred"],
                "reorder_label": reorder and reorder["reorder_label"]})
        mean_nll = nll / count if count else float("nan")
        metrics = {"mlm_accuracy": correct / count if count else float("nan"),
                   "mlm_loss": mean_nll,
                   "mlm_perplexity": math.exp(min(mean_nll, 50.0)),
                   "reorder_accuracy": r_right / r_total if r_total else float("nan"),
                   "masked_tokens": count, "documents": len(predictions)}
        return metrics, predictions
