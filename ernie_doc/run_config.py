"""Fine-tuning run configuration: a task's config.yaml plus `--set key=value` overrides, loaded
and checked into a TrainConfig.

Every key, its default and its meaning are listed once, in run_keys.TrainConfig (`ernie-doc
finetune --help-config` prints them). Unknown keys (in the file or in an override) are an error
naming the file:line or the key and the nearest keys. `model_overrides` (ErnieDocConfig keys,
checked when the model is built) and `reader` (the task reader's options, checked by the reader)
are free-form dicts; `--set reader.dev_ratio=0.2` reaches inside them."""
import copy
import difflib
import json
import math
import os
from typing import Any, Dict, FrozenSet, Iterator, NoReturn, TextIO, Tuple, Union

import yaml

from ernie_doc.config import integer_problem
from ernie_doc.distributed import gpu_problem
from ernie_doc.errors import ConfigError
from ernie_doc.kinds import kind_class, kind_name
from ernie_doc.kinds.folders import missing_key
from ernie_doc.precision import check_amp_value
from ernie_doc.run_keys import DEFAULTS, GROUP_STARTS, MEANINGS, TrainConfig
from ernie_doc.utils import (MAX_INT_DIGITS, clip, control_character, long_integer_problem,
                             regular_file_problem, threads_problem)

# The keys that decide how a model reads a document: a fine-tuned folder's task.json holds the
# run's, and both its prediction and its evaluation (eval_only) read with them
# (assemble.trained_reading). A map is read entry by entry; of `reader`, only the options that
# change the text the model reads are (a task's reader.py documents each): the others say where
# the data is or which examples a split holds (file, files, dev_ratio, split_seed, labels ...),
# which belong to the data evaluated.
READING_KEYS = ("max_seq_len", "stride", "segment_layout", "retro_feed", "train_skim",
                "loss_segments", "doc_prediction", "max_doc_tokens", "task_options",
                "model_overrides", "tokenizer",
                "reader.remove_spaces",        # iflytek, thucnews: spaces dropped from the text
                "reader.remove_urls",          # openkp: URLs dropped from the words
                "reader.max_docs",             # dureader: documents joined into the context
                "reader.max_evidence_chars",   # triviaqa: evidence cut to this many characters
                "reader.special_ids")          # longdep: the [PAD] / [CLS] / [SEP] ids
# The names a Hugging Face / PaddleNLP user types by habit → ours (suggest_keys).
KEY_ALIASES = {
    "num_train_epochs": "epochs", "num_epochs": "epochs",
    "per_device_train_batch_size": "batch_size", "train_batch_size": "batch_size",
    "per_device_eval_batch_size": "eval_batch_size",
    "gradient_accumulation_steps": "grad_accum_steps", "lr": "learning_rate",
    "lr_scheduler_type": "lr_schedule", "warmup_ratio": "warmup_proportion",
    "max_seq_length": "max_seq_len", "max_length": "max_seq_len",
    "model_name_or_path": "init_checkpoint", "layerwise_decay": "layer_decay",
    "fp16": "amp", "bf16": "amp", "gradient_checkpointing": "recompute",
    "save_total_limit": "keep_checkpoints", "metric_for_best_model": "main_metric",
    "disable_tqdm": "progress", "max_train_samples": "max_examples.train",
    "max_eval_samples": "max_examples.dev", "do_eval": "eval_only",
    "evaluation_strategy": "eval_steps", "eval_strategy": "eval_steps",
    "use_amp": "amp", "no_cuda": "device", "use_cpu": "device",
    "memory_length": "model_overrides.memory_len", "resume_from_checkpoint": "--resume OUTPUT_DIR",
}


def is_reading_key(key: str) -> bool:
    """Whether `key` (dotted: an entry of a map, "reader.remove_spaces") is one of READING_KEYS
    or an entry of a map that is wholly one ("model_overrides.memory_len")."""
    return key in READING_KEYS or key.split(".")[0] in READING_KEYS


def suggest_keys(key: str) -> str:
    """The hint an unknown key's error ends with: " (did you mean: epochs?)" for a habitual
    name or a near miss (difflib), else ""; a key that is no string gets none."""
    if not isinstance(key, str):
        return ""
    names = [KEY_ALIASES[key]] if key in KEY_ALIASES else []
    names += [n for n in difflib.get_close_matches(key, list(DEFAULTS), n=3, cutoff=0.6)
              if n not in names]
    return f" (did you mean: {', '.join(names)}?)" if names else ""


