"""HotpotQA, distractor setting (kind `hotpotqa`): the two-stage
pipeline of Groeneveld et al. (2020) on ERNIE-Doc (paper §4.3 and appendix), one stage per run
(`task_options.stage`). Every segment reads, with the retrospective feed,

    [CLS] title1 [p] sent1,1 [SEP] sent1,2 [SEP] … title2 [p] sent2,1 [SEP] … [q] question [/q]

i.e. the paragraph sequence cut into windows that advance by the stride, with the question at
the end of every segment. Each token remembers its paragraph, sentence and characters, so the
scores and spans map back to the record.

Stage "evidence": 2-layer scorers on the [p] tokens (the paragraph is supporting: its title is
in the supporting facts) and the [SEP] tokens (the sentence is a supporting fact), binary
cross-entropy; each of these positions trains and is predicted in the window that gives it the
most context. Selection: the paragraphs (and, separately, the sentences) whose probability
exceeds `threshold` (paper: 1e-3 for base), plus always the `min_paragraphs` most probable
paragraphs. Metrics: paragraph recall / precision / EM of the selection, `para_ap` (mean average
precision of the paragraph ranking: threshold-free, the main metric, so an early model that
selects everything does not win the best checkpoint), `para_selected` (paragraphs per question)
and the official supporting-fact scores of the selected sentences. The predictions file
(one line per question: doc_id, the selected paragraphs with index, title and probability, the
selected sentences, every paragraph's probability) is stage 2's input.

Stage "answer": the input is the selected paragraphs, in their original order. Training
questions read the gold supporting paragraphs ∪ the stage-1 selection (Groeneveld et al.: the
model sees the evidence it must use and the distractors stage 1 lets through); a training
question the evidence file lacks reads the gold paragraphs alone (counted in the log).
Evaluated questions must be in the evidence file. `evidence: gold` reads the gold paragraphs
everywhere (an oracle stage 1: optimistic eval numbers). Loss: question type cross-entropy
(pooled [CLS]) + evidence BCE ([p], [SEP]) + the span kind's summed-probability span loss (all
occurrences of the answer in the input are gold; a segment without one, and a yes/no question,
points at [CLS]). Prediction: type = argmax of the mean segment softmax; a span answer is the
best span over all segments (best_spans) that stays inside one sentence; supporting facts =
sentences with probability > `sp_threshold`. Metrics: the official HotpotQA evaluation
(ernie_doc.metrics.hotpot) and the type accuracy; main metric joint_f1. The gold supporting
facts are the reader's validated ones (a fact pointing at a missing sentence is dropped there).
"""
import glob
import json
import logging
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import paddle
import paddle.nn.functional as F

from ernie_doc.data.document import read_lines, require_file
from ernie_doc.data.segment import Segment, step_members, windows
from ernie_doc.data.span import best_spans, max_context_flags, tokenize_with_offsets
from ernie_doc.errors import ConfigError, DataError
from ernie_doc.kinds import register_kind
from ernie_doc.kinds.base import DocumentTask, masked_mean, with_gold, without_training
from ernie_doc.kinds.folders import missing_key
from ernie_doc.kinds.span import NEG, span_nll
from ernie_doc.metrics import hotpot

from .head import ANSWER_TYPES, STAGES, ErnieDocForHotpotQA

logger = logging.getLogger("ernie_doc.train")   # the run's log

WORD, TITLE, PARA, SENT = 0, 1, 2, 3   # token kinds of the paragraph sequence
MARKERS = ("[p]", "[q]", "[/q]")
# A span candidate's character key (what best_spans ranks): paragraph << 48 | sentence << 32 |
# character, so one int says where a token is and two keys tell whether a span crosses a
# sentence boundary.
_CHAR_MASK = (1 << 32) - 1


