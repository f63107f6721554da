"""A task kind is a name in a closed registry (ernie_doc.kinds), never code to import.

A saved model folder is downloaded and shared: its task.json's `config.kind` (and a run's
run_config.yaml `kind`, and `--set kind=...`) once went to importlib as "module:Class", so a
folder holding `payload.py` with `kind: mdl.payload:Evil` ran the payload. Each case here plants
that payload (it writes a canary file when imported or called) and checks that the canary never
appears, that the refusal is one line listing the known kinds and, for the commands, exit 2
with nothing written. One tiny classifier (helpers.tiny_classifier) serves every case."""
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml
from helpers import ROOT, tiny_classifier, tiny_export

from ernie_doc import kinds
from ernie_doc.errors import ConfigError, PipelineError
from ernie_doc.predict.pipeline import Pipeline, pipeline
from ernie_doc.run_config import config_from_values, load_config, load_yaml

KNOWN = ("classification", "hotpotqa", "keyphrase", "language_model", "multiple_choice",
         "pair_matching", "pretraining", "span")
HOSTILE = ("{folder}.payload:Evil", "this:x", "builtins:print", "os:system",
           "no_such_module_here:Task", "payload")


def payload(folder, canary):
    """`folder/payload.py`: writes `canary` when imported and when its Evil is called."""
    (folder / "payload.py").write_text(
        "import pathlib\n"
        f"pathlib.Path({str(canary)!r}).write_text('imported')\n"
        "class Evil:\n"
        "    def __init__(self, *args):\n"
        f"        pathlib.Path({str(canary)!r}).write_text('called')\n", encoding="utf-8")


def tree_digest(root):
    """{relative path: sha256} of every file under root."""
    out = {}
    for directory, _, files in os.walk(root):
        for name in files:
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


def assert_refused(message, value):
    """One line naming the kind and listing every known kind."""
    assert "\n" not in message, message
    assert repr(value) in message and "is not a task kind" in message, message
    assert ", ".join(KNOWN) in message, message


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The tiny classifier's run folder and an export of its best/."""
    root = tmp_path_factory.mktemp("kinds")
    run = tiny_classifier(root)
    export = tiny_export(run / "best", root / "export" / "model")
    return run, export


def hostile_copy(source, folder, kind):
    """A copy of a saved model folder at `folder`, with payload.py and task.json's kind (the
    record's and its config's) set to `kind` → the canary path (absent)."""
    shutil.copytree(source, folder)
    canary = folder.parent / f"canary-{folder.name}"
    payload(folder, canary)
    record = json.loads((folder / "task.json").read_text())
    record["kind"] = record["config"]["kind"] = kind
    (folder / "task.json").write_text(json.dumps(record))
    return canary


def test_the_shipped_configs_name_registered_kinds():
    configs = sorted((ROOT / "tasks").glob("*/config*.yaml"))
    assert len(configs) >= 17
    for path in configs:
        kind = load_yaml(str(path))["kind"]
        assert kinds.kind_name(kind) == kind, path
    assert kinds.kind_names() == list(KNOWN)
    assert kinds.kind_class("hotpotqa").__name__ == "HotpotTask"
    assert kinds.kind_class("keyphrase").__name__ == "KeyphraseTask"
    assert kinds.kind_class("span").__name__ == "SpanTask"


@pytest.mark.parametrize("task, spelling", [("hotpotqa", "tasks.hotpotqa.task:HotpotTask"),
                                            ("openkp", "tasks.openkp.task:KeyphraseTask")])
def test_module_class_spellings_of_task_kinds_are_refused(tmp_path, task, spelling):
    """A "module:Class" kind, even one naming a task folder's own kind class, is not a kind's
    name: one line naming the file and the key, listing the known kinds."""
    given = load_yaml(str(ROOT / "tasks" / task / "config.yaml"))
    given.update(kind=spelling, data_dir="", output_dir=str(tmp_path / "out"))
    with pytest.raises(ConfigError) as info:
        config_from_values(given, "best/task.json")
    message = str(info.value)
    assert message.startswith("best/task.json: kind: "), message
    assert_refused(message, spelling)


