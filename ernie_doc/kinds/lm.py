"""Language modelling (paper §4.1) behind the trainer's task interface (kind `language_model`).

    token files ─reader─▶ {split: path} ─load_corpus─▶ vocabulary + cached id arrays
      ─LMStreams─▶ B×world contiguous rows, tgt_len steps at a time
      ─TransformerXLLM(memories)─▶ nll, new memories ─▶ mean nll / ppl

The trainer runs it like pretraining: the train split is a stream that wraps around the corpus
and a checkpoint holds every rank's memories, so a resume continues exactly. `retro_feed`,
`max_seq_len` and `stride` do not apply. Details: docs/design-notes.md, "Language model: task"."""
import contextlib
import dataclasses
import json
import math
import os
import zlib
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Mapping, Optional, Tuple

import numpy as np
import paddle

from ernie_doc import resources
from ernie_doc.data.splits import Batch, Evaluation, Split
from ernie_doc.errors import ConfigError, DataError
from ernie_doc.hub import home
from ernie_doc.kinds.base import Config, Task, data_dir_required
from ernie_doc.kinds.document import MemoryPlan, check_memory
from ernie_doc.lm.data import Corpus, LMStreams, Vocabulary, load_corpus
from ernie_doc.lm.model import TransformerXLConfig, TransformerXLLM, load_lm_config

EVAL_DEFAULTS = {"eval_tgt_len": None, "eval_mem_len": None, "eval_clamp_len": None,
                 "eval_same_length": None, "eval_ext_len": None}
VOCAB_FILE = "vocab.txt"


def default_cache_dir(files, options):
    """One folder per set of token files and vocabulary options."""
    root = os.environ.get("ERNIE_DOC_CACHE") or home()   # the cache of released models too
    key = json.dumps({"files": {k: os.path.abspath(v) for k, v in sorted(files.items())},
                      "vocab": [options[k] for k in ("vocab", "vocab_from", "min_freq",
                                                     "max_size")]}, sort_keys=True)
    return os.path.join(root, "lm", f"{zlib.crc32(key.encode()):08x}")


def _rank_rows(batch, rows):
    """This rank's rows (a slice) of an LMBatch → the model's inputs."""
    out = {"input_ids": batch.input[rows], "target": batch.target[rows]}
    if batch.positions is not None:
        out["positions"] = batch.positions[:, rows]
    return out


class LMTrainStream(Split):
    """This rank's endless training stream: micro-step m reads batch m mod len(streams) of pass
    m // len(streams). Batches: input_ids [B, L], target [B, T], reset_memory [B],
    positions [3, B, L]."""
    name = "train"
    endless = True

    def __init__(self, data: np.ndarray, positions: Optional[np.ndarray], rows: int, rank: int,
                 world: int, tgt_len: int, ext_len: int):
        self.streams = LMStreams(data, rows * world, tgt_len, ext_len, positions)
        self.rows = slice(rank * rows, (rank + 1) * rows)

    def __len__(self) -> int:
        """Micro-steps in one pass over the corpus."""
        return len(self.streams)

    def batch(self, micro: int) -> Tuple[int, Batch]:
        epoch, index = divmod(micro, len(self.streams))
        out = _rank_rows(self.streams.batch(index), self.rows)
        out["reset_memory"] = np.full(self.rows.stop - self.rows.start, index == 0)
        return epoch, out

    def num_steps(self, epoch: int) -> Optional[int]:
        return None

    def batches(self, epoch: int = 0, start: int = 0) -> Iterator[Tuple[int, Batch]]:
        micro = start
        while True:
            yield self.batch(micro)
            micro += 1

    def describe(self) -> str:
        return f"train {len(self)} micro-steps per pass"

    def layout(self) -> Dict[str, int]:
        s = self.streams
        return {"bsz": s.bsz, "tgt_len": s.tgt_len, "ext_len": s.ext_len, "n_step": s.n_step}

    def state_array(self) -> np.ndarray:
        """Not a position (the micro-step is one) but the stream's layout, so that a resume
        with other data, batch size, ranks or tgt_len is refused."""
        return np.frombuffer(json.dumps(self.layout()).encode("utf-8"), dtype=np.uint8)

    def load_state_array(self, array: np.ndarray) -> None:
        saved = json.loads(bytes(np.asarray(array, dtype=np.uint8)).decode("utf-8"))
        if saved != self.layout():
            raise DataError(f"the checkpoint's training stream was {saved}, this run's is "
                            f"{self.layout()}: resume with the same data, batch_size, ranks "
                            f"and tgt_len")