@dataclass
class Layout:
    """A question's paragraph sequence, one entry per token (all arrays [N] int64): ids, kind
    (WORD / TITLE / PARA / SENT), para (paragraph index in the record), sent (sentence index;
    −1 for the title and [p]), start / end (characters inside the sentence; −1 off sentence
    words)."""
    ids: np.ndarray
    kind: np.ndarray
    para: np.ndarray
    sent: np.ndarray
    start: np.ndarray
    end: np.ndarray

    def __len__(self):
        return len(self.ids)

    def char_keys(self, chars, a, b):
        """Tokens a..b−1 → span keys [b − a] of `chars` (self.start or self.end); −1 off
        sentence words."""
        key = (self.para[a:b] << 48) | (self.sent[a:b] << 32) | chars[a:b]
        return np.where(self.kind[a:b] == WORD, key, -1)


def build_layout(paragraphs, indices, tokenizer, p_id, sep_id, cache=None):
    """`title [p] sentence [SEP] sentence [SEP] …` for the paragraphs `indices` (record
    order) → Layout. Titles and sentences are tokenized word by word (tokenize_with_offsets),
    so every sentence token keeps its characters."""
    columns = []

    def add(ids, kind, p, s, start=None, end=None):
        n = len(ids)
        none = np.full(n, -1, dtype=np.int64)
        columns.append((np.asarray(ids, dtype=np.int64), np.full(n, kind, dtype=np.int64),
                        np.full(n, p, dtype=np.int64), np.full(n, s, dtype=np.int64),
                        none if start is None else start, none if end is None else end))

    for p in indices:
        title, sentences = paragraphs[p]
        add(tokenize_with_offsets(title, tokenizer, cache).ids, TITLE, p, -1)
        add([p_id], PARA, p, -1)
        for s, sentence in enumerate(sentences):
            words = tokenize_with_offsets(sentence, tokenizer, cache)
            add(words.ids, WORD, p, s, words.starts, words.ends)
            add([sep_id], SENT, p, s)   # an empty sentence still has its [SEP]: ids stay aligned
    if not columns:
        empty = np.zeros(0, dtype=np.int64)
        return Layout(*([empty] * 6))
    return Layout(*(np.concatenate(c) for c in zip(*columns)))


def evidence_labels(layout, paragraphs, facts):
    """(paragraph labels [N], sentence labels [N]) float32: 1 at the [p] of a paragraph whose
    title is in the supporting facts, at the [SEP] of a supporting (title, sentence)."""
    titles = {title for title, _ in facts}
    pairs = {(title, s) for title, s in facts}
    gold_para = np.asarray([t in titles for t, _ in paragraphs], dtype=bool)
    para = (layout.kind == PARA) & gold_para[layout.para]
    sent = np.zeros(len(layout), dtype=bool)
    for i in np.nonzero(layout.kind == SENT)[0]:
        sent[i] = (paragraphs[layout.para[i]][0], int(layout.sent[i])) in pairs
    return para.astype(np.float32), sent.astype(np.float32)


def answer_token_spans(layout, answer, spans):
    """Answer occurrences [[paragraph, sentence, char start]] that lie in the layout → sorted
    (first, last) token spans (inclusive)."""
    found = set()
    for p, s, c in spans:
        inside = np.nonzero((layout.kind == WORD) & (layout.para == p) & (layout.sent == s)
                            & (layout.end > c) & (layout.start < c + len(answer)))[0]
        if len(inside):
            found.add((int(inside[0]), int(inside[-1])))
    return sorted(found)


