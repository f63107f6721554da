"""The run-config keys are discoverable: an unknown key names the nearest keys (and the key a
Hugging Face / PaddleNLP user means by a name of theirs), and `finetune --help-config` (pretrain
and tools/finetune.py too) lists every key with its default and meaning, from the same table
the defaults come from."""
import dataclasses
import json
import os
from dataclasses import replace

import pytest
from helpers import ROOT, write

from ernie_doc.errors import ConfigError
from ernie_doc.run_config import DEFAULTS, config_from_values, load_config


@pytest.mark.parametrize("override, hint", [
    ("learning_rat=1e-4", "(did you mean: learning_rate?)"),
    ("num_train_epochs=2", "(did you mean: epochs?)"),
    ("per_device_train_batch_size=8", "(did you mean: batch_size"),
    ("gradient_accumulation_steps=2", "(did you mean: grad_accum_steps"),
    ("warmup_ratio=0.1", "(did you mean: warmup_proportion"),
    ("max_seq_length=128", "(did you mean: max_seq_len"),
    ("model_name_or_path=x", "(did you mean: init_checkpoint"),
    ("max_train_samples=100", "(did you mean: max_examples.train"),
    ("evalsplits=[dev]", "(did you mean: eval_splits"),
])
def test_an_unknown_override_suggests_the_nearest_keys(override, hint):
    with pytest.raises(ConfigError) as info:
        load_config(None, ["task=longdep", override])
    message = str(info.value)
    assert "\n" not in message and f"unknown key {override.split('=')[0]!r} {hint}" in message
    assert message.endswith("--help-config lists the keys")


def test_unknown_keys_in_a_file_and_a_mapping_suggest_too(tmp_path):
    write(tmp_path, {"c.yaml": "task: longdep\nlogging_step: 5\n"})
    with pytest.raises(ConfigError, match=r"c\.yaml:2: unknown key 'logging_step' \(did you "
                                          r"mean: logging_steps"):
        load_config(str(tmp_path / "c.yaml"))
    with pytest.raises(ConfigError, match=r"task\.json: unknown key 'sed' \(did you mean: "
                                          r"seed"):
        config_from_values({"task": "longdep", "sed": 1}, "task.json")
    with pytest.raises(ConfigError) as info:   # nothing near: no guess
        load_config(None, ["task=longdep", "zzzzqqq=1"])
    assert "did you mean" not in str(info.value)


def test_nested_keys_name_the_dotted_key_and_suggest():
    """model_overrides and reader options name the key under its section and the nearest
    one; an empty part of a dotted key is refused."""
    from ernie_doc.data.document import check_options
    from ernie_doc.errors import DataError
    with pytest.raises(ConfigError, match=r"model_overrides\.hiden_size: unknown ErnieDocConfig "
                                          r"key \(did you mean: model_overrides\.hidden_size"):
        load_config(None, ["task=longdep", "model_overrides.hiden_size=64"])
    with pytest.raises(DataError, match=r"unknown key 'fil' \(did you mean reader\.file\?\)"):
        check_options({"fil": "x"}, ("file", "dev_ratio"))
    for override in ("reader..x=3", "reader.=3", ".x=1"):
        with pytest.raises(ConfigError, match="empty key") as info:
            load_config(None, ["task=longdep", override])
        assert "\n" not in str(info.value)


@pytest.mark.parametrize("overrides, part", [
    (["reader=5", "reader.x=1"], "'reader'"),
    (["reader.x=2", "reader.x.y=1"], "'reader.x'"),
    (["model_overrides={a: [1]}", "model_overrides.a.b=1"], "'model_overrides.a'"),
])
def test_a_dotted_key_into_a_value_that_is_no_mapping_is_one_line(overrides, part):
    """--set reaching inside a value that is not a mapping (an earlier override's, or a
    config file's `reader:` left empty, which YAML reads as null) is a ConfigError naming
    the key, not a TypeError."""
    with pytest.raises(ConfigError, match=f"override '{overrides[1]}': {part} is not a "
                                          "mapping") as info:
        load_config(None, ["task=longdep", *overrides])
    assert "\n" not in str(info.value)