class LMEvalStream(Split):
    """A split read once in order under the eval protocol, `rows` rows per rank of a
    rows×world stream; `protocol(model)` switches the model's lengths for the reading."""

    def __init__(self, name: str, data: np.ndarray, positions: Optional[np.ndarray], rows: int,
                 rank: int, world: int, lengths: Dict[str, Any], oov: int):
        self.name, self.lengths, self.oov = name, lengths, oov
        self.streams = LMStreams(data, rows * world, lengths["tgt_len"], lengths["ext_len"],
                                 positions)
        self.rows = slice(rank * rows, (rank + 1) * rows)

    def num_steps(self, epoch: int = 0) -> int:
        return len(self.streams)

    def batches(self, epoch: int = 0, start: int = 0) -> Iterator[Tuple[int, Batch]]:
        for index in range(start, len(self.streams)):
            yield 0, _rank_rows(self.streams.batch(index), self.rows)

    @contextlib.contextmanager
    def protocol(self, model: paddle.nn.Layer) -> Iterator[None]:
        saved = model.config
        model.config = dataclasses.replace(
            saved, **{k: v for k, v in self.lengths.items() if k != "tgt_len"})
        try:
            yield
        finally:
            model.config = saved

    def evaluation(self, task: Any) -> "LMEvaluation":
        return LMEvaluation(self)


class LMEvaluation(Evaluation):
    """Negative log-likelihood summed over every predicted token of a stream, over ranks →
    perplexity, loss (nats per token), bits per token."""

    def __init__(self, split: LMEvalStream):
        self.split, self.nll, self.tokens = split, 0.0, 0.0

    def add(self, batch: Batch, tensors: Dict[str, Any], out: Any) -> None:
        nll = out.nll.astype("float32")
        self.nll += float(nll.sum())
        self.tokens += float(np.prod(nll.shape))

    def part(self) -> Tuple[float, float]:
        return self.nll, self.tokens

    def finish(self, parts: List[Any]) -> Tuple[Dict[str, float], Optional[List[dict]]]:
        nll, tokens = sum(p[0] for p in parts), sum(p[1] for p in parts)
        loss = nll / tokens if tokens else float("nan")
        return {"ppl": math.exp(min(loss, 50.0)), "loss": loss, "bpt": loss / math.log(2),
                "tokens": int(tokens), "unk_in_split": int(self.split.oov)}, None