def unknown_key(where: str, key: Any) -> ConfigError:
    """The one-line error for a key that is not a run-config key: where it was given, the
    key, the nearest keys, and where the list is."""
    return ConfigError(f"{where}: unknown key {clip(repr(key))}{suggest_keys(key)}; "
                       f"--help-config lists the keys")


def help_config() -> str:
    """Every run-config key with its default (as YAML) and its meaning, by group: what
    `ernie-doc finetune --help-config` prints."""
    width = max(map(len, DEFAULTS))
    shown = {name: json.dumps(value) for name, value in DEFAULTS.items()}
    value_width = max(map(len, shown.values()))
    lines = ["run-config keys: a config.yaml's top level, or --set key=value (values are "
             "YAML; dotted keys reach into reader, task_options, model_overrides and "
             "max_examples: --set reader.dev_ratio=0.2 max_examples.train=400)"]
    for name, meaning in MEANINGS.items():
        if name in GROUP_STARTS:
            lines += ["", f"{GROUP_STARTS[name]}:"]
        lines.append(f"  {name:<{width}}  {shown[name]:<{value_width}}  {meaning}")
    return "\n".join(lines) + "\n"

CHOICES = {
    "segment_layout": ("cls_last", "cls_first"),
    "loss_segments": ("all", "last"),
    "doc_prediction": ("mean", "last"),
    "lr_schedule": ("linear", "official", "cosine"),
    "device": ("auto", "cpu", "gpu"),
    "model_source": ("official", "paddlenlp"),
    "batch_unit": ("examples", "rows"),
    "layer_decay_rule": ("official", "paddlenlp"),
}
FREE_DICTS = ("reader", "model_overrides", "task_options", "max_examples")
# Integer keys → the least value each takes (the greatest is MAX_DIM); seed and threads are
# checked below; null means the default in stride and eval_batch_size.
INTEGER_KEYS = {
    **dict.fromkeys(("batch_size", "epochs", "max_seq_len", "grad_accum_steps",
                     "tokenizer_vocab_size", "stride", "eval_batch_size"), 1),
    **dict.fromkeys(("eval_steps", "save_steps", "logging_steps", "stop_at_step",
                     "keep_checkpoints", "max_steps", "warmup_steps", "max_doc_tokens",
                     "peer_timeout", "peer_join_timeout"), 0),
}
NULLABLE_KEYS = ("stride", "eval_batch_size")
# Numbers whose null is the official code's value for the run's warmup (training.optim.
# clip_and_epsilon): known only once the run has counted its steps.
OFFICIAL_RULE_KEYS = ("max_grad_norm", "adam_epsilon")
# Lists of names: each name at most once, and at most this many (a task has a few splits and
# metrics; each one listed is a full evaluation pass).
NAME_LISTS = ("eval_splits", "test_splits", "metrics")
MAX_NAMES = 64


def _key_lines(path):
    """Top-level key → line number in a yaml file (for error messages)."""
    lines = {}
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if line[:1] not in (" ", "\t", "#", "\n", "-") and ":" in line:
                lines.setdefault(line.split(":", 1)[0].strip(), i)
    return lines


MAX_YAML_DEPTH = 100
MAX_CONFIG_CHARS = 1 << 18   # a config file's size (the task configs are about 2 KB)


class _StrictLoader(yaml.SafeLoader):
    """yaml.safe_load, except these are errors at their file:line: a duplicated key, an anchor
    or alias (a "billion laughs" risk; configs need none), nesting deeper than MAX_YAML_DEPTH."""

    def compose_node(self, parent, index):
        event = self.peek_event()
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            sign = "*" if isinstance(event, yaml.AliasEvent) else "&"
            raise yaml.composer.ComposerError(
                None, None, f"{sign}{clip(anchor, 40)}: anchors and aliases are not read "
                            f"(write the value out)", event.start_mark)
        self.depth = getattr(self, "depth", 0) + 1
        try:
            if self.depth > MAX_YAML_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nested deeper than {MAX_YAML_DEPTH} levels",
                    event.start_mark)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_yaml_int(self, node):
        """An integer of at most MAX_INT_DIGITS digits, else a ConstructorError at its line
        (int() refuses 4300 digits with a bare ValueError, and takes quadratic time below)."""
        digits = sum(c.isalnum() for c in node.value)   # 0x.., 0b.. and 1:30 forms too
        value = super().construct_yaml_int(node) if digits <= MAX_INT_DIGITS else None
        if value is None or abs(value) >= 10 ** MAX_INT_DIGITS:
            size = digits if value is None else len(str(abs(value)))
            raise yaml.constructor.ConstructorError(
                None, None, long_integer_problem(size), node.start_mark)
        return value

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:   # an unhashable key: let PyYAML report it
                break
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {clip(repr(key), 80)} (first on line {first})",
                    key_node.start_mark)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)