class HotpotSegmenter:
    """Layout + question ids → [Segment] laid out `[CLS] window [q] question [/q] PAD…`; windows
    of T − |question| − 3 tokens advance by `stride`.

    targets (all [T] float32 unless said): para_label / para_mask and sent_label / sent_mask
    (mask: the [p] / [SEP] positions whose max-context window this is). With `answer`:
    start_gold / end_gold / allowed (span_nll's targets; allowed = [CLS] and the sentence
    words, so no span starts on a title or marker), type (int64 scalar: index in
    ANSWER_TYPES) and has_answer (float32 scalar; 0 for a question without an answer).
    meta: window (a, b), max_context [b − a] bool, layout (the Layout, shared)."""

    def __init__(self, seq_len, stride, cls_id, pad_id, open_id, close_id, answer=False):
        self.seq_len, self.stride, self.answer = seq_len, stride, answer
        self.cls_id, self.pad_id, self.open_id, self.close_id = cls_id, pad_id, open_id, close_id

    def __call__(self, layout, question, doc_index, para_label, sent_label, gold=(),
                 type_id=None):
        T = self.seq_len
        window = T - len(question) - 3
        if window < 1:
            raise ValueError(f"max_seq_len {T} leaves no room for the paragraphs next to a "
                             f"{len(question)}-token question")
        spans = windows(len(layout), window, self.stride)
        segments = []
        for i, ((a, b), own) in enumerate(zip(spans, max_context_flags(spans))):
            n = b - a
            ids = np.full(T, self.pad_id, dtype=np.int64)
            ids[0] = self.cls_id
            ids[1:n + 1] = layout.ids[a:b]
            ids[n + 1] = self.open_id
            ids[n + 2:n + 2 + len(question)] = question
            ids[n + 2 + len(question)] = self.close_id
            mask = np.zeros(T, dtype=np.float32)
            mask[:n + 3 + len(question)] = 1.0
            kind = layout.kind[a:b]

            def row(values):
                out = np.zeros(T, dtype=np.float32)
                out[1:n + 1] = values
                return out

            targets = {"para_label": row(para_label[a:b]),
                       "para_mask": row((kind == PARA) & own),
                       "sent_label": row(sent_label[a:b]),
                       "sent_mask": row((kind == SENT) & own)}
            if self.answer:
                allowed = row(kind == WORD)
                allowed[0] = 1.0
                start_gold, end_gold = np.zeros(T, np.float32), np.zeros(T, np.float32)
                for s, e in gold:
                    if a <= s and e < b:
                        start_gold[s - a + 1] = end_gold[e - a + 1] = 1.0
                if not start_gold.any():
                    start_gold[0] = end_gold[0] = 1.0
                targets.update(start_gold=start_gold, end_gold=end_gold, allowed=allowed,
                               type=np.int64(0 if type_id is None else type_id),
                               has_answer=np.float32(type_id is not None))
            segments.append(Segment(ids, mask, doc_index, i, len(spans), targets=targets,
                                    meta={"window": (a, b), "max_context": own,
                                          "layout": layout}))
        return segments


def evidence_bce(logits, label, mask, weight):
    """logits / label / mask [B, T], weight [B] → mean binary cross-entropy over the masked
    positions of the rows with weight 1 (0, with zero gradients, when there are none)."""
    m = mask * weight.unsqueeze(-1)
    bce = F.binary_cross_entropy_with_logits(logits.astype("float32"), label, reduction="none")
    return (bce * m).sum() / paddle.clip(m.sum(), min=1.0)


def evidence_probs(final):
    """[(meta, row output)] of a question's predicted segments → ({paragraph: probability},
    {(paragraph, sentence): probability}), each read in its max-context window."""
    paras, sents = {}, {}
    for meta, out in final:
        (a, b), lay, own = meta["window"], meta["layout"], meta["max_context"]
        kind = lay.kind[a:b]
        for i in np.nonzero(own & (kind == PARA))[0]:
            paras[int(lay.para[a + i])] = float(out["para"][i + 1])
        for i in np.nonzero(own & (kind == SENT))[0]:
            sents[(int(lay.para[a + i]), int(lay.sent[a + i]))] = float(out["sent"][i + 1])
    return paras, sents


def select_paragraphs(probs, threshold, at_least):
    """{paragraph: probability} → sorted paragraphs above `threshold`, and at least the
    `at_least` most probable ones (HotpotQA always needs two)."""
    ranked = sorted(probs, key=lambda p: (-probs[p], p))
    return sorted(set(ranked[:at_least]) | {p for p, x in probs.items() if x > threshold})