@pytest.mark.parametrize("kind", HOSTILE)
def test_a_model_folder_kind_is_never_imported(saved, tmp_path, monkeypatch, capsys, kind):
    """Pipeline.from_pretrained('mdl') from the folder that holds mdl/ (so `mdl.payload` is
    importable, as in an interactive session): refused in one line, no canary, no output."""
    run, _ = saved
    kind = kind.format(folder="mdl")
    canary = hostile_copy(run / "best", tmp_path / "mdl", kind)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    had_this = "this" in sys.modules
    with pytest.raises(PipelineError) as info:
        Pipeline.from_pretrained("mdl")
    assert_refused(str(info.value), kind)
    assert not canary.exists()
    assert ("this" in sys.modules) == had_this   # import this prints the Zen of Python
    assert capsys.readouterr().out == ""         # builtins:print would print the config


def test_an_export_folder_kind_is_never_imported(saved, tmp_path, monkeypatch):
    _, export = saved
    canary = hostile_copy(export, tmp_path / "exp", "exp.payload:Evil")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PipelineError) as info:
        pipeline("exp")
    assert_refused(str(info.value), "exp.payload:Evil")
    assert not canary.exists()


def run_cli(args, cwd):
    """`python -m ernie_doc.cli ...` in `cwd` (which -m puts first on sys.path)."""
    return subprocess.run([sys.executable, "-m", "ernie_doc.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))


def test_predict_refuses_a_model_folder_kind(saved, tmp_path):
    run, _ = saved
    canary = hostile_copy(run / "best", tmp_path / "mdl", "mdl.payload:Evil")
    (tmp_path / "in.txt").write_text("good movie\n", encoding="utf-8")
    before = tree_digest(tmp_path)
    proc = run_cli(["predict", "mdl", "--input", "in.txt", "--output", "out.jsonl",
                    "--no-progress"], tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    assert_refused(lines[0], "mdl.payload:Evil")
    assert not canary.exists()
    assert tree_digest(tmp_path) == before   # no output, nothing changed


def test_finetune_resume_refuses_a_run_config_kind(saved, tmp_path):
    run, _ = saved
    shutil.copytree(run, tmp_path / "run", symlinks=True)
    canary = tmp_path / "canary"
    payload(tmp_path / "run", canary)
    config = tmp_path / "run" / "run_config.yaml"
    values = yaml.safe_load(config.read_text())
    values["kind"] = "run.payload:Evil"
    config.write_text(yaml.safe_dump(values, sort_keys=False))
    before = tree_digest(tmp_path)
    proc = run_cli(["finetune", "--resume", "run"], tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "run_config.yaml: kind: " in lines[0], proc.stderr[-3000:]
    assert_refused(lines[0], "run.payload:Evil")
    assert not canary.exists()
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize("kind", HOSTILE + ("spam",))
def test_set_kind_is_checked_before_anything_is_written(tmp_path, monkeypatch, capsys, kind):
    from ernie_doc.cli import finetune
    kind = kind.format(folder="here")
    (tmp_path / "here").mkdir()
    canary = tmp_path / "canary"
    payload(tmp_path / "here", canary)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SystemExit) as info:
        finetune.main(["imdb", "--set", f"kind={kind}", "output_dir=out", "data_dir=."])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "kind: " in err[0], err
    assert_refused(err[0], kind)
    if kind == "spam":
        assert "(did you mean 'span'?)" in err[0]
    assert not canary.exists() and not (tmp_path / "out").exists()


def test_a_misspelt_task_name_gets_the_nearest(tmp_path):
    """Every place a task's name is looked up (a config's `task:`, predict's --task; the
    command's positional name: tests/test_cli.py) says which task is nearest, whatever the
    case of the name ('CMRC' had no hint)."""
    from ernie_doc.errors import DataError
    from ernie_doc.kinds.base import load_reader
    from ernie_doc.predict.model_folder import task_record
    with pytest.raises(DataError, match=r"^task 'imbd': no tasks/imbd/reader\.py \(did you "
                                        r"mean 'imdb'\?\)$"):
        load_reader("imbd")
    with pytest.raises(PipelineError, match=r"^task 'cmrc': not a task folder \(did you mean "
                                            r"'cmrc2018'\?\) \(one of c3, "):
        task_record(str(tmp_path), "cmrc")   # a save_pretrained folder: no task.json
    with pytest.raises(DataError, match=r"^task 'CMRC': no tasks/CMRC/reader\.py \(did you "
                                        r"mean 'cmrc2018'\?\)$"):
        load_reader("CMRC")   # case is ignored, the hint spells the folder's name
    with pytest.raises(DataError) as info:
        load_reader("zzzz")
    assert "did you mean" not in str(info.value)


def test_kind_names_are_looked_up_not_imported(tmp_path, monkeypatch):
    """The registry itself: a "module:Class" string is a name like any other."""
    (tmp_path / "pkg").mkdir()
    canary = tmp_path / "canary"
    payload(tmp_path / "pkg", canary)
    monkeypatch.syspath_prepend(str(tmp_path))
    for value in ("pkg.payload:Evil", "pkg.payload", ["span"], None, ""):
        with pytest.raises(ValueError, match="is not a task kind"):
            kinds.kind_class(value)
    with pytest.raises(ConfigError, match=r"^overrides: kind: 'pkg.payload:Evil' is not"):
        load_config(None, ["task=imdb", "kind=pkg.payload:Evil"])
    assert not canary.exists()
    with pytest.raises(ValueError, match="is a built-in kind"):
        kinds.register_kind("span")(type("Other", (), {}))


def gpu_usable():
    import paddle
    return paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0


@pytest.mark.skipif(gpu_usable(), reason="a GPU is usable here")
def test_device_gpu_without_a_gpu_is_one_line(saved, tmp_path, monkeypatch, capsys):
    from ernie_doc.cli import finetune
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        finetune.main(["imdb", "--set", "device=gpu", "output_dir=out", "data_dir=."])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "device: gpu: " in err[0], err
    assert not (tmp_path / "out").exists()
    run, _ = saved
    with pytest.raises(PipelineError) as error:
        Pipeline.from_pretrained(str(run / "best"), device="gpu")
    assert "gpu" in str(error.value) and "\n" not in str(error.value)


def test_saved_models_record_their_tokenizer_type(saved):
    """best/ holds tokenizer_config.json: the folder loads as the run's tokenizer type, or
    not at all (ernie_doc.tokenization.auto)."""
    run, export = saved
    for folder in (run / "best", export):
        record = json.loads((folder / "tokenizer_config.json").read_text())
        assert record["tokenizer_class"] == "WordPieceTokenizer", folder


@pytest.mark.parametrize("package", ["tasks", "ernie_doc_tasks"])
def test_a_tasks_package_in_the_current_directory_is_never_imported(tmp_path, package):
    """`python -m` puts the current directory on sys.path: a `tasks/` or `ernie_doc_tasks/`
    package there, even one carrying our marker, is neither imported nor taken for the task
    folders."""
    canary = tmp_path / "canary"
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text(
        f"ERNIE_DOC_TASKS = True\nopen({str(canary)!r}, 'w').write('imported')\n")
    code = ("from ernie_doc.kinds.folders import task_names, task_package\n"
            "from ernie_doc.auto import head_names\n"
            "from ernie_doc.kinds.base import load_reader\n"
            "load_reader('imdb')\n"
            "print(task_package(), 'imdb' in task_names(), len(head_names()) > 0)")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ernie_doc_tasks", "True", "True"]
    assert not canary.exists()


# == one protocol: kinds are asked, never named ================================================
def kind_name_tests(source, names):
    """[(line, what)] of `source` that tests a kind by name: a comparison (==, !=, in, not in)
    or a `match` case with a kind name as a string literal (alone or in a literal tuple, list
    or set), a tuple / list / set of kind names only or a dict keyed by two or more of them
    only (a table of kinds, wherever it sits; {"pretraining": ...} may be a head's), a
    module-level alias of a kind name, an expression ending in `kind` compared with, or tested
    to start or end with, a part of a kind name, or the `builds_model` flag. One per line."""
    import ast

    def named(node):
        if isinstance(node, ast.Constant):
            return node.value in names
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(named(e) for e in node.elts)
        return False

    def part(node):   # "lang": a piece of a kind name, not a whole one
        return isinstance(node, ast.Constant) and isinstance(node.value, str) and \
            len(node.value) >= 3 and any(node.value in n and node.value != n for n in names)

    def kind_valued(node):   # kind, cfg.kind, record["kind"], record.get("kind")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            return node.func.attr == "get" and [ast.unparse(a) for a in node.args] == ["'kind'"]
        key = node.slice if isinstance(node, ast.Subscript) else None
        return getattr(node, "id", getattr(node, "attr", None)) == "kind" or (
            isinstance(key, ast.Constant) and key.value == "kind")

    found = {}
    module = ast.parse(source)
    for node in ast.walk(module):
        line, what = getattr(node, "lineno", 0), None
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(named(n) for n in sides) or (any(kind_valued(n) for n in sides) and
                                                any(part(n) for n in sides)):
                what = ast.unparse(node)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("startswith", "endswith") and kind_valued(node.func.value) \
                and any(part(a) for a in node.args):
            what = ast.unparse(node)
        elif isinstance(node, ast.match_case) and isinstance(node.pattern, ast.MatchValue) \
                and named(node.pattern.value):
            line, what = node.pattern.lineno, f"case {ast.unparse(node.pattern.value)}"
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and node.elts and \
                all(named(e) for e in node.elts):
            what = ast.unparse(node)
        elif isinstance(node, ast.Dict) and len(node.keys) > 1 and \
                all(k is not None and named(k) for k in node.keys):
            what = ast.unparse(node)
        elif isinstance(node, (ast.Name, ast.Attribute, ast.arg, ast.FunctionDef)) and \
                "builds_model" in (getattr(node, "id", None), getattr(node, "attr", None),
                                   getattr(node, "arg", None), getattr(node, "name", None)):
            what = "builds_model"
        if what is not None:
            found.setdefault(line, what)
    for node in module.body:   # an alias of a kind name, compared under another name
        if isinstance(node, ast.Assign) and named(node.value):
            found.setdefault(node.lineno, ast.unparse(node))
    return sorted(found.items())


# the names compared outside the registry that are not a kind's test, and why
NOT_KIND_TESTS = {
    ("ernie_doc/cli/export.py", "args.head == 'multiple_choice'"): "a head of auto's registry",
    # config.py sits below kinds/ (it may not import them): a folder saved before
    # tokenizer_config.json recorded segment_layout has it only in its classifier's task.json
    ("ernie_doc/config.py", "record.get('kind') == 'classification'"): "an old task.json",
    # an LMPipeline may be built without a run's config: its records name the kind themselves
    ("ernie_doc/explain/lm.py", "KIND = 'language_model'"): "written in a record, not compared",
}


def test_kind_names_are_compared_in_the_registry_only():
    """Outside ernie_doc/kinds/__init__.py, code asks a kind's class (kinds.kind_class, its
    facts and methods), never compares its name: the package, tools/ and benchmarks/."""
    assert set(KNOWN) == set(kinds.kind_names())
    registry = ROOT / "ernie_doc" / "kinds" / "__init__.py"
    wrong = []
    for top in ("ernie_doc", "tools", "benchmarks"):
        for path in sorted((ROOT / top).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if path == registry:
                continue
            wrong += [f"{name}:{line}: {what}" for line, what in kind_name_tests(
                path.read_text(encoding="utf-8"), KNOWN) if (name, what) not in NOT_KIND_TESTS]
    assert not wrong, "kind names compared outside the registry:\n" + "\n".join(wrong)


def test_the_kind_name_check_finds_what_it_forbids():
    source = ('if cfg.kind == "language_model": pass\n'
              'if kind != "pretraining": pass\n'
              'if cfg.kind in ("pretraining", "span"): pass\n'
              'STREAMED = ("pretraining", "language_model")\n'
              'if task.builds_model: pass\n'
              'if record["kind"] == name or mode == "pretrain": pass\n'
              'heads = {"pretraining": 1}\n'
              'if cfg.kind in {"language_model"}: pass\n'
              'if cfg.kind.startswith("lang") or record["kind"].endswith("_model"): pass\n'
              'LM = "language_model"\n'
              'if kind == LM: pass\n'
              'match cfg.kind:\n'
              '    case "span":\n'
              '        pass\n'
              'TABLE = {"qa": ("span", "hotpotqa")}\n'
              'ok = record["kind"] in TABLE["qa"] or "lm" in task.name\n'
              'if "pretrain" in record.get("kind"): pass\n'
              'if value.dtype.kind in "iu" or kind == "missing": pass\n'
              'run = {"span": 1, "pretraining": 2}[cfg.kind]\n')
    assert [line for line, _ in kind_name_tests(source, KNOWN)] == [1, 2, 3, 4, 5, 8, 9, 10,
                                                                    13, 15, 17, 19]


def test_hugging_face_tasks_are_read_from_the_kinds():
    """pipeline("question-answering", model=RUN) checks the model's kind by its
    `pipeline_tasks`; the kinds doing each task, as its error lists them (built-in first)."""
    from ernie_doc.predict.pipeline import HF_TASKS
    order = dict.fromkeys([*kinds.builtin_kinds(), *kinds.kind_names()])
    doing = {task: [name for name in order if task in kinds.kind_class(name).pipeline_tasks]
             for task in HF_TASKS}
    assert doing == {"text-classification": ["classification", "pair_matching"],
                     "sentiment-analysis": ["classification"],
                     "question-answering": ["span", "hotpotqa"],
                     "multiple-choice": ["multiple_choice"],
                     "token-classification": ["keyphrase"]}


def test_a_kind_registered_from_outside_runs_like_the_one_it_extends(saved, tmp_path,
                                                                     monkeypatch):
    """A DocumentTask subclass a plugin registers (register_kind, as tasks/hotpotqa does) gets
    the protocol (read_inputs, build_model, build_splits, describe, load_saved) for free:
    trained, evaluated and predicted under its own name, it writes what the kind it extends
    writes, but for that name."""
    from ernie_doc.kinds.classification import ClassificationTask
    run, _ = saved
    monkeypatch.setattr(kinds, "_kinds", dict(kinds._kinds))   # the registry as it was after
    kinds.register_kind("plugged")(type("PluggedTask", (ClassificationTask,), {}))
    plugged = tiny_classifier(tmp_path, "kind=plugged")
    for name in ("eval_results.json", "predictions_test.jsonl"):
        assert (plugged / name).read_text() == (run / name).read_text(), name
    record = json.loads((plugged / "best" / "task.json").read_text())
    assert record["kind"] == record["config"]["kind"] == "plugged"
    from ernie_doc.cli import finetune
    finetune.main(["imdb", "--set", f"data_dir={tmp_path / 'imdb'}", "kind=plugged",
                   f"output_dir={tmp_path / 'eval'}", f"init_checkpoint={plugged / 'best'}",
                   "eval_only=true", "eval_splits=[test]", "progress=false"])
    assert json.loads((tmp_path / "eval" / "test_results.json").read_text())["accuracy"] == \
        json.loads((run / "eval_results.json").read_text())["accuracy"]
    texts = ["good movie", "awful plot, poor actor"]
    assert Pipeline.from_pretrained(str(plugged))(texts) == \
        Pipeline.from_pretrained(str(run))(texts)
    with pytest.raises(PipelineError, match="a plugged model .* not one for 'question-an"):
        pipeline("question-answering", model=str(plugged))
