"""The one training loop, shared by every fine-tuning task and by pretraining.

    documents ─task─▶ segments (one pass) ─reading_passes─▶ skim + retrospective passes
      ─schedule─▶ rows × steps ─collate─▶ batch ─model(memories)─▶ outputs, new memories
      ─task.loss / task.row_outputs─▶ optimizer step / document predictions ─▶ metrics

The trainer owns the memories of its rank's rows: they go into every forward and come back
out; a row's memory is zeroed (reset_memory) when a new document starts in it. Evaluation uses
its own zero memories, so the training stream is untouched by it. Streaming tasks run until
`max_steps` on a train split that is a stream: pretraining's `pretraining.stream.StreamSplit`
schedules documents the same way as they arrive; the language model (a task that builds its
own model and splits, `lm.task`) reads token streams and is evaluated over whole streams.
"""
import copy
import json
import math
import os
import shutil
import tempfile
import time
import zlib
from collections import defaultdict

import numpy as np
import paddle

from ernie_doc.config import ConfigError, ErnieDocConfig
from ernie_doc.data import DataError
from ernie_doc.data.collate import collate
from ernie_doc.data.schedule import epoch_schedule
from ernie_doc.data.segment import reading_passes, step_members
from ernie_doc.training import distributed as dist
from ernie_doc.training import outdir
from ernie_doc.training import state as ckpt
from ernie_doc.training.optim import build_optimizer
from ernie_doc.training.run_config import missing_key
from ernie_doc.training.runlog import RunLog, logger, plot_curves, setup_logging
from ernie_doc.training.tasks import build_task
from ernie_doc.utils import atomic_write_text

RUN_CONFIG = "run_config.yaml"


class TrainingError(RuntimeError):
    """The run cannot go on (non-finite loss ...)."""


def step_seed(seed, rank, step):
    """Dropout seed of one micro-step: a function of (seed, rank, step) alone, so a resumed
    run draws exactly the masks the uninterrupted one would have."""
    return zlib.crc32(f"{seed}:{rank}:{step}".encode()) & 0x7FFFFFFF


class Split:
    """One split, ready to schedule: its documents and each one's reading passes (steps of
    `group` rows each: a Segment, or a tuple of `group` Segments read in lockstep)."""

    def __init__(self, name, docs, passes, group=1):
        self.name, self.docs, self.passes, self.group = name, docs, passes, group
        self.lengths = [len(p) for p in passes]
        self.template = step_members(passes[0][0])[0].targets if passes else {}

    def batches(self, schedule, seq_len, pad_id, start=0):
        """schedule: over slots of `group` rows → (step, collated batch of slots×group rows)."""
        g = self.group
        for step in range(start, len(schedule)):
            rows, resets = [], []
            for d, s, reset in zip(schedule.doc[step], schedule.seg[step],
                                   schedule.reset[step]):
                rows.extend([None] * g if d < 0 else step_members(self.passes[d][s]))
                resets.extend([reset] * g)
            yield step, collate(rows, resets, seq_len, pad_id, self.template)


def _format(metrics):
    return " ".join(f"{k} {v:.4f}" for k, v in metrics.items())


def _to_tensors(batch):
    return {k: paddle.to_tensor(v) for k, v in batch.items()}