def test_a_dotted_key_into_a_file_section_left_empty_is_one_line(tmp_path):
    write(tmp_path, {"c.yaml": "task: longdep\nreader:\n"})
    with pytest.raises(ConfigError, match="override 'reader.dev_ratio=0.2': 'reader' is not a "
                                          "mapping"):
        load_config(str(tmp_path / "c.yaml"), ["reader.dev_ratio=0.2"])


def test_every_key_has_a_meaning_and_the_help_lists_it(capsys):
    from ernie_doc.cli.finetune import main
    from ernie_doc.run_keys import GROUP_STARTS, MEANINGS
    assert main(["--help-config"]) == 0
    out = capsys.readouterr().out
    listed = {}
    for line in out.splitlines():
        parts = line.split(None, 1)
        if line.startswith("  ") and parts and parts[0] in DEFAULTS:
            listed[parts[0]] = parts[1]
    assert list(listed) == list(DEFAULTS)   # every key, in the table's order
    assert all(f"\n\n{group}:\n  {name} " in out for name, group in GROUP_STARTS.items())
    for name, meaning in MEANINGS.items():
        assert meaning.strip() and "\n" not in meaning
        assert listed[name].startswith(json.dumps(DEFAULTS[name]) + " ")
        assert listed[name].endswith(meaning)


def test_help_config_in_pretrain_and_tools_finetune(capsys):
    from ernie_doc.cli.pretrain import main as pretrain
    from tools.finetune import main as tools_finetune
    for main in (pretrain, tools_finetune):
        assert main(["--help-config"]) == 0
        out = capsys.readouterr().out
        assert all(f"  {key} " in out for key in DEFAULTS)


def test_finetune_help_names_help_config_and_set(capsys):
    from ernie_doc.cli.finetune import parse_args
    with pytest.raises(SystemExit) as info:
        parse_args(["--help"])
    assert info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--help-config" in out and "--set key=value" in out


def test_the_command_line_gives_one_line_with_the_suggestion(tmp_path, capsys):
    from ernie_doc.cli.finetune import main
    with pytest.raises(SystemExit) as info:
        main(["--set", "task=longdep", f"output_dir={tmp_path / 'out'}", "num_train_epochs=2"])
    assert info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "unknown key 'num_train_epochs' (did you mean: epochs?)" in lines[0]
    assert not (tmp_path / "out").exists()


