"""One error hierarchy: every error the package raises for bad input derives from
ErnieDocError (ernie_doc/errors.py, a module that imports nothing of the package), and the
command line turns one into its one `error:` line and exit status in one place."""
import ast
import collections
import importlib
import inspect
import re
import subprocess
import sys

import pytest
from helpers import ROOT

from ernie_doc import cli, errors
from ernie_doc.errors import CheckpointError, ErnieDocError, HubError, TrainingError

PUBLIC = [c for _, c in inspect.getmembers(errors, inspect.isclass)
          if c.__module__ == errors.__name__]
# what a user's `except ValueError` / `except RuntimeError` around our API relies on
VALUE_ERRORS = {"ConfigError", "UntrainedHead", "DataError", "NotSet", "TokenizerError",
                "CheckpointError", "LoDTensorFormatError", "HubError", "PipelineError",
                "ExportError", "PredictorInputError", "EngineError", "OutputError",
                "ModelInputError", "SegmenterError"}
RUNTIME_ERRORS = {"TrainingError", "Bf16ProgramError", "CheckpointStateError"}
# exceptions that never leave their module (turned into one of ours there), and the
# benchmarks' own failures (reported by the benchmark itself)
INTERNAL = {"_Refused", "_Stopped", "_LongInteger", "ContenderError", "PretrainRunError",
            "Interrupted", "InterruptedEarly"}


def test_every_public_error_derives_from_the_base():
    assert len(PUBLIC) >= 17
    for cls in PUBLIC:
        assert issubclass(cls, ErnieDocError), cls
        assert cls.__doc__, cls
    names = {c.__name__ for c in PUBLIC}
    assert VALUE_ERRORS | RUNTIME_ERRORS <= names
    for name in VALUE_ERRORS:
        assert issubclass(getattr(errors, name), ValueError), name
    for name in RUNTIME_ERRORS:
        assert issubclass(getattr(errors, name), RuntimeError), name
    # from_pretrained's one error for a path it cannot load, fetched or not
    assert issubclass(HubError, CheckpointError)
    assert ErnieDocError.exit_status == 2 and TrainingError.exit_status == 1


def test_no_error_class_is_defined_elsewhere():
    """An exception class in the package is defined in errors.py, or is internal (above)."""
    found = []
    for path in sorted((ROOT / "ernie_doc").rglob("*.py")):
        if path.name == "errors.py" and path.parent.name == "ernie_doc":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.name not in INTERNAL and any(
                    re.search(r"(Error|Exception|Interrupt)$", ast.unparse(base))
                    for base in node.bases):
                found.append(f"{path.relative_to(ROOT)}: {node.name}")
    assert not found, found