class LanguageModelTask(Task):
    """Word-level language modelling with the memory-enhanced Transformer-XL: its own model,
    vocabulary and token streams (check_data reads them before any collective call)."""
    streaming = True        # the train split is a stream run for max_steps
    uses_tokenizer = False
    scores_tokens = True
    refused = {"max_doc_tokens": "does not apply to language_model (it reads token streams)"}
    main_metric = "ppl"
    metric_names = ("ppl", "loss", "bpt", "tokens", "unk_in_split")
    option_defaults = EVAL_DEFAULTS

    def __init__(self, cfg: Config, reader: Any):
        super().__init__(cfg, reader)
        if not callable(getattr(reader, "options", None)):
            raise ConfigError(f"{cfg.source}: task {cfg.task!r}: its reader must define "
                              f"options() and read() (see tasks/wikitext103/reader.py)")
        self.reader_options = reader.options(dict(cfg.reader))
        if cfg.layer_decay != 1.0:
            raise ConfigError(f"{cfg.source}: layer_decay: not supported for kind "
                              f"language_model (use 1.0)")
        for key, value in self.options.items():
            if value is None:
                continue
            low = 1 if key == "eval_tgt_len" else (-1 if key == "eval_clamp_len" else 0)
            if key == "eval_same_length":
                if not isinstance(value, bool):
                    raise self.option_error(key, f"must be true, false or null, got {value!r}")
            elif not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise self.option_error(key, f"must be an integer >= {low} or null, got "
                                             f"{value!r}")
        for split in list(cfg.eval_splits) + list(cfg.test_splits):
            if split == "train":
                raise ConfigError(f"{cfg.source}: eval_splits/test_splits: 'train' is the "
                                  f"training stream; name a split of reader.files")
        try:
            self.config = load_lm_config(cfg.init_checkpoint or cfg.model, **cfg.model_overrides)
        except ValueError as e:
            raise ConfigError(f"{cfg.source}: model / model_overrides: {e}") from None
        self.corpus: Optional[Corpus] = None   # check_data reads it

    # -- data (before any collective call: every rank fails alike) ----------------------------
    def split_files(self) -> Dict[str, Any]:
        names = [] if self.cfg.eval_only else ["train"]
        names += list(self.cfg.eval_splits) + list(self.cfg.test_splits)
        opts = dict(self.cfg.reader)
        with data_dir_required(self.cfg):
            return {s: self.reader.read(self.cfg.data_dir, s, opts)
                    for s in dict.fromkeys(names)}

    def check_data(self, world: int) -> Corpus:
        """Find, encode (or load from the cache) and check every split; the vocabulary comes
        from reader.vocab, the init checkpoint, or is counted on reader.vocab_from."""
        o = self.reader_options
        self.lengths = self.eval_lengths()   # a bad protocol fails before data is read
        files = self.split_files()
        vocab_path = o["vocab"]
        if vocab_path is None and self.cfg.init_checkpoint:
            vocab_path = os.path.join(self.cfg.init_checkpoint, VOCAB_FILE)
            if not os.path.isfile(vocab_path):
                raise DataError(f"{self.cfg.init_checkpoint}: no {VOCAB_FILE} (give "
                                f"reader.vocab)")
        cache = o["cache_dir"]
        if cache is None:
            cache = default_cache_dir(files, o)
        elif cache is False:
            cache = None
        self.cache_dir = cache
        corpus = load_corpus(files, vocab_path, cache,
                             positions="global" if self.config.segment_positions else None,
                             vocab_from=o["vocab_from"], min_freq=o["min_freq"],
                             max_size=o["max_size"])
        self.vocab_file = vocab_path or (os.path.join(cache, VOCAB_FILE) if cache else None)
        V = len(corpus.vocab)
        if self.cfg.init_checkpoint and self.config.vocab_size != V:
            raise DataError(f"{vocab_path}: {V} tokens, the checkpoint's model has "
                            f"vocab_size {self.config.vocab_size}")
        try:
            self.config = dataclasses.replace(self.config, vocab_size=V)
        except ValueError as e:   # e.g. cutoffs beyond a small vocabulary
            raise ConfigError(f"{self.cfg.source}: model_overrides: {e} (the vocabulary has "
                              f"{V} tokens)") from None
        rows = {} if self.cfg.eval_only else {"train": self.cfg.batch_size * world}
        for split in list(self.cfg.eval_splits) + list(self.cfg.test_splits):
            rows[split] = (self.cfg.eval_batch_size or self.cfg.batch_size) * world
        for split, n in rows.items():
            tokens = len(corpus.data[split])
            if tokens < 2 * n:
                raise DataError(f"{files[split]}: {tokens} tokens, too few for {n} rows of "
                                f"the {split} stream (batch size x ranks; 2 tokens per row)")
        self.files, self.corpus = files, corpus
        return corpus

    def eval_lengths(self) -> Dict[str, Any]:
        """The eval protocol: tgt_len, mem_len, clamp_len, same_length, ext_len."""
        c, o = self.config, self.options
        tgt = o["eval_tgt_len"] or c.tgt_len
        mem = o["eval_mem_len"]
        if mem is None:
            mem = max(0, c.mem_len + c.tgt_len - tgt) if c.mem_len else 0
        clamp = c.clamp_len if o["eval_clamp_len"] is None else o["eval_clamp_len"]
        same = c.same_length if o["eval_same_length"] is None else o["eval_same_length"]
        ext = c.ext_len if o["eval_ext_len"] is None else o["eval_ext_len"]
        if same and mem < 1:
            raise self.option_error("eval_same_length", "needs an eval mem_len >= 1")
        if ext >= tgt:
            raise self.option_error("eval_ext_len", f"{ext} must be below eval_tgt_len {tgt}")
        return {"tgt_len": tgt, "mem_len": mem, "clamp_len": clamp, "same_length": same,
                "ext_len": ext}

    # -- what the trainer builds ----------------------------------------------------------------
    def read_inputs(self, run: Any) -> Optional[str]:
        return None   # check_data has read the corpus; no tokenizer

    def memory_plan(self, config: Any = None) -> MemoryPlan:
        c = config or self.config
        return (lambda n: TransformerXLLM(dataclasses.replace(c, n_layer=n)), c.n_layer,
                c.d_model, c.n_head, c.tgt_len, c.mem_len)

    def check_eval_memory(self, rows: int, device: Optional[str] = None,
                          mem_len: Optional[int] = None, what: Optional[str] = None) -> None:
        """Refuse (ConfigError naming the eval protocol's keys, or `what`) an evaluation of
        `rows` rows (with memory `mem_len`, None: the protocol's) whose memory estimate
        exceeds what `device` has, before anything is built."""
        c, lengths = self.config, self.eval_lengths()
        mem = lengths["mem_len"] if mem_len is None else mem_len
        params = resources.parameter_count(self.memory_plan()[0], c.n_layer)
        parts = resources.training_parts(params, c.n_layer, rows, lengths["tgt_len"], mem,
                                         c.d_model, c.n_head, training=False)
        what = what or f"{self.cfg.source}: task_options eval_mem_len {mem}"
        resources.check_fits(parts, f"{what}, eval_tgt_len {lengths['tgt_len']}, {rows} rows "
                                    f"of {params:,} parameters", device)

    def build_model(self, run: Any) -> TransformerXLLM:
        """The Transformer-XL from init_checkpoint, or new from the config."""
        check_memory(run, self.memory_plan())
        paddle.seed(self.cfg.seed)   # the same initial weights on every rank
        if self.cfg.init_checkpoint:
            model = TransformerXLLM.from_pretrained(self.cfg.init_checkpoint,
                                                    **self.cfg.model_overrides)
        else:
            model = TransformerXLLM(self.config)
        self.params = sum(int(np.prod(p.shape)) for p in model.parameters())
        return model

    def read(self) -> Corpus:
        """The corpus check_data read (prepare calls check_data before the rest)."""
        assert self.corpus is not None, "check_data reads the corpus first"
        return self.corpus

    def build_splits(self, run: Any) -> Tuple[Optional[Split], Dict[str, Split]]:
        corpus = self.read()
        c, data, pos = self.config, corpus.data, corpus.positions
        cfg, rank, world = self.cfg, run.rank, run.world
        train = None
        if not cfg.eval_only:
            train = LMTrainStream(data["train"], pos.get("train"), cfg.batch_size, rank, world,
                                  c.tgt_len, c.ext_len)
        rows = cfg.eval_batch_size or cfg.batch_size
        if cfg.eval_splits or cfg.test_splits:
            self.check_eval_memory(rows)
        evaluated: Dict[str, Split] = {
            split: LMEvalStream(split, data[split], pos.get(split), rows, rank, world,
                                self.lengths, corpus.oov[split])
            for split in list(cfg.eval_splits) + list(cfg.test_splits)}
        self.train = train
        return train, evaluated

    def describe(self, run: Any) -> List[str]:
        c, cfg, device, world, corpus = self.config, self.cfg, run.device, run.world, self.read()
        counts = ", ".join(f"{s} {len(corpus.data[s]):,} tokens"
                           + (f" ({corpus.oov[s]:,} <unk>)" if corpus.oov[s] else "")
                           for s in self.files)
        steps = (f"{len(self.train)} micro-steps per pass over train" if self.train is not None
                 else "evaluation only")
        return [f"task {cfg.task} (language_model): vocabulary {len(corpus.vocab):,}; "
                f"{counts}; cache {self.cache_dir or 'off'}",
                f"model: Transformer-XL L={c.n_layer} d={c.d_model} heads={c.n_head} "
                f"d_inner={c.d_inner} params={self.params:,} recurrence={c.recurrence} "
                f"segment_positions={c.segment_positions} tgt_len={c.tgt_len} "
                f"mem_len={c.mem_len} on {device} x{world}; {steps}",
                "eval protocol: " + " ".join(f"{k}={v}" for k, v in self.lengths.items())]

    # -- steps ------------------------------------------------------------------------------------
    def init_carry(self, model: paddle.nn.Layer, rows: int) -> Dict[str, Any]:
        return {}   # no memory yet (Transformer-XL's start); zeros would be attended to

    def forward(self, model: paddle.nn.Layer, batch: Dict[str, Any], carry: Dict[str, Any]
                ) -> Tuple[Any, Dict[str, Any]]:
        memories, memory_positions = carry.get("memories"), carry.get("memory_positions")
        if "reset_memory" in batch and bool(batch["reset_memory"].all()):
            memories = memory_positions = None   # a new pass over the corpus
        out = model(batch["input_ids"], batch["target"], memories, None,
                    batch.get("positions"), memory_positions)
        carry = {"memories": out.memories, "memory_positions": out.memory_positions}
        return out, {k: v for k, v in carry.items() if v is not None}

    def train_weight(self, batch: Dict[str, np.ndarray]) -> np.ndarray:
        return np.ones(len(batch["input_ids"]), dtype=bool)

    def batch_tokens(self, batch: Dict[str, np.ndarray]) -> int:
        return int(batch["target"].size)

    def loss(self, out: Any, batch: Dict[str, Any], weight: Optional[paddle.Tensor] = None
             ) -> paddle.Tensor:
        """Mean negative log-likelihood per predicted token (every rank predicts as many)."""
        return out.nll.mean()

    def train_loss(self, out: Any, batch: Dict[str, Any], weight: paddle.Tensor
                   ) -> Tuple[paddle.Tensor, Dict[str, Tuple[float, float]]]:
        nll = out.nll.astype("float32")
        return nll.mean(), {"nll": (float(nll.sum()), float(np.prod(nll.shape)))}

    def combine_metrics(self, means: Dict[str, float]) -> Dict[str, float]:
        return {"ppl": math.exp(min(means["nll"], 50.0))} if "nll" in means else {}

    def better(self, metric: str, value: float, best: float) -> bool:
        return value < best if metric in ("ppl", "loss", "bpt") else value > best

    def load_saved(self, run: Any, directory: str,
                   load_model: Optional[Callable[[Any], Any]] = None) -> None:
        """The vocabulary is the tokenizer; the run's eval_batch_size rows by default."""
        run.eval_rows = run.eval_rows or run.batch_rows(evaluation=True)
        self.check_eval_memory(run.eval_rows, "gpu" if run.device == "gpu" else "cpu")
        run.tokenizer = load_vocabulary(directory)
        run.model = TransformerXLLM.from_pretrained(directory)

    @classmethod
    def model_config_keys(cls) -> Tuple[str, List[str]]:
        return "TransformerXLConfig", sorted(f.name for f in dataclasses.fields(
            TransformerXLConfig))

    @classmethod
    def saved_model_config(cls, folder: str) -> Dict[str, Any]:
        return dataclasses.asdict(load_lm_config(folder))

    @classmethod
    def saved_settings(cls, values: Dict[str, Any], config: Mapping[str, Any]) -> None:
        """The model config from the folder alone (its lm_config.json holds model_overrides),
        no tokenizer, and the run's eval rows: another number cuts the stream otherwise, reads
        other context and gives another perplexity."""
        values["model_overrides"] = {}
        del values["tokenizer"]
        values["eval_batch_size"] = config["eval_batch_size"] or config["batch_size"]

    @classmethod
    def saved_reader(cls, record: Mapping[str, Any], task: str, documents: Any = None,
                     folder: str = "") -> Any:
        return documents or OptionsReader()

    def model_files(self, atomic_entry: Callable[[str, str], ContextManager[str]]) -> List[str]:
        if self.vocab_file is None:   # no cache: keep a copy in the run's folder
            with atomic_entry(self.cfg.output_dir, VOCAB_FILE) as tmp:
                self.read().vocab.save(tmp)   # listed in the run's manifest first
            self.vocab_file = os.path.join(self.cfg.output_dir, VOCAB_FILE)
        return [self.vocab_file]


class OptionsReader:
    """The reader of a saved language model: its options only."""

    @staticmethod
    def options(given: Dict[str, Any]) -> Dict[str, Any]:
        return dict(given)

    def read(self, data_dir: str, split: str, options: Dict[str, Any]) -> list:
        raise DataError("a saved language model reads its documents from the predict input")


def load_vocabulary(directory):
    """The vocabulary saved beside a trained language model."""
    return Vocabulary.load(os.path.join(directory, VOCAB_FILE))