class _PlainDumper(yaml.SafeDumper):
    """yaml.safe_dump, except that a value met twice is written out twice, not as an alias
    (which parse_yaml would refuse when the file is read back)."""

    def ignore_aliases(self, data):
        return True


def parse_yaml(stream: Union[str, TextIO]) -> Any:
    """YAML text (or stream) → its value via _StrictLoader (all YAML the package reads);
    yaml.YAMLError with problem_mark for what it refuses."""
    return yaml.load(stream, Loader=_StrictLoader)


def dump_yaml(values) -> str:
    """`values` as YAML text that parse_yaml reads back (keys in their order, no aliases)."""
    return yaml.dump(values, Dumper=_PlainDumper, sort_keys=False)


def load_yaml(path):
    problem = regular_file_problem(path, "config file")   # a FIFO would block the read
    if problem:
        raise ConfigError(problem)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(MAX_CONFIG_CHARS + 1)
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    if len(text) > MAX_CONFIG_CHARS:   # PyYAML reads ~100 KB/s: refused before it starts
        raise ConfigError(f"{path}: more than {MAX_CONFIG_CHARS:,} characters; a config file "
                          "is a page of settings")
    try:
        values = parse_yaml(text) or {}
    except yaml.reader.ReaderError as e:   # a character YAML refuses (NUL, other controls)
        line = text.count("\n", 0, e.position) + 1
        char = e.character if isinstance(e.character, int) else ord(e.character)
        raise ConfigError(f"{path}:{line}: invalid YAML (character U+{char:04X}: {e.reason})") \
            from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = " ".join(str(getattr(e, "problem", None) or e).split())   # one line
        raise ConfigError(f"{path}{line}: invalid YAML ({clip(problem)})") from None
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: expected a mapping of keys to values")
    lines = _key_lines(path)
    for key in values:
        if key not in DEFAULTS:
            raise unknown_key(f"{path}:{lines.get(key, '?')}", key)
    return values


def parse_override(text):
    """'a.b=value' → (['a', 'b'], value parsed as YAML). A plain string holding a control
    character is refused (YAML would silently fold or drop it)."""
    if "=" not in text:
        raise ConfigError(f"override {clip(repr(text))}: expected key=value")
    key, raw = text.split("=", 1)
    try:
        value = parse_yaml(raw) if raw.strip() else ""
    except (yaml.constructor.ConstructorError, yaml.composer.ComposerError) as e:
        # what _StrictLoader refuses (a key given twice, an alias ...), not a plain string
        raise ConfigError(f"override {clip(repr(text))}: {e.problem}") from None
    except yaml.YAMLError:
        value = raw
    control = control_character(raw)
    if control and not isinstance(value, (dict, list)):
        raise ConfigError(f"override {clip(repr(text))}: the value holds a control character "
                          f"({control})")
    return key.strip().split("."), value


def apply_override(values, text) -> str:
    """Set the key `text` (key=value) names in `values` → that key, dotted."""
    path, value = parse_override(text)
    if not all(path):
        raise ConfigError(f"override {clip(repr(text))}: empty key in "
                          f"{clip(repr('.'.join(path)))}")
    if path[0] not in DEFAULTS:
        raise unknown_key(f"override {clip(repr(text))}", path[0])
    if len(path) > 1 and path[0] not in FREE_DICTS:
        raise ConfigError(f"override {clip(repr(text))}: {path[0]!r} is not a mapping")
    target = values
    for i, part in enumerate(path[:-1]):
        target = target.setdefault(part, {})
        if not isinstance(target, dict):   # an earlier override's value, or a file's null
            raise ConfigError(f"override {clip(repr(text))}: "
                              f"{clip(repr('.'.join(path[:i + 1])))} is not a mapping")
    target[path[-1]] = value
    return ".".join(path)


