"""ErnieDocConfig: official and PaddleNLP keys, presets, JSON round trip, clear errors."""
import json
import time

import pytest
import yaml
from helpers import shared_path

from ernie_doc import PRESETS, ErnieDocConfig
from ernie_doc.errors import ConfigError
from ernie_doc.lm.model import TransformerXLConfig, load_lm_config
from ernie_doc.run_config import DEFAULTS, config_from_values, load_config, parse_yaml
from ernie_doc.utils import parse_json

OFFICIAL_BASE_EN = {
    "attention_probs_dropout_prob": 0.0, "hidden_act": "gelu", "hidden_dropout_prob": 0.0,
    "hidden_size": 768, "initializer_range": 0.02, "max_position_embeddings": 512,
    "num_attention_heads": 12, "num_hidden_layers": 12, "sent_type_vocab_size": 4,
    "task_type_vocab_size": 3, "vocab_size": 50265, "memory_len": 128, "epsilon": 1e-12}


def test_official_keys_and_preset_agree(tmp_path):
    path = tmp_path / "ernie_config.json"
    path.write_text(json.dumps(OFFICIAL_BASE_EN))
    assert ErnieDocConfig.from_json(path) == ErnieDocConfig.from_preset("ernie-doc-base-en")


@pytest.mark.parametrize("name", ["base-en", "base-zh", "large-en"])
def test_official_files_match_presets(name):
    cfg = ErnieDocConfig.from_json(shared_path("assets", "ernie-doc", name, "ernie_config.json"))
    preset = ErnieDocConfig.from_preset(f"ernie-doc-{name}")
    # pad id is not in the official files; it follows the vocabulary (en 1, zh 0)
    assert cfg.replace(pad_token_id=preset.pad_token_id) == preset


def test_paddlenlp_keys():
    cfg = ErnieDocConfig(attention_dropout_prob=0.1, relu_dropout=0.0, pad_token_id=0,
                         cls_token_idx=0, init_class="ErnieDocModel", model_type="ernie_doc")
    assert cfg.attention_probs_dropout_prob == 0.1 and cfg.cls_token_idx == 0


def test_presets():
    assert set(PRESETS) == {"ernie-doc-small", "ernie-doc-base-en", "ernie-doc-base-zh",
                            "ernie-doc-large-en"}
    small = ErnieDocConfig.from_preset("ernie-doc-small")
    assert (small.num_hidden_layers, small.hidden_size, small.num_attention_heads) == (6, 256, 4)
    large = ErnieDocConfig.from_preset("ernie-doc-large-en")
    assert (large.num_hidden_layers, large.hidden_size, large.num_attention_heads) == (24, 1024, 16)
    zh = ErnieDocConfig.from_preset("ernie-doc-base-zh")
    assert (zh.vocab_size, zh.hidden_dropout_prob, zh.pad_token_id) == (28000, 0.1, 0)
    assert zh.num_position_rows == 1152 and zh.head_dim == 64


def test_json_round_trip(tmp_path):
    cfg = ErnieDocConfig.from_preset("ernie-doc-small", recurrence="xl", mask_empty_memory=True)
    cfg.to_json(tmp_path / "c.json")
    assert ErnieDocConfig.from_json(tmp_path / "c.json") == cfg
    assert ErnieDocConfig.from_any(str(tmp_path / "c.json")) == cfg


@pytest.mark.parametrize("values, message", [
    ({"hidden_sizes": 3}, "unknown config key 'hidden_sizes'"),
    ({"hidden_size": 100, "num_attention_heads": 12}, "must be divisible"),
    ({"recurrence": "lstm"}, "recurrence must be one of"),
    ({"hidden_dropout_prob": 1.5}, "hidden_dropout_prob must be in [0, 1)"),
    ({"num_hidden_layers": 0}, "num_hidden_layers must be a positive integer"),
    ({"memory_len": -1}, "memory_len must be a non-negative integer"),
    ({"relative_position_mapping": "x"}, "relative_position_mapping must be one of"),
    # sizes paddle would take as an int32 tensor dimension (an IndexError deep inside it)
    ({"memory_len": 10 ** 11}, "memory_len must be at most 2147483647, got 100000000000"),
    ({"max_position_embeddings": 10 ** 10}, "max_position_embeddings must be at most"),
    ({"max_position_embeddings": 2 ** 30}, "(the position table's rows) must be at most"),
    ({"hidden_size": 2 ** 30, "num_attention_heads": 1}, "hidden_size must be at most 536870911"),
    ({"vocab_size": 10 ** 12}, "vocab_size must be at most 2147483647"),
    ({"num_labels": True}, "num_labels must be a positive integer, got True"),
    ({"pad_token_id": -1}, "pad_token_id must be a non-negative integer"),
])
def test_bad_values(values, message):
    with pytest.raises(ConfigError) as err:
        ErnieDocConfig(**values)
    assert message in str(err.value)