def average_precision(probs, gold):
    """Average precision of the gold paragraphs in the ranking by probability (a gold paragraph
    without a probability counts as never retrieved; ties rank the gold ones last, so a
    model that scores everything alike earns no credit from the record order)."""
    ranked = sorted(probs, key=lambda p: (-probs[p], p in gold))
    hits, total = 0, 0.0
    for rank, p in enumerate(ranked, 1):
        if p in gold:
            hits += 1
            total += hits / rank
    return total / len(gold) if gold else 0.0


def gold_paragraphs(doc):
    """The paragraphs whose titles are in the supporting facts ([] for a question without
    them: test data, a question to predict)."""
    titles = {title for title, _ in doc.fields.get("supporting_facts") or []}
    return [p for p, (title, _) in enumerate(doc.fields["paragraphs"]) if title in titles]


def evidence_files(spec):
    """evidence_file option (a file, a stage-1 output directory, or a list of them) → the
    predictions files it names."""
    items = spec if isinstance(spec, list) else [spec]
    files = []
    for item in items:
        item = os.fspath(item)
        if os.path.isdir(item):
            found = sorted(glob.glob(os.path.join(item, "predictions_*.jsonl")))
            if not found:
                raise DataError(f"{item}: task_options.evidence_file: no stage-1 "
                                "predictions_<split>.jsonl in this directory")
            files.extend(found)
        else:
            files.append(require_file(item, "evidence file"))
    return files


def read_selection(files):
    """Stage-1 predictions files → {doc_id: ([(paragraph index, title)], 'file:line')}."""
    selection = {}
    for path in files:
        for n, line in read_lines(path):
            if not line.strip():
                continue
            at = f"{path}:{n}"
            try:
                record = json.loads(line)
                chosen = [(int(x["index"]), str(x["title"])) for x in record["paragraphs"]]
                doc_id = record["doc_id"]
            except (ValueError, KeyError, TypeError):
                raise DataError(f"{at}: not a stage-1 evidence record (doc_id, paragraphs: "
                                "[{index, title, prob}])") from None
            if doc_id in selection and selection[doc_id][0] != chosen:
                raise DataError(f"{at}: question {doc_id!r} has other evidence in "
                                f"{selection[doc_id][1]}")
            selection[doc_id] = (chosen, at)
    return selection


EVIDENCE_METRICS = ("para_ap", "para_recall", "para_prec", "para_em", "para_selected", "sp_em",
                    "sp_f1", "sp_prec", "sp_recall")