class Trainer:
    def __init__(self, cfg, resume=False):
        # `given` is the config as written (run_config.yaml keeps released names and URLs);
        # `cfg` has them resolved to local paths by prepare()
        self.given = self.cfg = cfg
        self.resume = resume
        self.rank, self.world = dist.rank(), dist.world_size()
        self.is_main = self.rank == 0
        self.out = cfg.output_dir

    # -- set-up: everything that can fail on bad input happens before OUTPUT_DIR is touched --
    def prepare(self):
        if self.resume and self.cfg.eval_only:
            raise ConfigError(f"{self.cfg.source}: eval_only: nothing to resume")
        self.cfg = cfg = self._resolve_inputs(self.given)
        self.task = build_task(cfg)
        reported = tuple(self.task.metric_names) + ("loss",)
        if cfg.main_metric is not None and cfg.main_metric not in reported:
            raise ConfigError(f"{cfg.source}: main_metric {cfg.main_metric!r}: kind "
                              f"{cfg.kind!r} reports {', '.join(reported)}")
        self.streaming = getattr(self.task, "streaming", False)
        if self.streaming:   # before any collective call: bad data fails on every rank
            self.task.check_data(self.world)
        self.device = dist.init(cfg.device)
        if cfg.amp and self.device != "gpu":
            raise ConfigError(f"{cfg.source}: amp: needs a GPU (device is {self.device})")
        if cfg.threads:
            from ernie_doc.utils import set_paddle_threads
            set_paddle_threads(cfg.threads)
        self._check_output_dir()
        setup_logging(None, self.is_main)   # console now; the file once OUTPUT_DIR exists
        self.tokenizer, self._spm_dir = None, None
        if getattr(self.task, "builds_model", False):   # e.g. the language model
            self._check_memory(*self.task.memory_plan())
            paddle.seed(cfg.seed)   # the same initial weights on every rank
            self.raw = self.task.build_model()
            self.model = dist.wrap(self.raw)
            self.splits = self.task.build_splits(self.rank, self.world)
            summary = self.task.describe(self.device, self.world)
        else:
            summary = self._prepare_documents()
        self._resumed = self._read_resume_state() if self.resume else None
        self._create_output_dir()
        if self._spm_dir:
            shutil.rmtree(self._spm_dir, ignore_errors=True)   # loaded; a copy is in OUTPUT_DIR
        setup_logging(self.out, self.is_main)
        for line in summary:
            logger.info(line)
        return self

    def _prepare_documents(self):
        """Tokenizer, ERNIE-Doc model and the document splits → the summary log lines."""
        cfg = self.cfg
        names = []
        train = [] if self.streaming or cfg.eval_only else ["train"]
        for split in train + list(cfg.eval_splits) + list(cfg.test_splits):
            if split not in names:
                names.append(split)
        docs = {split: self.task.read(split) for split in names}
        self.tokenizer, special, self._spm_dir = self._tokenizer(
            docs.get("train", docs[names[0]] if cfg.eval_only else None))
        self.model = self._build_model(special)
        config = self.raw.config
        if cfg.max_seq_len > config.max_position_embeddings:
            raise ConfigError(f"{cfg.source}: max_seq_len {cfg.max_seq_len} exceeds the model's "
                              f"max_position_embeddings {config.max_position_embeddings}")
        stride = cfg.stride or config.memory_len
        if not stride:
            raise ConfigError(f"{cfg.source}: stride: the model's memory_len is 0, so the "
                              "default window advance (stride = memory_len) is 0; give stride")
        try:
            self.task.setup(special, cfg.max_seq_len, stride, self.tokenizer)
        except ValueError as e:   # the segmenter's limits (no room for tokens ...)
            if isinstance(e, (ConfigError, DataError)):
                raise
            raise ConfigError(f"{cfg.source}: max_seq_len {cfg.max_seq_len}: {e}") from None
        stride = getattr(self.task.segmenter, "stride", stride)
        self.pad_id = special["pad"]
        group = self.task.group_size
        for key in ("batch_size", "eval_batch_size"):
            if cfg[key] and cfg[key] % group:
                raise ConfigError(f"{cfg.source}: {key} {cfg[key]} must be a multiple of "
                                  f"{group} (rows per example of task kind {cfg.kind!r})")
        self.splits, notes = {}, []
        for split, split_docs in docs.items():
            passes = []
            self.task.take_cuts()   # count this split's cut documents alone
            for i, doc in enumerate(split_docs):
                try:
                    steps = self.task.document_segments(doc, i, self.tokenizer)
                except DataError as e:
                    raise DataError(f"split {split!r}: {e}") from None
                passes.append(reading_passes(steps, cfg.retro_feed, cfg.train_skim))
            self.splits[split] = Split(split, split_docs, passes, group)
            rows = cfg.batch_size if split == "train" else cfg.eval_batch_size or cfg.batch_size
            notes += self._length_notes(self.splits[split], rows // group,
                                        self.task.take_cuts())
        if self.streaming and not cfg.eval_only:
            from ernie_doc.pretraining.stream import StreamSplit
            self.splits["train"] = StreamSplit(self.task, self.rank, self.world, cfg.batch_size,
                                               cfg.max_seq_len, self.pad_id, cfg.seed)
        labels = f"{len(self.task.labels)} labels; " if self.task.labels else ""
        fixed = [s for s in self.splits.values() if isinstance(s, Split)]
        reads = ("no training" if cfg.eval_only else "streamed" if self.streaming else
                 f"{sum(self.splits['train'].lengths)} training segment reads per epoch")
        return [f"task {cfg.task} ({cfg.kind}): {labels}"
                + ", ".join(f"{s.name} {len(s.docs)} docs / {sum(s.lengths)} segment reads"
                            for s in fixed)
                + (f"{', ' if fixed else ''}train streamed from {cfg.data_dir} in "
                   f"{self.task.num_shards(self.world)} shards" if self.streaming else ""),
                f"model: L={config.num_hidden_layers} H={config.hidden_size} "
                f"vocab={config.vocab_size} T={cfg.max_seq_len} M={config.memory_len} "
                f"stride={stride} recurrence={config.recurrence} retro_feed={cfg.retro_feed}"
                f" on {self.device} x{self.world}; {reads}"] + notes

    LONG_DOCUMENT_READS = 100   # below this, one long document is no concern

    def _length_notes(self, split, slots, cuts):
        """Log lines on a split's longest documents (segment reads, both passes), so that one
        huge document (a 5 MB line) is seen up front: a row reads one document at a time, so
        the longest document alone sets a lower bound on an epoch's steps. Also the documents
        that max_doc_tokens cut short."""
        lengths = np.asarray(split.lengths)
        if not len(lengths):
            return []
        order = np.argsort(-lengths, kind="stable")[:3]
        longest = ", ".join(f"{split.docs[i].doc_id} {lengths[i]:,}" for i in order)
        notes = [f"{split.name}: longest documents (segment reads): {longest}; median "
                 f"{int(np.median(lengths)):,}"]
        shared = math.ceil(lengths.sum() / max(1, slots * self.world))   # if rows balanced
        longest = int(lengths.max())
        if longest > 2 * shared and longest >= self.LONG_DOCUMENT_READS:
            notes.append(f"WARNING {split.name}: document {split.docs[order[0]].doc_id} alone "
                         f"takes {longest:,} segment reads, so an epoch needs at least "
                         f"{longest:,} steps (its rows would need {shared:,}); max_doc_tokens "
                         "caps a document's length")
        if len(cuts):
            notes.append(f"{split.name}: {cuts.describe(self.cfg.max_doc_tokens)}")
        return notes

    def _inputs(self):
        """Paths this run reads (OUTPUT_DIR may not be, contain or lie inside any of them)."""
        cfg = self.cfg

        def strings(value):
            if isinstance(value, str):
                yield value
            elif isinstance(value, dict):
                for v in value.values():
                    yield from strings(v)
            elif isinstance(value, (list, tuple)):
                for v in value:
                    yield from strings(v)
        # data_dir is a list of paths for a pretraining corpus
        paths = [cfg.init_checkpoint, cfg.model] + list(strings(cfg.data_dir))
        if cfg.tokenizer != "train":
            paths.append(cfg.tokenizer)
        paths.extend(strings(cfg.reader))   # reader.file, reader.files.{split}, cache_dir ...
        return [p for p in paths if isinstance(p, str) and p and os.path.exists(p)]

    def _read_resume_state(self):
        """--resume: the latest checkpoint read and checked against the model (its weights
        restored) and the run's logs checked, before the run writes anything → (path,
        trainer state, this rank's arrays, optimizer state)."""
        from ernie_doc.training.runlog import check_run_logs
        path = ckpt.latest_checkpoint(self.out)
        if path is None:
            raise ConfigError(f"--resume {self.out}: no checkpoint saved yet")
        state, arrays, optimizer_state = ckpt.read_training_state(path, self.raw)
        total_steps = self._total_steps(self.splits["train"])
        if state["total_steps"] != total_steps:
            raise ConfigError(f"--resume {self.out}: the data or config changed "
                              f"({state['total_steps']} steps then, {total_steps} now)")
        if self.is_main:
            check_run_logs(self.out)
        return path, state, arrays, optimizer_state

    def _check_output_dir(self):
        cfg = self.cfg
        outdir.check_output_dir(self.out, self._inputs(), resume=self.resume,
                                overwrite=bool(cfg.get("overwrite_output_dir")),
                                marker=RUN_CONFIG, source=cfg.source)

    def _create_output_dir(self):
        if self.is_main:
            if not self.resume:   # overwrite_output_dir: a previous run's names only
                removed = outdir.clear_previous_run(self.out)
                if removed:
                    logger.info(f"overwrite_output_dir: removed the previous run in {self.out} "
                                f"({', '.join(removed)})")
            os.makedirs(self.out, exist_ok=True)
            if self._spm_dir:
                os.makedirs(os.path.join(self.out, "tokenizer"), exist_ok=True)
                dst = os.path.join(self.out, "tokenizer", "spm.model")
                shutil.copy2(os.path.join(self._spm_dir, "spm.model"), dst)
                self.tokenizer.source_files = [dst]
            if not self.resume:
                import yaml
                atomic_write_text(os.path.join(self.out, RUN_CONFIG),
                                  yaml.safe_dump(dict(self.given), sort_keys=False))
        dist.barrier()

    @staticmethod
    def _resolve_inputs(cfg):
        """`cfg` with `init_checkpoint`, `tokenizer` and a URL or archive `model` replaced by
        local paths (ernie_doc.hub.resolve: a released name or URL is fetched into the cache
        once, by one process of a distributed job, and verified). A released name as `model`
        stays a config preset: it names an architecture, not weights."""
        from ernie_doc.hub import HubError, is_url, resolve
        from ernie_doc.hub.archive import is_archive
        resolved = copy.copy(cfg)
        try:
            if cfg.init_checkpoint:
                resolved["init_checkpoint"] = resolve(cfg.init_checkpoint, "model",
                                                      cfg.model_source)
            if cfg.tokenizer and cfg.tokenizer != "train":
                resolved["tokenizer"] = resolve(cfg.tokenizer, "tokenizer")
            if isinstance(cfg.model, str) and (is_url(cfg.model) or (
                    os.path.isfile(cfg.model) and is_archive(cfg.model))):
                resolved["model"] = resolve(cfg.model, "model")
        except HubError as e:
            raise ConfigError(f"{cfg.source}: {e}") from None
        return resolved

    def _tokenizer(self, train_docs):
        """→ (tokenizer or None, {cls, sep, pad} ids, dir of a freshly trained SPM or None)."""
        cfg = self.cfg
        id_vocabulary = getattr(self.task.reader, "id_vocabulary", None)
        if train_docs is not None and all(d.ids is not None for d in train_docs) \
                and id_vocabulary is not None:   # pre-tokenized: the reader's own ids
            if cfg.tokenizer:
                raise ConfigError(f"{cfg.source}: tokenizer: task {cfg.task} reads token ids, "
                                  f"not text; it uses no tokenizer (got {cfg.tokenizer!r})")
            return None, id_vocabulary(dict(cfg.reader))[0], None
        from ernie_doc.hub import HubError, is_released, resolve
        from ernie_doc.tokenization import load_tokenizer
        spm_dir = None
        if cfg.tokenizer == "train":
            spm_dir = self._train_spm(train_docs)
            source = os.path.join(spm_dir or os.path.join(self.out, "tokenizer"), "spm.model")
        else:
            source = cfg.tokenizer or cfg.init_checkpoint
            if not source and is_released(cfg.model):   # the released model's tokenizer
                try:
                    source = resolve(cfg.model, "tokenizer")
                except HubError as e:
                    raise ConfigError(f"{cfg.source}: tokenizer (of model {cfg.model}): "
                                      f"{e}") from None
            if not source:
                raise missing_key(cfg, "tokenizer", f"model {cfg.model!r} is not a released "
                                  f"model and there is no init_checkpoint to take one from: "
                                  f"a tokenizer directory, a released name such as "
                                  f"ernie-doc-base-en, or train (SentencePiece on the train "
                                  f"split)")
        try:
            tokenizer = load_tokenizer(source)
        except (FileNotFoundError, ValueError) as e:   # TokenizerError, DataError included
            raise ConfigError(f"{cfg.source}: tokenizer: {e}") from None
        special = {"cls": tokenizer.cls_token_id, "sep": tokenizer.sep_token_id,
                   "pad": tokenizer.pad_token_id}
        missing = [k for k, v in special.items() if v is None]
        if missing:
            raise ConfigError(f"{cfg.source}: tokenizer {source}: no {missing} token")
        return tokenizer, special, spm_dir

    def _train_spm(self, train_docs):
        """SentencePiece on the train split (for from-scratch runs), in a temporary directory
        → that directory, or None when resuming a run that already has one."""
        from ernie_doc.tokenization.spm import train
        if self.resume and os.path.isfile(os.path.join(self.out, "tokenizer", "spm.model")):
            return None
        if train_docs is None:   # a streamed corpus: its first documents
            train_docs = self.task.tokenizer_sample()
        tmp = tempfile.mkdtemp(prefix="ernie-doc-spm-")
        corpus = os.path.join(tmp, "corpus.txt")
        with open(corpus, "w", encoding="utf-8") as f:
            for doc in train_docs:
                for text in self.task.tokenizer_texts(doc):
                    f.write(" ".join(text.split()) + "\n")
        logger.info(f"training a SentencePiece tokenizer ({self.cfg.tokenizer_vocab_size} "
                    "pieces) on the train split")
        try:
            train(corpus, os.path.join(tmp, "spm"), self.cfg.tokenizer_vocab_size,
                  extra_options={"max_sentence_length": 1 << 20})
        except RuntimeError as e:   # e.g. a vocabulary larger than the corpus allows
            shutil.rmtree(tmp, ignore_errors=True)
            reason = str(e).strip().splitlines()[-1].split("] ")[-1]
            raise ConfigError(f"{self.cfg.source}: tokenizer_vocab_size "
                              f"{self.cfg.tokenizer_vocab_size}: SentencePiece training on the "
                              f"train split failed: {reason}") from None
        return tmp

    def _vocabulary(self, special):
        """The from-scratch model's vocab_size and pad_token_id: the tokenizer's (or the
        pre-tokenized reader's). model_overrides may ask for a larger table, never a smaller
        one or another padding id."""
        cfg = self.cfg
        if self.tokenizer is not None:
            size = len(self.tokenizer)
        elif getattr(self.task.reader, "id_vocabulary", None) is not None:
            size = self.task.reader.id_vocabulary(dict(cfg.reader))[1]
        else:
            return {}
        given = cfg.model_overrides
        if "vocab_size" in given:
            if not isinstance(given["vocab_size"], int) or given["vocab_size"] < size:
                raise ConfigError(f"{cfg.source}: model_overrides.vocab_size "
                                  f"{given['vocab_size']!r} is smaller than the {size} ids the "
                                  "tokenizer produces")
            if given["vocab_size"] > size:
                logger.info(f"model_overrides.vocab_size {given['vocab_size']}: keeping it "
                            f"(the tokenizer needs {size})")
            size = given["vocab_size"]
        if "pad_token_id" in given and given["pad_token_id"] != special["pad"]:
            raise ConfigError(f"{cfg.source}: model_overrides.pad_token_id "
                              f"{given['pad_token_id']!r} is not the tokenizer's [PAD] id "
                              f"{special['pad']}")
        return {"vocab_size": size, "pad_token_id": special["pad"]}

    def _check_memory(self, build, layers, hidden, heads, tokens, memory_len):
        """Refuse (ConfigError) a run whose estimated memory (ernie_doc.resources) exceeds
        what this device has, before the model is built: `build()` makes the model, here
        under paddle.LazyGuard, which allocates nothing."""
        from ernie_doc import resources
        cfg = self.cfg
        rows = (cfg.eval_batch_size or cfg.batch_size) if cfg.eval_only else cfg.batch_size
        params = resources.parameter_count(build)
        parts = resources.training_parts(params, layers, rows, tokens, memory_len, hidden,
                                         heads, training=not cfg.eval_only)
        resources.check_fits(parts, f"{cfg.source}: {params:,} parameters, batch_size {rows}, "
                                    f"{tokens} tokens per row", self.device)

    def _checkpoint_config(self, overrides):
        """init_checkpoint's model config with `overrides`, read from its config file alone
        (no tensor is loaded), or None when it has none (from_pretrained then says so)."""
        from ernie_doc.checkpoint import io
        _, _, path = io.detect_format(self.cfg.init_checkpoint)
        if path is None:
            return None
        values, _ = io.read_config_file(path)
        return ErnieDocConfig.from_dict(values, source=path).replace(**overrides)

    def _build_model(self, special):
        cfg = self.cfg
        head = self.task.head_class
        overrides = dict(self.task.model_config_overrides())
        overrides.update(cfg.model_overrides)
        try:
            if cfg.init_checkpoint:
                config = self._checkpoint_config(overrides)
            else:
                overrides.update(self._vocabulary(special))
                config = ErnieDocConfig.from_any(cfg.model, **overrides)
        except ConfigError as e:   # name the keys the bad value can come from
            keys = "init_checkpoint" if cfg.init_checkpoint else f"model {cfg.model!r}"
            raise ConfigError(f"{cfg.source}: {keys} with model_overrides: {e}") from None
        if config is not None:
            memory = 0 if config.recurrence == "none" else config.memory_len
            self._check_memory(lambda: head(config, **self.task.model_kwargs()),
                               config.num_hidden_layers, config.hidden_size,
                               config.num_attention_heads, cfg.max_seq_len, memory)
        paddle.seed(cfg.seed)   # the same initial weights on every rank
        if cfg.init_checkpoint:
            model = head.from_pretrained(cfg.init_checkpoint, **self.task.model_kwargs(),
                                         allow_partial=cfg.allow_partial_checkpoint,
                                         **overrides)
            logger.info(model.load_report.summary())
            missing = model.load_report.missing
            if cfg.eval_only and missing:   # a fresh head's predictions would be noise
                raise ConfigError(f"{cfg.source}: eval_only: {cfg.init_checkpoint} lacks "
                                  f"{len(missing)} tensors of {head.__name__} ("
                                  f"{', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}"
                                  "): there is no trained model to evaluate")
        else:
            model = head(config, **self.task.model_kwargs())
        vocab = model.config.vocab_size
        if self.tokenizer is not None and len(self.tokenizer) > vocab:
            raise ConfigError(f"tokenizer has {len(self.tokenizer)} tokens but the model's "
                              f"vocabulary has {vocab}")
        model.ernie_doc.recompute = cfg.recompute
        self.raw = model
        return dist.wrap(model)

    # -- training ------------------------------------------------------------------------------
    def _schedule(self, split, rows, epoch, shuffle):
        """rows per rank → this rank's schedule over its rows // group slots."""
        slots = rows // split.group
        return epoch_schedule(split.lengths, slots, self.world, shuffle, self.cfg.seed,
                              epoch).rank_rows(self.rank, slots)

    def _micro_batches(self, train, state):
        """→ (epoch, micro-step, batch, ends an optimizer step, ends the epoch) from the
        resume position on. A streamed split has no epochs: it runs until max_steps."""
        cfg, accum = self.cfg, self.cfg.grad_accum_steps
        if self.streaming:
            for micro, batch in train.batches(state["micro"]):
                yield train.epoch, micro, batch, (micro + 1) % accum == 0, False
            return
        for epoch in range(state["epoch"], cfg.epochs):
            schedule = self._schedule(train, cfg.batch_size, epoch, cfg.shuffle)
            start = state["micro"] if epoch == state["epoch"] else 0
            for micro, batch in train.batches(schedule, cfg.max_seq_len, self.pad_id, start):
                end = micro + 1 == len(schedule)
                yield epoch, micro, batch, (micro + 1) % accum == 0 or end, end

    def _total_steps(self, train):
        cfg = self.cfg
        if self.streaming:
            return cfg.max_steps
        micro_per_epoch = [len(self._schedule(train, cfg.batch_size, e, cfg.shuffle))
                           for e in range(cfg.epochs)]
        total = sum(math.ceil(n / cfg.grad_accum_steps) for n in micro_per_epoch)
        return min(total, cfg.max_steps) if cfg.max_steps else total

    def train(self):
        cfg = self.cfg
        train = self.splits["train"]
        B, accum = cfg.batch_size, cfg.grad_accum_steps
        total_steps = self._total_steps(train)
        optimizer, scheduler = build_optimizer(
            self.model, cfg, total_steps, getattr(self.raw.config, "num_hidden_layers", 0))
        self.optimizer = optimizer
        scaler = paddle.amp.GradScaler(init_loss_scaling=32768) if cfg.amp else None
        state = {"epoch": 0, "micro": 0, "step": 0, "best": None, "best_step": None,
                 "total_steps": total_steps}
        carry = self.task.init_carry(self.raw, B)   # memories (and their mask / positions)
        if self.resume:
            path, state, arrays, optimizer_state = self._resumed   # checked in prepare
            ckpt.load_optimizer_state(self.raw, optimizer, optimizer_state)
            carry.update({k: paddle.to_tensor(v) for k, v in arrays.items() if k != "stream"})
            if self.streaming:
                train.load_state_array(arrays["stream"])
            logger.info(f"resumed from {path}: step {state['step']}, epoch {state['epoch']}")
        self.state = state
        log = RunLog(self.out, self.is_main, resume_step=state["step"])
        from tqdm import tqdm
        bar = tqdm(total=total_steps, initial=state["step"], desc=f"train {cfg.task}",
                   disable=not (self.is_main and cfg.progress), dynamic_ncols=True,
                   mininterval=1.0)
        epochs = "" if self.streaming else f"{cfg.epochs} epochs, "
        logger.info(f"training: {epochs}{total_steps} optimizer steps "
                    f"({B} rows/rank x {self.world} ranks x {accum} accumulation)")
        self.model.train()
        # per micro-step since the last optimizer step: (mean loss, rows), task metric sums
        losses, metrics, tokens, t0 = [], defaultdict(lambda: [0.0, 0.0]), 0, time.perf_counter()
        window = (0.0, 0.0)   # loss sum and rows since the last log line
        stop = False
        for epoch, micro, batch, boundary, epoch_end in self._micro_batches(train, state):
            paddle.seed(step_seed(cfg.seed, self.rank, state["step"] * accum + micro % accum))
            value, rows, carry = self._forward_backward(batch, carry, scaler, sync=boundary,
                                                        metrics=metrics)
            if not math.isfinite(value):
                raise TrainingError(
                    f"step {state['step'] + 1} (epoch {epoch + 1}): the loss is {value}; "
                    f"stopping. Try a lower learning_rate or max_grad_norm: 1.0")
            losses.append((value, rows))
            tokens += self.task.batch_tokens(batch)
            if not boundary:
                continue
            lr = optimizer.get_lr()
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.clear_grad()
            scheduler.step()
            state["step"] += 1
            state["epoch"], state["micro"] = epoch, micro + 1
            elapsed = max(time.perf_counter() - t0, 1e-9)
            record = {"step": state["step"], "epoch": epoch + 1, "lr": lr,
                      "tokens_per_sec": round(tokens * self.world / elapsed, 1),
                      "tokens_per_sec_per_rank": round(tokens / elapsed, 1)}
            step_sum, step_rows, task_metrics = self._over_ranks(losses, metrics)
            if step_rows:   # no loss when every row only skimmed (retro feed)
                record["loss"] = step_sum / step_rows
            record.update(task_metrics)
            window = (window[0] + record.get("loss", 0.0) * bool(step_rows),
                      window[1] + bool(step_rows))
            log.train_step(record)
            bar.update(1)
            shown = f"{window[0] / window[1]:.4f}" if window[1] else "-"
            bar.set_postfix(loss=shown, lr=f"{lr:.2e}")
            if cfg.logging_steps and state["step"] % cfg.logging_steps == 0:
                extra = "".join(f" {k} {v:.4f}" for k, v in task_metrics.items()
                                if k != "loss")
                logger.info(f"step {state['step']}/{total_steps} epoch {epoch + 1} "
                            f"loss {shown}{extra} lr {lr:.3e} "
                            f"{record['tokens_per_sec']:.0f} tok/s")
                window = (0.0, 0.0)
            losses, metrics, tokens = [], defaultdict(lambda: [0.0, 0.0]), 0
            t0 = time.perf_counter()
            last = state["step"] == total_steps
            if epoch_end:
                state["epoch"], state["micro"] = epoch + 1, 0
            evaluate = last or (cfg.eval_steps and state["step"] % cfg.eval_steps == 0) \
                or (epoch_end and cfg.eval_every_epoch)
            if evaluate:
                self._evaluate_and_keep_best(log)
            stop = bool(cfg.stop_at_step) and state["step"] == cfg.stop_at_step and not last
            if evaluate or stop or (cfg.save_steps and state["step"] % cfg.save_steps == 0):
                self._save_state(carry)
            if stop:
                logger.info(f"stop_at_step {cfg.stop_at_step}: stopping; continue with "
                            f"--resume {self.out}")
            if stop or last:
                break
        bar.close()
        self.last_memories = None if carry.get("memories") is None else \
            carry["memories"].numpy()
        results = None
        if not stop:
            results = self._finish(log)
        log.close()
        return results

    def _forward_backward(self, batch, carry, scaler, sync, metrics):
        """One micro-step → (loss value, rows that trained, new memory carry); adds the
        task's metric sums to `metrics`. Gradients are all-reduced across ranks only when
        `sync` (the last micro-step of an optimizer step)."""
        cfg = self.cfg
        t = _to_tensors(batch)
        weight = paddle.to_tensor(self.task.train_weight(batch).astype("float32"))
        with paddle.amp.auto_cast(enable=cfg.amp):
            out, carry = self.task.forward(self.model, t, carry)
            loss, step_metrics = self.task.train_loss(out, t, weight)
        for name, (total, count) in step_metrics.items():
            metrics[name][0] += total
            metrics[name][1] += count
        value = float(loss)
        if math.isfinite(value):
            scaled = loss / cfg.grad_accum_steps
            if scaler is not None:
                scaled = scaler.scale(scaled)
            if self.world > 1 and not sync:
                with self.model.no_sync():
                    scaled.backward()
            else:
                scaled.backward()
        return value, float(weight.sum()), carry

    def _save_state(self, carry):
        arrays = {k: v.numpy() for k, v in carry.items() if v is not None}
        if self.streaming:
            arrays["stream"] = self.splits["train"].state_array()
        ckpt.save_training_state(self.out, self.state["step"], self.raw, self.optimizer,
                                 self.state, arrays, self.cfg.keep_checkpoints)

    def _over_ranks(self, losses, metrics):
        """(loss summed over training rows, number of such rows, {task metric: mean}) over
        these micro-steps and all ranks."""
        total = (sum(v * n for v, n in losses), sum(n for _, n in losses), dict(metrics))
        parts = dist.gather_objects(total) if self.world > 1 else [total]
        merged = defaultdict(lambda: [0.0, 0.0])
        for part in parts:
            for name, (value, count) in part[2].items():
                merged[name][0] += value
                merged[name][1] += count
        means = {name: value / count for name, (value, count) in merged.items() if count}
        return sum(p[0] for p in parts), sum(p[1] for p in parts), self.task.combine_metrics(means)

    # -- evaluation ----------------------------------------------------------------------------
    def evaluate(self, split_name):
        """Read the split with fresh memories (eval mode) → (metrics, predictions) on every
        rank; rows are sharded across ranks like training and gathered."""
        cfg = self.cfg
        split = self.splits[split_name]
        B = cfg.eval_batch_size or cfg.batch_size
        if not isinstance(split, Split):   # a token stream (language model)
            return self._evaluate_stream(split, B)
        schedule = self._schedule(split, B, 0, False)
        self.model.eval()
        rows = defaultdict(list)
        loss_sum, loss_rows = 0.0, 0.0
        carry = {}
        with paddle.no_grad():
            for _, batch in split.batches(schedule, cfg.max_seq_len, self.pad_id):
                t = _to_tensors(batch)
                with paddle.amp.auto_cast(enable=cfg.amp):
                    out, carry = self.task.forward(self.model, t, carry)
                final = batch["final"] & (batch["doc_index"] >= 0)
                if not final.any():
                    continue
                weight = paddle.to_tensor(final.astype("float32"))
                loss_sum += float(self.task.loss(out, t, weight)) * float(final.sum())
                loss_rows += float(final.sum())
                outputs = self.task.row_outputs(out, t)   # [B // group, ...]
                g = split.group
                for r in np.nonzero(final)[0]:
                    if r % g == 0:   # a group's first row stands for the group
                        rows[int(batch["doc_index"][r])].append((int(batch["seg_index"][r]),
                                                                 outputs[r // g]))
        self.model.train()
        parts = dist.gather_objects((dict(rows), loss_sum, loss_rows))
        merged = defaultdict(list)
        for part_rows, _, _ in parts:
            for doc, items in part_rows.items():
                merged[doc].extend(items)
        metrics, predictions = self.task.evaluate(split.docs, merged, split.passes)
        metrics["loss"] = sum(p[1] for p in parts) / max(1.0, sum(p[2] for p in parts))
        return metrics, predictions

    def _evaluate_stream(self, split, rows):
        """A stream split (`batches(rows)` yields this rank's batches in order, `protocol()`
        sets the model up for it) read once with fresh memories → (the task's metrics over
        all ranks, None)."""
        from tqdm import tqdm
        self.model.eval()
        sums, carry = defaultdict(float), {}
        with paddle.no_grad(), split.protocol(self.raw):
            batches = split.batches(rows)
            for batch in tqdm(batches, total=len(batches), desc=f"eval {split.name}",
                              disable=not (self.is_main and self.cfg.progress), leave=False,
                              dynamic_ncols=True, mininterval=1.0):
                t = _to_tensors(batch)
                with paddle.amp.auto_cast(enable=self.cfg.amp):
                    out, carry = self.task.forward(self.model, t, carry)
                for name, value in self.task.eval_sums(out, t).items():
                    sums[name] += value
        self.model.train()
        merged = defaultdict(float)
        for part in dist.gather_objects(dict(sums)):
            for name, value in part.items():
                merged[name] += value
        return self.task.stream_metrics(split, merged), None

    def _main_metric(self):
        return self.cfg.main_metric or self.task.main_metric

    def _evaluate_and_keep_best(self, log):
        step = self.state["step"]
        main = self._main_metric()
        for i, split in enumerate(self.cfg.eval_splits):
            metrics, predictions = self.evaluate(split)
            if main not in metrics:
                raise ConfigError(f"main_metric {main!r}: the task reports {sorted(metrics)}")
            log.evaluation(split, step, metrics)
            logger.info(f"eval {split} @ step {step}: {_format(metrics)}")
            if i == 0 and (self.state["best"] is None
                           or self.task.better(main, metrics[main], self.state["best"])):
                self.state["best"], self.state["best_step"] = metrics[main], step
                if self.is_main:
                    self._write_results("eval_results.json", split, step, metrics, predictions)
                    ckpt.save_best(self.out, step, self.raw, self._tokenizer_files(),
                                   dict(metrics, step=step, split=split))
                dist.barrier()
        if self.is_main:
            plot_curves(self.out, main)

    def _tokenizer_files(self):
        """Files saved beside every exported model (tokenizer or vocabulary)."""
        if self.tokenizer:
            return getattr(self.tokenizer, "source_files", [])
        return self.task.model_files()

    def _record(self, split, step, metrics):
        """What eval_results.json / {split}_results.json hold."""
        return dict(metrics, step=step, split=split, main_metric=self._main_metric())

    def _write_results(self, name, split, step, metrics, predictions):
        results = self._record(split, step, metrics)
        atomic_write_text(os.path.join(self.out, name),
                          json.dumps(results, indent=1, sort_keys=True) + "\n")
        if predictions is None:   # a stream split: no per-document predictions
            return
        atomic_write_text(os.path.join(self.out, f"predictions_{split}.jsonl"),
                          "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in predictions))

    def _finish_streamed(self):
        """A streamed train split (pretraining, language model): the final model
        (OUTPUT_DIR/final, a from_pretrained directory) and results.json: the training scalars
        averaged over the last tenth of the steps, and the last evaluation."""
        from ernie_doc.training.runlog import read_jsonl
        records = read_jsonl(os.path.join(self.out, "train_log.jsonl")) if self.is_main else []
        tail = records[-max(1, len(records) // 10):]
        keys = sorted({k for r in tail for k in r if k not in ("step", "epoch")})
        train = {k: float(np.mean([r[k] for r in tail if k in r])) for k in keys}
        evals = read_jsonl(os.path.join(self.out, "eval_history.jsonl")) if self.is_main else []
        results = {"step": self.state["step"], "train_last_steps": len(tail), "train": train,
                   "eval": evals[-1] if evals else None,
                   "final_model": os.path.join(self.out, "final")}
        if self.is_main:
            ckpt.save_final(self.out, self.raw, self._tokenizer_files())
            atomic_write_text(os.path.join(self.out, "results.json"),
                              json.dumps(results, indent=1, sort_keys=True) + "\n")
            plot_curves(self.out, self._main_metric())
        dist.barrier()
        logger.info(f"training done at step {self.state['step']}: "
                    + " ".join(f"{k} {v:.4f}" for k, v in train.items() if "tokens" not in k)
                    + f"; model in {results['final_model']}")
        return results

    def _finish(self, log):
        """The final model of a streamed run, then the test splits with the best model (the
        final one when no eval split picks a best; its first test split is then
        eval_results.json) → eval_results.json's content (results.json's when there is
        none)."""
        results = self._finish_streamed() if self.streaming else None
        best_step = self.state["best_step"]
        if self.cfg.test_splits:
            if best_step is not None:
                best = os.path.join(self.out, "best")
                self.raw.set_state_dict(type(self.raw).from_pretrained(best).state_dict())
            step = self.state["step"] if best_step is None else best_step
            which = "final model" if best_step is None else f"best step {best_step}"
            for i, split in enumerate(self.cfg.test_splits):
                metrics, predictions = self.evaluate(split)
                log.evaluation(split, step, metrics)
                logger.info(f"test {split} ({which}): {_format(metrics)}")
                if self.is_main:
                    self._write_results(f"{split}_results.json", split, step, metrics,
                                        predictions)
                    if best_step is None and i == 0:
                        self._write_results("eval_results.json", split, step, metrics, None)
        dist.barrier()
        path = os.path.join(self.out, "eval_results.json")
        if results is not None and not os.path.isfile(path):   # pretraining, no held-out set
            return results
        with open(path, encoding="utf-8") as f:
            evaluated = json.load(f)
        if best_step is not None:
            logger.info(f"best {self._main_metric()} {self.state['best']:.4f} at step "
                        f"{best_step}; results in {self.out}")
        return evaluated

    # -- evaluation only -------------------------------------------------------------------
    def evaluate_only(self):
        """eval_only: the init_checkpoint model on eval_splits then test_splits, each into
        {split}_results.json (+ predictions), the first also into eval_results.json → its
        metrics."""
        cfg = self.cfg
        log = RunLog(self.out, self.is_main)
        splits = list(dict.fromkeys(list(cfg.eval_splits) + list(cfg.test_splits)))
        first = None
        for split in splits:
            metrics, predictions = self.evaluate(split)
            log.evaluation(split, 0, metrics)
            logger.info(f"eval {split} ({cfg.init_checkpoint}): {_format(metrics)}")
            if self.is_main:
                self._write_results(f"{split}_results.json", split, 0, metrics, predictions)
                if first is None:
                    self._write_results("eval_results.json", split, 0, metrics, None)
            if first is None:
                first = self._record(split, 0, metrics)
        log.close()
        dist.barrier()
        return first


def run(cfg, resume=False):
    trainer = Trainer(cfg, resume).prepare()
    return trainer.evaluate_only() if cfg.eval_only else trainer.train()
