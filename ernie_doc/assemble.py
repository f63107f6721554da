"""A config or a saved run → the task kind, tokenizer and model that read its documents: the
one place that assembles them, for training, evaluation and prediction; the kind builds them
(kinds.base.Task: read_inputs, build_model, build_splits, load_saved).

    resolve_inputs(cfg)          released names / URLs → local paths (ernie_doc.hub)
    saved_run(directory, ...)    a saved model folder (task.json) → its kind, tokenizer, model
    read_as_trained(cfg, folder, record)  eval_only of such a folder: the reading settings it
                                 was trained with (trained_reading), but those the user set"""
import copy
import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from ernie_doc.errors import ConfigError, ErnieDocError, HubError
from ernie_doc.hub import is_url, resolve
from ernie_doc.hub.archive import is_archive
from ernie_doc.kinds import TASK_FILE, build_task, kind_class, saved_kind
from ernie_doc.precision import AmpSettings
from ernie_doc.run_config import (DEFAULTS, READING_KEYS, TrainConfig, batch_rows,
                                  config_from_values, is_reading_key, resolved_doc_prediction,
                                  with_values)
from ernie_doc.utils import clip, flush_denormals, set_device


@dataclass
class Assembly:
    """A run's task, tokenizer and model, built and checked. `special`: cls / sep / pad ids;
    `eval_rows`: rows read without gradients (None: the batch size); `resume`: --resume."""
    cfg: TrainConfig             # released names and URLs resolved to local paths
    task: Any                    # kinds.base.Task
    tokenizer: Any = None        # a tokenization class's, or the language model's Vocabulary
    special: Dict[str, int] = field(default_factory=dict)
    model: Optional[Any] = None  # a paddle.nn.Layer, or an exported model behind its call
    device: str = "cpu"
    amp: AmpSettings = AmpSettings()   # the run's autocast (fp32: off)
    eval_rows: Optional[int] = None
    resume: bool = False

    @property
    def out(self) -> str:
        return self.cfg.output_dir

    def batch_rows(self, evaluation: bool = False) -> int:
        """Batch rows per rank of the run's kind (run_config.batch_rows)."""
        return batch_rows(self.cfg, self.task.group_size, evaluation)


def resolve_inputs(cfg: TrainConfig) -> TrainConfig:
    """`cfg` with `init_checkpoint`, `tokenizer` and a URL / archive `model` resolved to local
    paths (ernie_doc.hub.resolve); a released name as `model` stays a config preset."""
    # `~/x` means the home's x, as in a shell: expanded once, here, so that the checks of
    # OUTPUT_DIR and every write into it see the same directory
    resolved: Dict[str, Any] = {"output_dir": os.path.expanduser(cfg.output_dir)}
    try:
        if cfg.init_checkpoint:
            resolved["init_checkpoint"] = resolve(cfg.init_checkpoint, "model",
                                                  cfg.model_source)
        if cfg.tokenizer and cfg.tokenizer != "train":
            resolved["tokenizer"] = resolve(cfg.tokenizer, "tokenizer")
        if is_url(cfg.model) or (os.path.isfile(cfg.model) and is_archive(cfg.model)):
            resolved["model"] = resolve(cfg.model, "model")
    except HubError as e:
        raise ConfigError(f"{cfg.source}: {e}") from None
    return dataclasses.replace(cfg, **resolved)


def tokenizer_record(cfg: TrainConfig, task: Any, saved: Dict[str, Any]) -> Dict[str, Any]:
    """A saved run's tokenizer_config.json: the tokenizer's own record (`saved`) with
    max_seq_len as model_max_length and, for a kind whose segment a call can lay out from one
    text (the classifier's), that segment, the run's max_doc_tokens and its stride (how far
    apart a document's segments start: segment_batches cuts them so)."""
    record = {k: v for k, v in saved.items()
              if k not in ("segment_layout", "max_doc_tokens", "segment_stride")}
    record["model_max_length"] = cfg.max_seq_len
    layout = task.text_segment_layout()
    if layout is not None:
        record["segment_layout"] = layout
        if cfg.max_doc_tokens:
            record["max_doc_tokens"] = cfg.max_doc_tokens
        record["segment_stride"] = task.segmenter.stride
    return record


def saved_run(directory: str, record: Mapping[str, Any], source: str, device: str = "cpu",
              rows: Optional[int] = None,
              load_model: Optional[Callable[[Assembly], Any]] = None) -> Assembly:
    """A saved model folder → its Assembly, nothing written; the memory estimate (`rows` rows) is
    checked first. ConfigError / DataError / CheckpointError / UntrainedHead."""
    given = dict(record["config"])
    # the run's reader options stay, all of them (trained_reading keeps the reading ones)
    given.update({k: v for k, v in trained_reading(record).items() if k != "reader"})
    given.update(init_checkpoint=directory, data_dir="", output_dir="", eval_only=True,
                 device=device)
    cfg = config_from_values(given, source)
    flush_denormals(cfg.flush_denormals)   # as the run trained (CPU speed), every kind
    set_device("gpu" if device == "gpu" else "cpu")
    task = build_task(cfg, kind_class(cfg.kind).saved_reader(record, cfg.task))
    run = Assembly(cfg=cfg, task=task, device=device, eval_rows=rows)
    task.load_saved(run, directory, load_model)
    return run