def load_config(path=None, overrides=()) -> TrainConfig:
    """DEFAULTS ← yaml file ← overrides, validated. The user's keys (`user_keys`) are those of
    the overrides, and the file's when it sets eval_only: true itself (a file written to
    evaluate; a training config's, the packaged task config's first, are the recipe)."""
    values = load_yaml(path) if path else {}
    return config_from_values(values, path or "overrides", overrides,
                              given_by_user=values.get("eval_only") is True)


def config_from_values(given: dict, source: str, overrides=(),
                       given_by_user: bool = False) -> TrainConfig:
    """DEFAULTS ← `given` (a mapping read from `source`, e.g. a saved model's task.json) ←
    overrides, validated; errors name `source`. `user_keys`: the overrides' keys, and
    `given`'s with `given_by_user`. eval_only scores the splits the user names
    (named_splits)."""
    values = copy.deepcopy(DEFAULTS)
    for key, value in given.items():
        if key not in DEFAULTS:   # load_yaml checked a file's keys; a mapping's are checked here
            raise unknown_key(source, key)
        values[key] = copy.deepcopy(value)
    user_keys = frozenset([apply_override(values, text) for text in overrides]
                          + (list(given) if given_by_user else []))
    if values["eval_only"] is True:
        named_splits(values, user_keys)
    return validate(values, source, user_keys)


SPLIT_KEYS = ("eval_splits", "test_splits")


def named_splits(values: dict, user_keys: FrozenSet[str]) -> None:
    """eval_only scores what the user names: when the user's eval_splits or test_splits name a
    split, the other key, not set by the user (the task config's), is emptied in `values`
    (`test_splits=[test]` reads IMDB's test file once, not again as its dev; `eval_splits=[dev]`
    does not score a config's test_splits). Naming none keeps the config's."""
    if any(key in user_keys and values[key] for key in SPLIT_KEYS):
        for key in SPLIT_KEYS:
            if key not in user_keys:
                values[key] = []


def with_values(cfg: TrainConfig, values: dict) -> TrainConfig:
    """A copy of `cfg` (its source and user_keys kept) with `values` set, validated again."""
    return validate({**cfg.as_dict(), **copy.deepcopy(values)}, cfg.source, cfg.user_keys)


def _strings(values: dict) -> Iterator[Tuple[str, str]]:
    """(key path, string) for every string in `values`, its nested mappings' keys and values
    and its lists' items: ("data_dir[1]", "/data/b"), ("reader.files", "files")."""
    stack = [("", values)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            yield path, value
        elif isinstance(value, dict):
            for key, item in value.items():
                name = f"{path}.{key}" if path else str(key)
                if isinstance(key, str):
                    yield name, key
                stack.append((name, item))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item) for i, item in enumerate(value))


def _check_model_overrides(v: Dict[str, Any], source: str) -> None:
    """model_overrides' keys are the model config's (the language model's own for that kind):
    an unknown one is one line with the nearest keys."""
    overrides = v["model_overrides"]
    if not isinstance(overrides, dict):
        return
    name, known = kind_class(v["kind"]).model_config_keys()
    for key in overrides:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=3) if isinstance(key, str) else []
            hint = (f" (did you mean: {', '.join('model_overrides.' + c for c in close)}?)"
                    if close else "")
            raise ConfigError(f"{source}: model_overrides.{clip(str(key), 80)}: unknown "
                              f"{name} key{hint}")


def _fail(source: str, key: str, message: str) -> NoReturn:
    """Raise the ConfigError naming `key`; the message quotes the value given: at most a few
    lines' worth."""
    raise ConfigError(f"{source}: {clip(key)}: {clip(message, 300)}")


def _refuse(v: Dict[str, Any], source: str, key: str) -> None:
    """`key` set for a kind that refuses it (Task.refused): its ConfigError."""
    why = kind_class(v["kind"]).refused.get(key)
    if v[key] and why:
        _fail(source, key, why)