def test_bad_file_names_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"hidden_size": 768,\n "nope": 1}')
    with pytest.raises(ConfigError) as err:
        ErnieDocConfig.from_json(bad)
    assert str(bad) in str(err.value) and "nope" in str(err.value)
    broken = tmp_path / "broken.json"
    broken.write_text('{"hidden_size": 768,\n oops}')
    with pytest.raises(ConfigError) as err:
        ErnieDocConfig.from_json(broken)
    assert f"{broken}:2:" in str(err.value)
    with pytest.raises(ConfigError):
        ErnieDocConfig.from_any("ernie-doc-huge")


def test_from_any_reads_a_checkpoint_directory(tmp_path):
    from ernie_doc import ErnieDocConfig
    config = ErnieDocConfig.from_preset("ernie-doc-small", num_hidden_layers=3)
    config.to_json(str(tmp_path / "config.json"))
    loaded = ErnieDocConfig.from_any(str(tmp_path), memory_len=16)
    assert loaded.num_hidden_layers == 3 and loaded.memory_len == 16
    with pytest.raises(ConfigError, match="not a preset name or a config file"):
        ErnieDocConfig.from_any(str(tmp_path / "missing"))


# Run and model configs are checked whole before anything runs: every integer key takes
# integers only (never true / false) within bounds, integer literals are at most 30 digits
# (YAML, --set, JSON), names and paths hold no control characters (a NUL, a newline YAML would
# fold into a space, a CR it would drop), and the lists of names (eval_splits, test_splits,
# metrics) hold each name once and at most 64 of them. In-process (load_config, the config
# classes): milliseconds per case.


BASE = ["task=longdep"]
DIGITS = "9" * 5000   # past Python's 4300-digit limit on int(): a bare ValueError


def refused(overrides, *parts, path=None):
    """load_config(path, BASE + overrides) raises ConfigError, one line holding every part."""
    with pytest.raises(ConfigError) as info:
        load_config(path, BASE + list(overrides))
    line = str(info.value)
    assert "\n" not in line and len(line) < 500, line
    for part in parts:
        assert part in line, (part, line)
    return line


# -- integers ---------------------------------------------------------------------------------
INTEGER_KEYS = sorted([k for k, v in DEFAULTS.items() if type(v) is int]
                      + ["stride", "eval_batch_size", "max_examples.train"])


@pytest.mark.parametrize("key", INTEGER_KEYS)
def test_true_is_not_an_integer_for_any_integer_key(key):
    """stride=true and eval_batch_size=true were read as 1 (batch_size=true was refused)."""
    refused([f"{key}=true"], f"overrides: {key}: must be", "got True")


@pytest.mark.parametrize("given, parts", [
    (["stride=100000000000"], ("stride: must be at most 2147483647, got 100000000000",)),
    (["save_steps=0x7fffffffffffffffffffff"], ("save_steps: must be at most 2147483647",)),
    (["eval_batch_size=10000000000"], ("eval_batch_size: must be at most 2147483647",)),
    (["max_examples.train=1000000000000"], ("max_examples.train: must be at most",)),
], ids=["stride", "hex", "eval_batch_size", "max_examples"])
def test_integer_keys_are_bounded(given, parts):
    refused(given, *parts)


def test_integer_keys_take_their_bounds_and_null():
    cfg = load_config(None, BASE + ["stride=2147483647", "eval_batch_size=null",
                                    "max_examples.train=2147483647"])
    assert (cfg.stride, cfg.eval_batch_size) == (2 ** 31 - 1, None)