def test_errors_module_imports_nothing_of_the_package():
    tree = ast.parse((ROOT / "ernie_doc" / "errors.py").read_text(encoding="utf-8"))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"typing"}, imported
    code = ("import sys, ernie_doc.errors; print(sorted(m for m in sys.modules "
            "if m.startswith(('ernie_doc', 'paddle'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert out.strip() == "['ernie_doc', 'ernie_doc._version', 'ernie_doc.errors']", out


def _raiser(error):
    def entry(argv=None):
        raise error
    return entry


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_any_subcommand_error_is_one_line(name, monkeypatch, capsys):
    """An ErnieDocError escaping any subcommand: one `error:` line and its exit status; with
    --debug its traceback instead."""
    module = importlib.import_module(cli.COMMANDS[name][0])
    attr = "command" if hasattr(module, "command") else "main"
    monkeypatch.setattr(module, attr, _raiser(errors.DataError("x.jsonl:3: no text")))
    capsys.readouterr()
    assert cli.main([name, "x"]) == 2
    assert capsys.readouterr().err == "error: x.jsonl:3: no text\n"
    monkeypatch.setattr(module, attr, _raiser(TrainingError("the loss is nan at step 3")))
    assert cli.main([name, "x"]) == 1
    assert capsys.readouterr().err == "error: the loss is nan at step 3\n"
    with pytest.raises(TrainingError):
        cli.main([name, "x", "--debug"])


def test_a_command_reports_its_own_errors(capsys, tmp_path):
    """exit_on_user_error, a command's except clause: ours and a failed write are one line
    (the status ours says), anything else returns for the caller to re-raise (a bug keeps its
    traceback), and so does everything under --debug."""
    def handled(error, debug=False):
        try:
            raise error
        except cli.user_error_types() as e:
            with pytest.raises(SystemExit) as info:
                cli.exit_on_user_error(e, debug, str(tmp_path / "out"))
            return info.value.code, capsys.readouterr().err

    assert handled(errors.ConfigError("c.yaml:2: unknown key 'x'")) == \
        (2, "error: c.yaml:2: unknown key 'x'\n")
    assert handled(TrainingError("nan")) == (1, "error: nan\n")
    assert handled(errors.PipelineError("m" * 5000))[1].count("m") < 1100   # bounded
    code, err = handled(OSError(28, "No space left on device"))
    assert code == 2 and err == f"error: {tmp_path / 'out'}: cannot write (No space left on " \
                                "device)\n"
    for error, debug in ((KeyError("step"), False), (errors.DataError("d"), True)):
        assert cli.exit_on_user_error(error, debug, str(tmp_path)) is None
    assert capsys.readouterr().err == ""


# Every `raise ValueError` / `raise RuntimeError` left in the package, as (file, function):
# (how many, why it is not one of ours). Bad input raises one of ours; these are not bad input.
BUILTIN_RAISES = {
    ("data/schedule.py", "RowScheduler.step"):
        (1, "invariant: our segmenters give every document a segment"),
    ("data/schedule.py", "schedule_rows"):
        (1, "invariant: our segmenters give every document a segment"),
    ("data/segment.py", "pack_row"):
        (1, "invariant: its callers cut the parts to fit the row first"),
    ("explain/lm.py", "parse_span"):
        (1, "control flow: caught on the next lines, where it becomes the DataError"),
    ("explain/render.py", "figure_names"):
        (1, "a wrong call by our code: the index comes from our own records"),
    ("hub/archive.py", "_parts"):
        (7, "a reason fragment: extract turns it into a HubError naming the archive member"),
    ("hub/cache.py", "_read_checksums"):
        (2, "a reason fragment: the caller turns it into a HubError naming the file"),
    ("hub/cache.py", "_read_manifest"):
        (3, "a reason fragment: the caller turns it into a HubError naming the manifest"),
    ("lm/adaptive.py", "ProjectedAdaptiveLogSoftmax.tie_to"):
        (1, "a wrong call by our code: the model ties layers it built from one config"),
    ("lm/adaptive.py", "_share"):
        (1, "invariant of paddle's ParameterList that this code relies on"),
    ("metrics/classification.py", "aggregate_segments"):
        (1, "invariant: every document a task predicts has a segment"),
    ("tokenization/sentences.py", "split_sentences"):
        (1, "use_nltk=True without nltk: documented as RuntimeError, a missing dependency"),
    ("training/compiled.py", "CompiledForward.__call__"):
        (1, "a wrong call by our code: evaluation calls the model itself"),
    ("kinds/__init__.py", "register_kind.register_class"):
        (1, "a wrong call by a task folder's code: it registers a built-in kind's name"),
    ("kinds/base.py", "aggregate_rows"):
        (1, "invariant: every document a task predicts has a segment"),
    ("kinds/folders.py", "register"):
        (1, "a wrong call by a task folder's code: it registers one name twice"),
    ("training/outdir.py", "claim"):
        (1, "a wrong call by our code: the run claims only the names it writes"),
}


def _builtin_raises(node, where=""):
    """Counter {qualified function name: how many} of the `raise ValueError(...)` / `raise
    RuntimeError(...)` statements under `node` (a module, class or function)."""
    found = collections.Counter()
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found += _builtin_raises(child, f"{where}{child.name}.")
        elif isinstance(child, ast.Raise) and child.exc is not None:
            exc = child.exc.func if isinstance(child.exc, ast.Call) else child.exc
            if isinstance(exc, ast.Name) and exc.id in ("ValueError", "RuntimeError"):
                found[where[:-1] or "<module>"] += 1
        else:
            found += _builtin_raises(child, where)
    return found


def test_builtin_raises_are_listed_and_justified():
    """Bad input raises the package's errors: a built-in ValueError / RuntimeError is left
    only where BUILTIN_RAISES says why, and the list is exact (a new one fails, and so does a
    listed one that is gone)."""
    package = ROOT / "ernie_doc"
    found = {}
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for name, count in _builtin_raises(tree).items():
            found[(path.relative_to(package).as_posix(), name)] = count
    listed = {key: count for key, (count, _) in BUILTIN_RAISES.items()}
    assert found == listed, {"new or changed": {k: v for k, v in found.items()
                                                if listed.get(k) != v},
                             "gone": sorted(set(listed) - set(found))}
    assert all(why for _, why in BUILTIN_RAISES.values())
