"""Every run-config key, once: TrainConfig, the frozen dataclass of a run's config, gives each
key its type, default and meaning; DEFAULTS, MEANINGS and `--help-config` are read from it.
run_config loads and checks a config into it; the task kinds take it (kinds.base.Config)."""
import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, List, Optional, Union


def _key(default: Any, meaning: str) -> Any:
    """A run-config key of TrainConfig: its default and its meaning (`--help-config`)."""
    metadata = {"default": default, "meaning": meaning}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class TrainConfig:
    """A run's config, checked (load_config): every key with its default and meaning, in the
    order `--help-config` lists them and run_config.yaml / task.json keep. `source` names where
    it came from; `user_keys` the keys the user set, dotted for an entry of a free-form map:
    "task_options.n_best". A loaded config names its task and resolves doc_prediction."""
    task: str = _key(None, "the task: a folder tasks/<task>/ with reader.py (--list-tasks)")
    kind: str = _key("classification", "a registered kind: classification, span, "
                                       "multiple_choice, pair_matching, pretraining, "
                                       "language_model, or a task's own (hotpotqa, keyphrase)")
    data_dir: Union[str, List[str]] = _key("", "the task's data folder (pretraining: a list of "
                                               "corpus paths)")
    output_dir: str = _key("", 'where the run writes; "" = output/<task>')
    overwrite_output_dir: bool = _key(False, "replace a previous run in output_dir (only what "
                                             "its manifest lists)")
    reader: Dict[str, Any] = _key({}, "options for the task's reader (reader.dev_ratio=0.2 ...)")
    task_options: Dict[str, Any] = _key({}, "options of the task kind (span: max_query_len ...)")
    max_examples: Dict[str, int] = _key({}, "{split: N}: N examples drawn by seed (stratified by "
                                            "label, kept in file order) for quick runs; "
                                            "pretraining: the first N")
    max_doc_tokens: int = _key(0, "read at most this many tokens of a document's text (0 = all); "
                                  "cut documents are counted and logged")
    model: str = _key("ernie-doc-small", "preset name, config json, checkpoint directory, URL or "
                                         ".tar.gz (a released name here is its config: no "
                                         "weights)")
    init_checkpoint: str = _key("", 'weights: a released name, a URL, a .tar.gz, a directory; "" '
                                    "= from scratch")
    model_source: str = _key("official", "a released name's weights: official | paddlenlp")
    allow_partial_checkpoint: bool = _key(False, "load init_checkpoint even when encoder tensors "
                                                 "are missing or unknown ones are left over")
    eval_only: bool = _key(False, "no training: evaluate init_checkpoint on the eval_splits and "
                                  "test_splits given (none given: the config's); a fine-tuned "
                                  "folder reads as its task.json says")
    model_overrides: Dict[str, Any] = _key({}, "ErnieDocConfig keys (recurrence, memory_len, "
                                               "dropouts ...)")
    tokenizer: str = _key("", 'a released name, a directory or a file; "" = init_checkpoint\'s, '
                              "else model's; train = SentencePiece on the train split")
    tokenizer_vocab_size: int = _key(8000, "vocabulary size of a tokenizer trained with "
                                           "tokenizer=train")
    max_seq_len: int = _key(512, "tokens per segment, special tokens included")
    stride: Optional[int] = _key(None, "window advance in tokens; null = memory_len (official)")
    segment_layout: str = _key("cls_last", "where [CLS] sits in a segment: cls_last | cls_first")
    retro_feed: bool = _key(True, "read every document twice (skim, then retrospective)")
    train_skim: bool = _key(False, "also train on the skim pass")
    loss_segments: str = _key("all", "which final-pass segments train: all (official) | last "
                                     "(the paper's appendix: the last segment's [CLS])")
    doc_prediction: str = _key(None, "document = mean of segment probabilities (official), or "
                                     "the last segment's: mean | last; null = last when "
                                     "loss_segments is last, else mean")
    batch_size: int = _key(16, "examples per rank (batch_unit)")
    eval_batch_size: Optional[int] = _key(None, "examples per rank in evaluation; null = "
                                                "batch_size")
    batch_unit: str = _key("examples", "what batch sizes count: examples (a C3 question = "
                                       "num_choices rows, a CAIL triplet = 2; PaddleNLP's) | "
                                       "rows (memory streams)")
    epochs: int = _key(3, "passes over the train split")
    max_steps: int = _key(0, "stop after this many optimizer steps (0 = run epochs); a streamed "
                             "corpus needs it")
    learning_rate: float = _key(7e-05, "peak learning rate")
    lr_schedule: str = _key("linear", "linear (warmup, decay to 0; PaddleNLP's) | official (the "
                                      "official code's: warmup, a jump, decay to 0; constant "
                                      "without warmup) | cosine (Transformer-XL's)")
    warmup_proportion: float = _key(0.1, "warm up over this fraction of the steps")
    warmup_steps: int = _key(0, "> 0: warm up over this many steps instead of the proportion")
    weight_decay: float = _key(0.01, "AdamW weight decay")
    layer_decay: float = _key(1.0, "layer-wise LR decay: layer l of L gets decay^(L-l), "
                                   "embeddings decay^(L+1)")
    layer_decay_rule: str = _key("official", "official: layer_decay scales the Adam step only, "
                                             "weight decay uses the global LR | paddlenlp: it "
                                             "scales both")
    max_grad_norm: Optional[float] = _key(None, "clip gradients by their global norm (0 = no "
                                                "clipping); null = the official rule: 1.0 when "
                                                "the run has no warmup steps, else none")
    adam_epsilon: Optional[float] = _key(None, "AdamW epsilon; null = the official rule: 1e-6 "
                                               "when the run has no warmup steps, else 1e-8")
    grad_accum_steps: int = _key(1, "micro-batches per optimizer step")
    amp: Union[bool, str] = _key(False, "mixed precision: false | true (= fp16) | fp16 | bf16 "
                                        "(GPU; CPU bf16 with compile)")
    recompute: bool = _key(False, "recompute each layer's activations in backward (saves memory)")
    compile: bool = _key(False, "run the training forward as a captured program "
                                "(paddle.jit.to_static)")
    flush_denormals: bool = _key(True, "CPU: denormal floats (< 1.2e-38) read and written as 0")
    seed: int = _key(1, "seed of weights, dropout, shuffling and max_examples sampling")
    shuffle: bool = _key(True, "shuffle the train documents each epoch")
    eval_splits: List[str] = _key(["dev"], "splits evaluated during training; the first picks "
                                           "the best checkpoint")
    test_splits: List[str] = _key([], "evaluated once with the best checkpoint at the end")
    eval_steps: int = _key(0, "also evaluate every N optimizer steps (0 = at epoch ends)")
    eval_every_epoch: bool = _key(True, "evaluate at the end of every epoch")
    metrics: List[str] = _key(["accuracy", "f1"], "classification: accuracy, f1 (binary / "
                                                  "macro), macro_f1")
    main_metric: Optional[str] = _key(None, "the metric that picks the best checkpoint; null = "
                                            "the first of metrics")
    positive_label: Any = _key(None, "the class binary F1 scores; null = label id 1")
    save_steps: int = _key(0, "resumable checkpoint every N steps (0 = at evaluations)")
    keep_checkpoints: int = _key(1, "resumable checkpoints kept")
    logging_steps: int = _key(10, "a log line every N optimizer steps (0 = none)")
    stop_at_step: int = _key(0, "stop after this step as if interrupted (--resume continues)")
    device: str = _key("auto", "auto | cpu | gpu")
    threads: int = _key(0, "CPU math threads (0 = paddle's default)")
    peer_timeout: int = _key(20, "several ranks: a rank whose peer shows no sign of life for "
                                 "this many seconds exits with one line naming it (0 = wait as "
                                 "paddle does)")
    peer_join_timeout: int = _key(120, "several ranks: a rank waits this many seconds for the "
                                       "others to join at the start, then exits with one line "
                                       "naming those that did not (0 = wait as paddle does)")
    progress: bool = _key(True, "progress bars (false: none; ERNIE_DOC_PROGRESS=0 turns every "
                                "bar off)")
    source: str = field(default="config", compare=False)
    user_keys: FrozenSet[str] = field(default=frozenset(), compare=False)

    def as_dict(self) -> Dict[str, Any]:
        """Every key → a copy of its value, in the table's order (what run_config.yaml and
        task.json write)."""
        return {f.name: copy.deepcopy(getattr(self, f.name)) for f in KEYS}


KEYS = tuple(f for f in dataclasses.fields(TrainConfig) if "meaning" in f.metadata)
DEFAULTS = {f.name: f.metadata["default"] for f in KEYS}
MEANINGS = {f.name: f.metadata["meaning"] for f in KEYS}
# The groups `--help-config` shows the keys in: a group's first key → its name.
GROUP_STARTS = {"task": "what to run", "model": "model, weights, tokenizer",
                "max_seq_len": "segments and reading", "batch_size": "optimisation",
                "eval_splits": "evaluation, checkpoints, logging"}