def test_the_keys_the_user_set_and_a_fine_tuned_folders_reading(tmp_path):
    """--set keys are the user's (dotted for a map's entry), and a config file's when it sets
    eval_only itself; a training config's are not: eval_only of a folder with task.json reads
    with its settings but those, and says in one line each what was replaced and what won."""
    from ernie_doc.assemble import read_as_trained
    from ernie_doc.training.prepare import fine_tuned_record

    def reading(cfg):
        return read_as_trained(cfg, *fine_tuned_record(cfg))
    packaged = str(ROOT / "tasks" / "imdb" / "config.yaml")
    folder = tmp_path / "best"
    folder.mkdir()
    trained = dict(task="imdb", kind="classification", max_seq_len=128, stride=126,
                   doc_prediction="last", model_overrides={"memory_len": 64})
    (folder / "task.json").write_text(json.dumps({"format": 1, "task": "imdb", "kind":
                                      "classification", "labels": ["0", "1"],
                                      "config": trained}))
    ev = ["eval_only=true", f"init_checkpoint={folder}", "test_splits=[test]"]
    cfg = load_config(packaged, ev + ["stride=100", "model_overrides.memory_len=32"])
    assert cfg.user_keys == {"eval_only", "init_checkpoint", "test_splits", "stride",
                             "model_overrides.memory_len"}
    assert cfg.eval_splits == [] and cfg.test_splits == ["test"]   # what the command names
    values, lines = reading(cfg)
    assert {k: values[k] for k in ("max_seq_len", "doc_prediction", "model_overrides",
                                   "tokenizer")} == {
        "max_seq_len": 128, "doc_prediction": "last", "model_overrides": {"memory_len": 32},
        "tokenizer": ""} and "stride" not in values
    assert lines == [
        f"eval_only: reading as {folder} was trained (its task.json), not as {packaged} says: "
        "max_seq_len 128 (config 512), doc_prediction \"last\" (config \"mean\")",
        f"eval_only: the values given differ from how {folder} was trained (its task.json) "
        "and are used: stride 100 (trained with 126), model_overrides.memory_len 32 (trained "
        "with 64)"]
    # a file written to evaluate (it sets eval_only): its keys are the user's
    write(tmp_path, {"eval.yaml": "task: imdb\neval_only: true\nmax_seq_len: 256\n"})
    cfg = load_config(str(tmp_path / "eval.yaml"), ev[1:])
    assert "max_seq_len" in cfg.user_keys and cfg.eval_splits == []
    values, lines = reading(cfg)
    assert "max_seq_len" not in values and values["stride"] == 126
    assert lines[-1].endswith("are used: max_seq_len 256 (trained with 128)")
    # eval_splits named too, or test_splits not named: both evaluated; no task.json: no change
    assert load_config(packaged, ev + ["eval_splits=[dev]"]).eval_splits == ["dev"]
    assert load_config(packaged, ev[:2]).eval_splits == ["dev"]
    # a weights file in the folder, or in its params/, is that folder's model
    (folder / "model.safetensors").write_bytes(b"")
    (folder / "params").mkdir()
    (folder / "params" / "model.safetensors").write_bytes(b"")
    for weights in (folder / "model.safetensors", folder / "params",
                    folder / "params" / "model.safetensors"):
        found, record = fine_tuned_record(load_config(packaged, [
            "eval_only=true", f"init_checkpoint={weights}", "test_splits=[test]"]))
        assert os.path.samefile(found, folder) and record["config"] == trained
    (folder / "task.json").unlink()
    assert fine_tuned_record(load_config(packaged, ev)) is None
    assert fine_tuned_record(load_config(packaged, ev[:1] + [
        f"init_checkpoint={folder / 'model.safetensors'}"])) is None


def test_eval_only_scores_the_splits_the_user_names(tmp_path):
    """eval_only: a split key the user sets with a split in it empties the other one when the
    user did not set it (THUCNews' packaged test_splits [test] is not scored with
    eval_splits=[dev], as IMDB's eval_splits [dev] is not with test_splits=[test]); naming
    none, or an empty list, keeps the config's; training is unchanged."""
    packaged = str(ROOT / "tasks" / "thucnews" / "config.yaml")
    ev = ["eval_only=true", "init_checkpoint=x"]

    def splits(path, *given):
        cfg = load_config(path, list(given))
        return cfg.eval_splits, cfg.test_splits
    assert splits(packaged, *ev, "eval_splits=[dev]") == (["dev"], [])
    assert splits(packaged, *ev, "test_splits=[test]") == ([], ["test"])
    assert splits(packaged, *ev, "eval_splits=[dev]", "test_splits=[test]") == (["dev"], ["test"])
    assert splits(packaged, *ev) == (["dev"], ["test"])
    assert splits(packaged, *ev, "eval_splits=[]") == ([], ["test"])
    assert splits(packaged, "eval_splits=[dev]") == (["dev"], ["test"])   # training
    # a file written to evaluate names its splits: the packaged config is not read then
    write(tmp_path, {"eval.yaml": "task: thucnews\neval_only: true\ntest_splits: [test]\n"})
    assert splits(str(tmp_path / "eval.yaml"), "init_checkpoint=x") == ([], ["test"])
    assert splits(str(tmp_path / "eval.yaml"), "init_checkpoint=x", "eval_splits=[dev]") == (
        ["dev"], ["test"])