def test_long_integer_literals_are_one_line_at_their_line(tmp_path):
    """5000 digits made int() raise a bare ValueError (a traceback) in YAML, --set and JSON;
    39 digits were accepted as keep_checkpoints."""
    config = tmp_path / "config.yaml"
    config.write_text(f"task: longdep\nwarmup_steps: {DIGITS}\n")
    refused([], f"{config}:2: invalid YAML (an integer of 5000 digits (at most 30))",
            path=config)
    config.write_text("task: longdep\n\nkeep_checkpoints: " + "1" * 39 + "\n")
    refused([], f"{config}:3: invalid YAML (an integer of 39 digits", path=config)
    refused([f"warmup_steps={DIGITS}"], "override 'warmup_steps=999", "an integer of 5000 digits")
    # sexagesimal (YAML 1.1): 20 characters stand for 60^19, 34 digits
    refused(["epochs=1" + ":0" * 19], "an integer of 34 digits (at most 30)")
    with pytest.raises(yaml.YAMLError, match="an integer of 31 digits"):
        parse_yaml("a: -" + "1" * 31)
    assert parse_yaml("a: " + "9" * 30) == {"a": int("9" * 30)}
    with pytest.raises(ConfigError, match=r"^c.json:3: an integer of 5000 digits \(at most 30\)$"):
        parse_json('{"a": 1,\n "b": [2,\n ' + DIGITS + "]}", "c.json", ConfigError)
    assert parse_json('{"a": -123, "b": 1.5}', "c.json") == {"a": -123, "b": 1.5}