def _check_names(v: Dict[str, Any], source: str) -> None:
    """Check the names, paths and choices: task, kind, model_overrides, the paths, data_dir."""
    # names and paths: a NUL cannot reach the OS; a newline, CR or tab in a name or path is
    # a slip (a pasted line end), never meant
    for key, text in _strings(v):
        control = control_character(text)
        if control:
            _fail(source, repr(key) if control_character(key) else key,
                 f"holds a control character ({control}): {text!r}")
    if not v["task"]:
        raise missing_key(source, v["task"], "task", "the name of a folder in tasks/")
    if not isinstance(v["task"], str) or not v["task"].isidentifier():
        _fail(source, "task", f"must be the name of a folder in tasks/, got {v['task']!r}")
    # the closed registry of kinds: a name is looked up, never imported
    try:
        kind_name(v["kind"])
    except ValueError as e:
        _fail(source, "kind", str(e))
    _check_model_overrides(v, source)
    for key in ("output_dir", "model", "init_checkpoint", "tokenizer"):
        if not isinstance(v[key], str):
            _fail(source, key, f"must be a string (a name or a path), got {v[key]!r}")
    data = v["data_dir"] if isinstance(v["data_dir"], list) else [v["data_dir"]]
    if not all(isinstance(d, str) for d in data) or (isinstance(v["data_dir"], list)
                                                     and not v["data_dir"]):
        _fail(source, "data_dir", f"must be a path (or, for pretraining, a list of paths), got "
                                  f"{v['data_dir']!r}")
    for key, choices in CHOICES.items():
        if v[key] not in choices:
            close = difflib.get_close_matches(v[key], choices, n=1) \
                if isinstance(v[key], str) else []
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            _fail(source, key, f"{v[key]!r} is not one of {list(choices)}{hint}")
    if v["device"] == "gpu":
        problem = gpu_problem()
        if problem:
            _fail(source, "device", f"gpu: {problem}")


def _check_numbers(v: Dict[str, Any], source: str) -> None:
    """Check the numbers (integers, rates, seed, threads) and amp; floats given as strings are
    read as floats."""
    if v["max_doc_tokens"] is None:   # null = no limit, as 0
        v["max_doc_tokens"] = 0
    for key, low in INTEGER_KEYS.items():   # true and false are not integers here
        problem = integer_problem(v[key], low, nullable=key in NULLABLE_KEYS)
        if problem:
            _fail(source, key, problem)
    for key in ("learning_rate", "warmup_proportion", "weight_decay", "layer_decay",
                "max_grad_norm", "adam_epsilon"):
        if v[key] is None and key in OFFICIAL_RULE_KEYS:   # training.optim decides
            continue
        if isinstance(v[key], str):   # YAML 1.1 reads 7e-5 (no dot) as a string
            try:
                v[key] = float(v[key])
            except ValueError:
                pass
        if not isinstance(v[key], (int, float)) or isinstance(v[key], bool) \
                or not math.isfinite(v[key]) or v[key] < 0:
            _fail(source, key, f"must be a finite non-negative number, got {v[key]!r}")
    if v["warmup_proportion"] > 1:
        _fail(source, "warmup_proportion", "must be at most 1")
    if v["adam_epsilon"] == 0:   # Adam divides by sqrt(v) + epsilon: 0/0 on unused weights
        _fail(source, "adam_epsilon", "must be positive, got 0")
    if v["layer_decay"] == 0:   # a zero ratio freezes layers (the official code reads 0 as off)
        _fail(source, "layer_decay", "must be positive (1 = no layer-wise decay), got 0")
    seed = v["seed"]
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2 ** 32:
        _fail(source, "seed", f"must be an integer in [0, 2^32), got {seed!r}")
    threads = threads_problem(v["threads"])
    if threads:
        _fail(source, "threads", threads)
    _refuse(v, source, "max_doc_tokens")
    amp_problem = check_amp_value(v["amp"])
    if amp_problem:
        _fail(source, "amp", amp_problem)