# -- a fine-tuned folder's reading ---------------------------------------------------------------
def trained_reading(record: Mapping[str, Any]) -> Dict[str, Any]:
    """How the run that saved a folder (its task.json, `record`) read documents: its values of
    READING_KEYS (the default of one it lacks; of `reader`, the reading options it set), with
    the tokenizer the folder's own (the kind's saved_settings)."""
    config = record["config"]
    values = {key: copy.deepcopy(config.get(key, DEFAULTS[key]))
              for key in dict.fromkeys(k.split(".")[0] for k in READING_KEYS)}
    values["doc_prediction"] = resolved_doc_prediction(values)
    reader = values["reader"] if isinstance(values["reader"], dict) else {}
    values["reader"] = {k: v for k, v in reader.items() if is_reading_key(f"reader.{k}")}
    saved_kind(record["kind"]).saved_settings(values, {**DEFAULTS, **config})
    return values


UNSET = object()   # a reader option not set: the reader's default


def _shown(key: str, value: Any) -> str:
    """A setting's value in a log line, as YAML / JSON write it (null, true, "last")."""
    if key == "tokenizer" and value == "":
        return "the folder's own"
    if value is UNSET:
        return "not set"
    return clip(json.dumps(value, ensure_ascii=False, default=str), 80)


def read_as_trained(cfg: TrainConfig, folder: str, record: Mapping[str, Any]
                    ) -> Tuple[Dict[str, Any], List[str]]:
    """eval_only of a fine-tuned folder (init_checkpoint, or the folder of its weights file),
    whose task.json is `record`: its reading settings (trained_reading), except those the user
    set (`cfg.user_keys`; a map's entries one by one) → (the values to set, at most three log
    lines: `tokenizer: train` read as the folder's own tokenizer, the config's values
    replaced, the user's that differ from the run's)."""
    trained = trained_reading(record)
    if record["kind"] != cfg.kind:   # another kind's options do not apply
        del trained["task_options"]
    if record["task"] != cfg.task:   # nor another task's reader options
        del trained["reader"]
    model = {}   # what a model_overrides entry the run did not set was trained with
    if cfg.model_overrides:
        try:
            model = saved_kind(record["kind"]).saved_model_config(folder)
        except (ErnieDocError, OSError):   # loading the model then says why
            pass
    values: Dict[str, Any] = {}   # the keys to read as the run did, with its values
    lines = []
    if "tokenizer" in trained and cfg.tokenizer == "train":
        # evaluation trains nothing: a new tokenizer's ids are not the ones the model learned
        # (the training command with eval_only=true added must not score 0.5 in silence)
        lines.append(f'eval_only: tokenizer "train" reads with the tokenizer {folder} was '
                     "trained with (the folder's own); evaluation trains none")
        cfg = with_values(cfg, {"tokenizer": ""})
        values["tokenizer"] = ""
    # user-set or not → [(key, the run's value, cfg's)]
    differ: Dict[bool, list] = {True: [], False: []}
    for key, ran in trained.items():
        if isinstance(ran, dict):   # a map: entry by entry
            values[key] = _map_as_trained(cfg, key, ran, model, differ)
            continue
        mine = _user_set(cfg, key)
        if not mine:
            values[key] = ran
        differ[mine] += [] if getattr(cfg, key) == ran else [(key, ran, getattr(cfg, key))]
    where = f"{folder} was trained (its {TASK_FILE})"
    lines += [f"eval_only: reading as {where}, not as {cfg.source} says: " + ", ".join(
        f"{k} {_shown(k, run)} (config {_shown(k, value)})" for k, run, value in differ[False])
    ] if differ[False] else []
    if differ[True]:
        lines.append(f"eval_only: the values given differ from how {where} and are used: "
                     + ", ".join(f"{k} {_shown(k, value)} (trained with {_shown(k, run)})"
                                 for k, run, value in differ[True]))
    return values, lines


def _map_as_trained(cfg: TrainConfig, key: str, ran: Dict[str, Any], model: Dict[str, Any],
                    differ: Dict[bool, list]) -> Dict[str, Any]:
    """read_as_trained for the map `key` (the run's reading entries `ran`) → its value: the
    config's entries that are not reading ones (reader: where the data is), the run's, and
    the user's; `differ` gets the entries that change. A reader option only the run set is
    listed too (the config leaves the reader's default)."""
    given = getattr(cfg, key)
    reading = [e for e in dict.fromkeys([*ran, *given]) if is_reading_key(f"{key}.{e}")]
    mine = {e: given[e] for e in reading if e in given and _user_set(cfg, f"{key}.{e}")}
    value = {e: v for e, v in given.items() if e not in reading}
    value.update({e: ran[e] for e in reading if e in ran})
    value.update(mine)
    for entry in reading:
        if entry in given and entry not in ran and key == "task_options":
            continue   # a task.json from before the option existed: the config's is read
        if entry in given:
            run = ran.get(entry, model.get(entry) if key == "model_overrides" else
                          UNSET if key == "reader" else None)
            differ[entry in mine] += [] if given[entry] == run else [
                (f"{key}.{entry}", run, given[entry])]
        elif key == "reader":
            differ[False].append((f"{key}.{entry}", ran[entry], UNSET))
    return value


def _user_set(cfg: TrainConfig, key: str) -> bool:
    """Whether the user set `key` (dotted: an entry of a map), itself, a map holding it, or
    an entry inside it."""
    parts = key.split(".")
    return any(".".join(parts[:i]) in cfg.user_keys for i in range(1, len(parts) + 1)) or \
        any(k.startswith(key + ".") for k in cfg.user_keys)