@register_kind("hotpotqa")   # the task folders' register_kinds() imports this module
class HotpotTask(DocumentTask):
    head_class = ErnieDocForHotpotQA
    main_metric = "para_ap"
    # Both stages read the question and the paragraphs [[title, [sentence, ...]], ...]; stage 2
    # reads those stage 1 selected: the `evidence` indices when a document has them, else its
    # doc_id's entry in task_options.evidence_file (all paragraphs with evidence: gold), so
    # `evidence` is no required field (check_input looks the doc_id up).
    input_fields = ("question", "paragraphs")
    pipeline_tasks = ("question-answering",)
    option_defaults = {
        "stage": "evidence",       # evidence (stage 1) | answer (stage 2)
        "max_query_len": 64,       # question tokens kept
        "threshold": 1.0e-3,       # evidence: select paragraphs / sentences above this
        "min_paragraphs": 2,       # evidence: ... and at least this many top paragraphs
        "evidence": "predicted",   # answer: predicted (evidence_file) | gold (oracle)
        "evidence_file": None,     # answer: stage-1 predictions_<split>.jsonl, its output
                                   # directory, or a list of them
        "sp_threshold": 0.5,       # answer: supporting-fact probability
        "max_answer_len": 30,      # answer: tokens in a predicted span
        "n_best": 20,              # answer: start / end candidates per segment
    }

    def __init__(self, cfg, reader):
        super().__init__(cfg, reader)
        o = self.options
        self.check_options(("max_query_len", "min_paragraphs", "max_answer_len", "n_best"),
                           {"stage": STAGES, "evidence": ("predicted", "gold")})
        for key in ("threshold", "sp_threshold"):
            try:   # YAML 1.1 reads 1e-3 (no dot) as a string
                o[key] = float(o[key])
            except (TypeError, ValueError):
                raise self.option_error(key, f"must be a number, got {o[key]!r}") from None
            if not 0.0 <= o[key] < 1.0:
                raise self.option_error(key, f"must be a probability in [0, 1), got {o[key]!r}")
        self.stage = o["stage"]
        self.main_metric = "para_ap" if self.stage == "evidence" else "joint_f1"
        self.metric_names = EVIDENCE_METRICS if self.stage == "evidence" else \
            tuple(hotpot.KEYS) + ("type_acc",)
        if self.stage == "evidence" and o["evidence_file"]:
            raise self.option_error("evidence_file", "is stage 2's input (stage: answer)")
        if self.stage == "answer" and o["evidence"] == "predicted" and not o["evidence_file"]:
            raise missing_key(self.cfg.source, self.cfg.task, "task_options.evidence_file",
                              "stage answer reads stage 1's predictions (its output directory "
                              "or a predictions_<split>.jsonl; task_options.evidence=gold "
                              "reads the gold paragraphs instead)")
        self._cache, self._selection = {}, None

    # -- input -----------------------------------------------------------------------------
    def read(self, split):
        docs = super().read(split)
        if self.stage == "answer":
            missing = 0
            for doc in docs:
                doc.fields["evidence"], found = self._evidence(doc, split)
                missing += not found
            if missing:
                logger.warning(f"split {split!r}: {missing} of {len(docs)} questions have no "
                               "stage-1 evidence; they read their gold paragraphs alone")
        return docs

    def _evidence(self, doc, split):
        """→ (paragraph indices stage 2 reads, whether stage-1 evidence was found)."""
        paragraphs = doc.fields["paragraphs"]
        gold = gold_paragraphs(doc)
        everything = list(range(len(paragraphs)))
        if self.options["evidence"] == "gold":
            return gold or everything, True   # no supporting facts (test): all paragraphs
        if self._selection is None:
            self._selection = read_selection(evidence_files(self.options["evidence_file"]))
        entry = self._selection.get(doc.doc_id)
        if entry is None:
            if split == "train":
                return gold or everything, False
            of = f" of split {split!r}" if split else ""   # None: a question to predict
            raise DataError(f"task_options.evidence_file {self.options['evidence_file']}: no "
                            f"stage-1 evidence for question {doc.doc_id!r}{of}")
        chosen, at = entry
        for p, title in chosen:
            if not 0 <= p < len(paragraphs) or paragraphs[p][0] != title:
                raise DataError(f"{at}: question {doc.doc_id!r}: paragraph {p} {title!r} is not "
                                "in the data (evidence predicted on another file?)")
        selected = {p for p, _ in chosen}
        return sorted(selected | set(gold) if split == "train" else selected), True

    def setup(self, special_ids, max_seq_len, stride, tokenizer=None):
        if tokenizer is None:
            raise ConfigError(f"task {self.cfg.task}: HotpotQA needs a tokenizer")
        ids = {t: tokenizer.token_id(t) for t in MARKERS}
        missing = [t for t, i in ids.items() if i is None]
        if missing:
            raise ConfigError(f"{self.cfg.source}: the tokenizer has no {' / '.join(missing)} "
                              "token (the HotpotQA layout needs [p], [q], [/q]: the official "
                              "English vocabulary and tokenizer=train SentencePiece have them)")
        if max_seq_len - 3 - self.options["max_query_len"] < 1:
            raise ConfigError(f"{self.cfg.source}: max_seq_len {max_seq_len} leaves no room for "
                              f"the paragraphs next to task_options.max_query_len "
                              f"{self.options['max_query_len']}")
        self.p_id, self.sep_id = ids["[p]"], special_ids["sep"]
        self.segmenter = HotpotSegmenter(max_seq_len, stride, special_ids["cls"],
                                         special_ids["pad"], ids["[q]"], ids["[/q]"],
                                         answer=self.stage == "answer")

    def model_kwargs(self):
        return {"stage": self.stage}

    def model_config_overrides(self):
        return {"cls_token_idx": 0}

    def tokenizer_texts(self, doc):
        f = doc.fields
        return [f["question"]] + [" ".join([title] + [s.strip() for s in sentences])
                                  for title, sentences in f["paragraphs"]]

    def input_problem(self, name: str, value: Any) -> Optional[str]:
        if name != "paragraphs":
            return super().input_problem(name, value)
        if not isinstance(value, list) or not value:
            return "paragraphs must be a non-empty list of [title, [sentence, ...]]"
        for p, item in enumerate(value):
            if not (isinstance(item, (list, tuple)) and len(item) == 2
                    and isinstance(item[0], str) and isinstance(item[1], list)
                    and all(isinstance(x, str) for x in item[1])):
                return f"paragraph {p} is not [title, [sentence, ...]]"
        return None

    def check_input(self, doc) -> Optional[str]:
        problem = super().check_input(doc)
        if problem or self.stage != "answer":
            return problem
        try:
            self._reading(doc)
        except DataError as e:
            return str(e)
        return None

    def _reading(self, doc) -> List[int]:
        """The paragraph indices a question reads: all of them (evidence stage); stage 2 the
        `evidence` field `read` set, or for a question to predict its stage-1 selection."""
        paragraphs = doc.fields["paragraphs"]
        if self.stage != "answer":
            return list(range(len(paragraphs)))
        if "evidence" in doc.fields:
            indices = doc.fields["evidence"]
        else:
            indices = self._evidence(doc, None)[0]
        if not isinstance(indices, list) or not all(
                isinstance(p, int) and 0 <= p < len(paragraphs) for p in indices):
            raise DataError(f"question {doc.doc_id!r}: evidence must be a list of paragraph "
                            f"indices (0 to {len(paragraphs) - 1})")
        return indices

    def document_segments(self, doc, doc_index, tokenizer):
        f = doc.fields
        paragraphs = f["paragraphs"]
        layout = self.cap(build_layout(paragraphs, self._reading(doc), tokenizer, self.p_id,
                                       self.sep_id, self._cache), doc)
        question = tokenizer.encode(f["question"])[:self.options["max_query_len"]]
        if not question:
            raise DataError(f"question {doc.doc_id!r}: the question has no tokens")
        # the reader always gives supporting_facts (maybe []) and answer_type (maybe None);
        # a question to predict has neither: all-zero labels that do not train
        para_label, sent_label = evidence_labels(layout, paragraphs,
                                                 f.get("supporting_facts") or [])
        gold, type_id = (), None
        if self.stage == "answer" and f.get("answer_type") is not None:
            type_id = ANSWER_TYPES.index(f["answer_type"])
            if f["answer_type"] == "span":
                gold = answer_token_spans(layout, f["answer"], f["answer_spans"])
        segments = self.segmenter(layout, question, doc_index, para_label, sent_label, gold,
                                  type_id)
        return segments if "supporting_facts" in f else without_training(segments)

    # -- training --------------------------------------------------------------------------
    def loss(self, out, batch, weight):
        """Evidence BCE ([p] + [SEP]); the answer stage adds the type cross-entropy (rows of
        questions with an answer) and the span loss."""
        total = (evidence_bce(out.para_logits, batch["target_para_label"],
                              batch["target_para_mask"], weight)
                 + evidence_bce(out.sent_logits, batch["target_sent_label"],
                                batch["target_sent_mask"], weight))
        if self.stage == "answer":
            ce = F.cross_entropy(out.type_logits.astype("float32"),
                                 batch["target_type"].unsqueeze(-1), reduction="none")
            total = total + masked_mean(ce.reshape([-1]), weight * batch["target_has_answer"])
            total = total + masked_mean(span_nll(out.span_logits, batch), weight)
        return total

    def row_outputs(self, out, batch=None):
        """Per row a dict: para / sent probabilities [T]; answer stage: type probabilities
        [3], span logits [T, 2]."""
        para = F.sigmoid(out.para_logits.astype("float32")).numpy()
        sent = F.sigmoid(out.sent_logits.astype("float32")).numpy()
        rows = [{"para": para[b], "sent": sent[b]} for b in range(len(para))]
        if self.stage == "answer":
            types = F.softmax(out.type_logits.astype("float32"), axis=-1).numpy()
            spans = out.span_logits.astype("float32").numpy()
            for b, r in enumerate(rows):
                r["type"], r["span"] = types[b], spans[b]
        return rows

    # -- prediction and evaluation ---------------------------------------------------------
    @staticmethod
    def _final_rows(rows, steps):
        """[(meta, row output)] of a question's predicted segments, in order (rows: its
        [(segment index, row output)], steps: its reading passes)."""
        metas = {m.seg_index: m.meta for step in steps for m in step_members(step) if m.final}
        return [(metas[s], out) for s, out in sorted(rows, key=lambda x: x[0])]

    def predict_document(self, doc, rows: List[Tuple[int, Any]],
                         steps: Sequence) -> Dict[str, Any]:
        """Evidence stage → {doc_id, question, paragraphs: the selected [{index, title,
        prob}], sentences: [[title, sentence index, prob]] above the threshold,
        paragraph_probs: [one per paragraph of the record] (0 for one never scored),
        segments} (stage 2's evidence file: doc_id and paragraphs). Answer stage →
        {doc_id, question, answer (text, "yes" or "no"), answer_type, type_probs [3]
        (ANSWER_TYPES order), supporting_facts: [[title, sentence index]], evidence: the
        titles read, segments}. Probabilities have 6 decimals."""
        final = self._final_rows(rows, steps)
        if self.stage == "evidence":
            return self._evidence_prediction(doc, final)[0]
        return self._answer_prediction(doc, final)

    def evaluate(self, docs, rows, passes):
        if self.stage == "evidence":
            return self._evaluate_evidence(docs, rows, passes)
        return self._evaluate_answer(docs, rows, passes)

    def _evidence_prediction(self, doc, final) -> Tuple[Dict[str, Any], Dict[int, float]]:
        """→ (the record, {paragraph: probability} unrounded: the ranking para_ap scores)."""
        threshold, at_least = self.options["threshold"], self.options["min_paragraphs"]
        paragraphs = doc.fields["paragraphs"]
        paras, sents = evidence_probs(final)
        selected = select_paragraphs(paras, threshold, at_least)
        chosen = [(p, s, x) for (p, s), x in sorted(sents.items()) if x > threshold]
        record = {
            "doc_id": doc.doc_id, "question": doc.fields["question"],
            "paragraphs": [{"index": p, "title": paragraphs[p][0],
                            "prob": round(paras[p], 6)} for p in selected],
            "sentences": [[paragraphs[p][0], s, round(x, 6)] for p, s, x in chosen],
            "paragraph_probs": [round(paras.get(p, 0.0), 6) for p in range(len(paragraphs))],
            "segments": len(final)}
        return record, paras

    def _evaluate_evidence(self, docs, rows, passes):
        sums, scored, predictions = dict.fromkeys(EVIDENCE_METRICS, 0.0), 0, []
        for i, doc in enumerate(docs):
            facts = doc.fields["supporting_facts"]
            record, paras = self._evidence_prediction(
                doc, self._final_rows(rows.get(i, []), passes[i]))
            if facts:
                scored += 1
                selected = [p["index"] for p in record["paragraphs"]]
                gold = set(gold_paragraphs(doc))
                hit = len(gold & set(selected))
                sums["para_ap"] += average_precision(paras, gold)
                sums["para_recall"] += hit / len(gold)
                sums["para_prec"] += hit / len(selected) if selected else 0.0
                sums["para_em"] += float(set(selected) == gold)
                sums["para_selected"] += len(selected)
                sp = hotpot.sp_scores([[t, s] for t, s, _ in record["sentences"]], facts)
                for key, value in zip(("sp_em", "sp_f1", "sp_prec", "sp_recall"), sp):
                    sums[key] += value
            predictions.append(with_gold(record, gold_supporting_facts=facts))
        metrics = {k: v / scored if scored else 0.0 for k, v in sums.items()}
        return metrics, predictions

    def _span_answer(self, doc, final):
        """The best span over the question's segments that lies inside one sentence ("" when
        none does)."""
        metas, logits = [], []
        for meta, out in final:
            (a, b), lay = meta["window"], meta["layout"]
            word = lay.kind[a:b] == WORD
            lg = np.array(out["span"], dtype=np.float64)
            lg[1:b - a + 1][~word] = NEG   # titles and markers are no answers
            metas.append({"window": (a, b), "starts": lay.char_keys(lay.start, a, b),
                          "ends": lay.char_keys(lay.end, a, b),
                          "max_context": meta["max_context"] & word})
            logits.append(lg)
        for score, start, end in best_spans(metas, logits, self.options["n_best"],
                                            self.options["max_answer_len"]):
            if score < NEG / 2:
                break   # ranked: only spans ending on a masked token are left
            if start < 0 or end < 0 or start >> 32 != end >> 32:
                continue   # crosses a sentence boundary
            sentence = doc.fields["paragraphs"][start >> 48][1][(start >> 32) & 0xFFFF]
            return sentence[start & _CHAR_MASK:end & _CHAR_MASK]
        return ""

    def _answer_prediction(self, doc, final) -> Dict[str, Any]:
        paragraphs = doc.fields["paragraphs"]
        _, sents = evidence_probs(final)
        type_probs = (np.mean([out["type"] for _, out in final], axis=0) if final
                      else np.full(len(ANSWER_TYPES), 1.0 / len(ANSWER_TYPES)))
        kind = ANSWER_TYPES[int(np.argmax(type_probs))]
        answer = self._span_answer(doc, final) if kind == "span" else kind
        sp = [[paragraphs[p][0], s] for (p, s), x in sorted(sents.items())
              if x > self.options["sp_threshold"]]
        return {"doc_id": doc.doc_id, "question": doc.fields["question"], "answer": answer,
                "answer_type": kind, "type_probs": [round(float(x), 6) for x in type_probs],
                "supporting_facts": sp,
                "evidence": [paragraphs[p][0] for p in self._reading(doc)],
                "segments": len(final)}

    def _evaluate_answer(self, docs, rows, passes):
        predictions = self.predict(docs, rows, passes)
        answers, pred_sp, gold = {}, {}, []
        type_hits = 0
        for doc, record in zip(docs, predictions):
            f = doc.fields
            if f["answer"] is not None:
                answers[doc.doc_id], pred_sp[doc.doc_id] = record["answer"], \
                    record["supporting_facts"]
                gold.append({"_id": doc.doc_id, "answer": f["answer"],
                             "supporting_facts": f["supporting_facts"]})
                type_hits += record["answer_type"] == f["answer_type"]
        metrics = hotpot.evaluate(answers, pred_sp, gold)
        metrics["type_acc"] = type_hits / len(gold) if gold else 0.0
        return metrics, [with_gold(p, gold_answer=d.fields["answer"],
                                   gold_supporting_facts=d.fields["supporting_facts"])
                         for p, d in zip(predictions, docs)]