def _check_switches(v: Dict[str, Any], source: str) -> None:
    """Check the true/false switches and how they combine, the mappings and the name lists."""
    for key in ("retro_feed", "train_skim", "shuffle", "eval_every_epoch", "progress",
                "overwrite_output_dir", "recompute", "compile", "flush_denormals", "eval_only",
                "allow_partial_checkpoint"):
        if not isinstance(v[key], bool):
            _fail(source, key, f"must be true or false, got {v[key]!r}")
    if v["compile"] and v["recompute"]:   # recompute hooks into dygraph's autograd only
        _fail(source, "compile", "cannot be combined with recompute: true (recompute runs in "
                                 "dygraph only); turn one of them off")
    if v["train_skim"] and not v["retro_feed"]:
        _fail(source, "train_skim", "trains the skim pass of the retrospective feed; with "
                                    "retro_feed: false there is none")
    for key in FREE_DICTS:
        if not isinstance(v[key], dict):
            _fail(source, key, f"must be a mapping, got {v[key]!r}")
    for key in NAME_LISTS:
        if isinstance(v[key], str):
            v[key] = [v[key]]
        if not isinstance(v[key], list) or not all(isinstance(x, str) for x in v[key]):
            _fail(source, key, f"must be a list of names, got {v[key]!r}")
        if len(v[key]) > MAX_NAMES:
            _fail(source, key, f"lists {len(v[key])} names; at most {MAX_NAMES}")
        seen = set()
        for name in v[key]:
            if name in seen:
                _fail(source, key, f"names {name!r} twice")
            seen.add(name)


def _check_splits(v: Dict[str, Any], source: str) -> None:
    """Check max_examples and main_metric against the run's splits, and what the run needs to
    train or evaluate (init_checkpoint, max_steps, eval_splits)."""
    splits = ["train"] + list(v["eval_splits"]) + list(v["test_splits"])
    for split, n in v["max_examples"].items():
        if split not in splits:
            _fail(source, f"max_examples.{split}", f"{split!r} is not a split of this run "
                                                   f"({', '.join(dict.fromkeys(splits))})")
        problem = integer_problem(n, 1)
        if problem:
            _fail(source, f"max_examples.{split}", problem)
    if v["main_metric"] is not None and not isinstance(v["main_metric"], str):
        _fail(source, "main_metric", f"must be a metric name, got {v['main_metric']!r}")
    if v["eval_only"]:
        if not v["init_checkpoint"]:
            raise missing_key(source, v["task"], "init_checkpoint",
                              "eval_only evaluates it (a trained model directory)")
        _refuse(v, source, "eval_only")
        if not (v["eval_splits"] or v["test_splits"]):
            _fail(source, "eval_only", "give eval_splits or test_splits to evaluate")
    elif kind_class(v["kind"]).streaming:   # eval_splits may be empty
        if not v["max_steps"]:
            _fail(source, "max_steps", f"{v['kind']} streams its corpus: give the number of steps")
    elif not v["eval_splits"]:
        _fail(source, "eval_splits", "needs at least one split (it picks the best checkpoint)")


def resolved_doc_prediction(values: dict) -> Any:
    """`values`' doc_prediction; a null one (or none) is read where the loss trains: "last"
    under loss_segments: last (the paper's appendix reading), else "mean" (official)."""
    given = values.get("doc_prediction")
    if given is not None:
        return given
    return "last" if values.get("loss_segments", DEFAULTS["loss_segments"]) == "last" else "mean"


def validate(v: Dict[str, Any], source: str, user_keys: FrozenSet[str] = frozenset()
             ) -> TrainConfig:
    """Check every key of `v` (in place: some values are normalised; errors name `source`) →
    the TrainConfig."""
    v["doc_prediction"] = resolved_doc_prediction(v)
    _check_names(v, source)
    _check_numbers(v, source)
    _check_switches(v, source)
    _check_splits(v, source)
    if not v["output_dir"]:
        v["output_dir"] = os.path.join("output", str(v["task"]))
    return TrainConfig(**v, source=source, user_keys=user_keys)


def batch_rows(cfg: TrainConfig, group: int, evaluation: bool = False) -> int:
    """Batch rows (memory streams) per rank: batch_size, or eval_batch_size in `evaluation`
    when it is set, counted in examples of `group` rows each (a C3 question's choices, a CAIL
    triplet's two pairs) under batch_unit "examples", as PaddleNLP's run_mcq.py and
    run_semantic_matching.py count questions and triplets, or in rows under "rows"."""
    size = (cfg.eval_batch_size or cfg.batch_size) if evaluation else cfg.batch_size
    return size * group if cfg.batch_unit == "examples" else size