def test_model_config_sizes_fit_paddle_int32(tmp_path):
    """A saved model's config.json with memory_len 10^11 (or 5000 digits) reached paddle as
    a 78-line IndexError ("exceeds int32") from the memory estimate's lazy build."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": 16, "num_attention_heads": 2,
                                "memory_len": 10 ** 11}))
    with pytest.raises(ConfigError, match=f"^{path}: memory_len must be at most 2147483647"):
        ErnieDocConfig.from_json(path)
    path.write_text('{"hidden_size": 16,\n "memory_len": ' + DIGITS + "}")
    with pytest.raises(ConfigError, match=f"^{path}:2: an integer of 5000 digits"):
        ErnieDocConfig.from_any(str(tmp_path))


def test_a_json_key_given_twice_is_one_line_naming_it(tmp_path):
    """json.loads keeps the last of two values under one key without a word: a config.json
    (task.json, tokenizer_config.json, a hub manifest: every file read by parse_json) saying
    memory_len twice was read as its last value. Now one line names the file and the key."""
    with pytest.raises(ConfigError, match=r'^c.json: the key "b" appears twice in one object$'):
        parse_json('{"a": {"b": 1, "c": 2, "b": 3}}', "c.json", ConfigError)
    with pytest.raises(ValueError, match=r'^c.json: the key "a" appears twice in one object$'):
        parse_json('{"a": 1,\n "a": 1}', "c.json")   # even with one value
    assert parse_json('[{"a": 1}, {"a": 2}, {"b": {"a": 3}}]', "c.json") == \
        [{"a": 1}, {"a": 2}, {"b": {"a": 3}}]
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": 16, "num_attention_heads": 2, "memory_len": 8,\n'
                    ' "memory_len": 128}')
    with pytest.raises(ConfigError, match=f'^{path}: the key "memory_len" appears twice'):
        ErnieDocConfig.from_json(path)
    with pytest.raises(ConfigError, match=f'^{path}: the key "memory_len" appears twice'):
        ErnieDocConfig.from_any(str(tmp_path))


@pytest.mark.parametrize("values, message", [
    ({"mem_len": 10 ** 11}, "mem_len must be at most 2147483647"),
    ({"tgt_len": 2 ** 30, "mem_len": 2 ** 30}, r"tgt_len \+ ext_len \+ mem_len must be at most"),
    ({"n_head": 2 ** 16, "d_head": 2 ** 16}, r"n_head \* d_head must be at most"),
    ({"vocab_size": 10 ** 10, "cutoffs": []}, "vocab_size must be at most"),
], ids=["mem_len", "keys", "heads", "vocab"])
def test_language_model_sizes_fit_paddle_int32(values, message):
    with pytest.raises(ValueError, match=message):
        TransformerXLConfig(**values)


def test_language_model_config_file_long_integer(tmp_path):
    path = tmp_path / "lm.json"
    path.write_text('{"n_layer": ' + DIGITS + "}")
    with pytest.raises(ConfigError, match=f"^{path}:1: an integer of 5000 digits"):
        load_lm_config(str(path))


# -- control characters -----------------------------------------------------------------------
@pytest.mark.parametrize("given, parts", [
    (["output_dir=a\nb"], ("override 'output_dir=a\\nb': the value holds a control character "
                           "(U+000A)",)),
    (["kind=classification\r"], ("override 'kind=classification\\r'", "(U+000D)")),
    (["model=base\t"], ("(U+0009)",)),
], ids=["newline", "cr", "tab"])
def test_set_values_with_control_characters_are_refused(given, parts):
    """YAML folded `a\\nb` into `a b` and dropped a final CR: the run used another name than
    the one given, without a word."""
    refused(given, *parts)


def test_control_characters_in_a_config_file_are_refused_naming_the_key(tmp_path):
    config = tmp_path / "config.yaml"
    for text, part in (('output_dir: "/x/a\\0b"', "output_dir: holds a control character "
                                                  "(U+0000)"),
                       ('data_dir: [/a, "/b\\nc"]', "data_dir[1]: holds a control character"),
                       ('reader: {files: {train: "t\\x7f"}}', "reader.files.train: holds a "
                                                              "control character (U+007F)"),
                       ('kind: "classification\\r"', "kind: holds a control character"),
                       ('eval_splits: ["dev\\t"]', "eval_splits[0]: holds")):
        config.write_text(f"task: longdep\n{text}\n")
        refused([], f"{config}: {part}", path=config)


def test_a_saved_task_record_with_a_control_character_is_refused():
    with pytest.raises(ConfigError, match=r"^m/task.json: kind: holds a control character"):
        config_from_values({"task": "longdep", "kind": "classification\r"}, "m/task.json")


def test_a_nul_in_a_yaml_file_is_one_line_at_its_line(tmp_path):
    """A raw NUL byte: the message was PyYAML's two lines."""
    config = tmp_path / "config.yaml"
    config.write_bytes(b"task: longdep\nmodel: a\0b\n")
    refused([], f"{config}:2: invalid YAML (character U+0000: special characters are not "
                "allowed)", path=config)


# -- lists of names -----------------------------------------------------------------------------
@pytest.mark.parametrize("given, part", [
    ("eval_splits=[" + ",".join(["dev"] * 1000) + "]", "eval_splits: lists 1000 names; at most "
                                                       "64"),
    ("eval_splits=[dev, dev]", "eval_splits: names 'dev' twice"),
    ("test_splits=[test, dev, test]", "test_splits: names 'test' twice"),
    ("metrics=[accuracy, f1, accuracy]", "metrics: names 'accuracy' twice"),
    ("metrics=[" + ",".join(f"m{i}" for i in range(65)) + "]", "metrics: lists 65 names"),
], ids=["1000", "eval-dup", "test-dup", "metrics-dup", "metrics-65"])
def test_name_lists_hold_each_name_once_and_are_bounded(given, part):
    """100,000 copies of dev ran 100,000 evaluations (timed out after creating OUTPUT_DIR);
    1,000 took 44 s."""
    refused([given], f"overrides: {part}")


def test_a_config_file_of_megabytes_is_refused_before_parsing(tmp_path):
    """100,000 copies of dev and of accuracy (1.3 MB): PyYAML took 16 s to read them before
    any check could run."""
    config = tmp_path / "config.yaml"
    config.write_text("task: longdep\neval_splits: [" + ",".join(["dev"] * 100_000) + "]\n")
    start = time.perf_counter()
    refused([], f"{config}: more than 262,144 characters", path=config)
    assert time.perf_counter() - start < 10, "PyYAML reading it first took 16 s"
