"""ErnieDocConfig: official and PaddleNLP keys, presets, JSON round trip, clear errors."""
import json

import pytest
from helpers import shared_path

from ernie_doc import PRESETS, ErnieDocConfig
from ernie_doc.errors import ConfigError

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
