"""The shape of the library's code, read with ast: no function or method in ernie_doc/ runs over
60 lines (docstring included), and the task contract (the Task classes in ernie_doc/kinds/) is
fully type-hinted."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 60


def functions(path):
    """Every function and method defined in the file at `path`, nested ones included."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [node for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_no_library_function_is_over_60_lines():
    offenders = []
    for path in sorted((ROOT / "ernie_doc").rglob("*.py")):
        for node in functions(path):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_LINES:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} "
                                 f"({length} lines)")
    assert not offenders, f"functions over {MAX_LINES} lines:\n" + "\n".join(offenders)


def missing_hints(method):
    """The parameters (but self/cls) of `method` without an annotation, plus "return" when it
    has no return annotation (__init__ excepted)."""
    args = method.args
    params = args.posonlyargs + args.args + args.kwonlyargs
    params += [arg for arg in (args.vararg, args.kwarg) if arg is not None]
    missing = [arg.arg for arg in params if arg.annotation is None
               and arg.arg not in ("self", "cls")]
    if method.returns is None and method.name != "__init__":
        missing.append("return")
    return missing


def test_the_task_contract_is_fully_type_hinted():
    offenders = []
    for path in sorted((ROOT / "ernie_doc" / "kinds").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for cls in (node for node in tree.body if isinstance(node, ast.ClassDef)):
            for method in cls.body:
                if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                if method.name.startswith("_") and method.name != "__init__":
                    continue
                missing = missing_hints(method)
                if missing:
                    offenders.append(f"{path.name}:{method.lineno} {cls.name}.{method.name}: "
                                     + ", ".join(missing))
    assert not offenders, "task contract methods without type hints:\n" + "\n".join(offenders)