def test_a_fine_tuned_folders_reader_options_that_change_the_text(tmp_path):
    """Of `reader`, the options that change the text the model reads (READING_KEYS' reader.*:
    OpenKP's remove_urls ...) are read as trained, entry by entry; those saying where the data
    is (files, dev_ratio ...) stay the config's; another task's reader options do not apply."""
    from ernie_doc.assemble import read_as_trained
    from ernie_doc.run_config import READING_KEYS, is_reading_key
    folder = tmp_path / "best"
    folder.mkdir()
    trained = dict(task="openkp", kind="keyphrase", max_seq_len=128, stride=128,
                   task_options={"top_k": 5, "empty_phrases": "keep"},
                   reader={"remove_urls": False, "files": {"dev": "mine.jsonl"}})
    record = {"format": 1, "task": "openkp", "kind": "keyphrase", "labels": [],
              "config": trained}
    packaged = str(ROOT / "tasks" / "openkp" / "config.yaml")
    ev = ["eval_only=true", f"init_checkpoint={folder}", "eval_splits=[dev]"]
    cfg = load_config(packaged, ev + ["reader.files.dev=theirs.jsonl"])
    values, lines = read_as_trained(cfg, str(folder), record)
    assert values["reader"] == {"files": {"dev": "theirs.jsonl"}, "remove_urls": False}
    assert lines == [f"eval_only: reading as {folder} was trained (its task.json), not as "
                     f"{packaged} says: max_seq_len 128 (config 512), reader.remove_urls "
                     f"false (config not set)"]
    cfg = load_config(packaged, ev + ["reader.remove_urls=true"])
    values, lines = read_as_trained(cfg, str(folder), record)
    assert values["reader"] == {"remove_urls": True}
    assert lines[-1].endswith("are used: reader.remove_urls true (trained with false)")
    # the run left it to the reader: the config's value goes, and the line says so
    del trained["reader"]["remove_urls"]
    cfg = load_config(packaged, ev)
    cfg = replace(cfg, reader={"remove_urls": False, "dev_ratio": 0.5})
    values, lines = read_as_trained(cfg, str(folder), record)
    assert values["reader"] == {"dev_ratio": 0.5}
    assert lines[0].endswith("reader.remove_urls not set (config false)")
    # another task's data: its reader's options are its own
    cfg = load_config(str(ROOT / "tasks" / "iflytek" / "config.yaml"), ev)
    cfg = replace(cfg, reader={"remove_spaces": False})
    trained["reader"] = {"remove_spaces": True}
    values, lines = read_as_trained(cfg, str(folder), record)
    assert "reader" not in values and not any("reader." in line for line in lines)
    assert is_reading_key("reader.remove_spaces") and is_reading_key("model_overrides.x")
    assert not is_reading_key("reader.files") and not is_reading_key("reader.dev_ratio")
    assert "reader" not in READING_KEYS   # where the data is belongs to the data evaluated


def test_load_config_gives_the_frozen_typed_config():
    """load_config → a TrainConfig, frozen; its fields are the key table (DEFAULTS, GROUP_STARTS,
    --help-config), each with a meaning; with_values is a checked copy."""
    from ernie_doc.run_config import with_values
    from ernie_doc.run_keys import KEYS, TrainConfig
    cfg = load_config(None, ["task=longdep", "epochs=2"])
    assert type(cfg) is TrainConfig and cfg.user_keys == {"task", "epochs"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.epochs = 9
    assert [f.name for f in KEYS] == list(DEFAULTS) == list(cfg.as_dict())
    fresh = TrainConfig()
    for f in KEYS:
        assert f.metadata["meaning"] and getattr(fresh, f.name) == DEFAULTS[f.name], f.name
    assert fresh.eval_splits is not TrainConfig().eval_splits   # a list default is not shared
    copy = cfg.as_dict()
    copy["reader"]["x"] = 1
    assert "x" not in cfg.reader
    new = with_values(cfg, {"epochs": 5, "eval_splits": "dev"})
    assert (new.epochs, new.eval_splits, cfg.epochs) == (5, ["dev"], 2)
    assert (new.source, new.user_keys) == (cfg.source, cfg.user_keys)
    with pytest.raises(ConfigError, match="overrides: epochs: must be"):
        with_values(cfg, {"epochs": 0})
