"""The import graph of ernie_doc/ and tasks/, read from the source (ast, nothing imported).

Every import statement counts, at the top of a module or inside a function (a late import
still ties the two modules together; it only hides the loop until the function runs). An edge
goes to the module an import names:

    import ernie_doc.heads                  → ernie_doc.heads
    from ernie_doc.checkpoint import io     → ernie_doc.checkpoint.io  (a submodule)
    from ernie_doc.checkpoint import names  (idem); from ernie_doc.config import X → config
    from ernie_doc import ErnieDocModel     → ernie_doc.modeling: a name a package's __init__
                                              exports lazily (its `_EXPORTS` table) leads to
                                              the module that table names
    from .head import X                     → the sibling module

Packages: importing `pkg.sub` runs `pkg/__init__.py` first, and an __init__ that re-exports
imports its submodules; that is how packages load, not a loop, so no edge is added from a
submodule to its package. A module that imports the *package* (`from pkg import name`, name
not a submodule) gets an edge to `pkg/__init__.py`, which leads on to the submodules it
re-exports: a submodule that comes back to its own package that way is a loop, and is found.
"""
import ast
import os
import re
import subprocess
import sys

from helpers import ROOT

TOP_PACKAGES = ("ernie_doc", "tasks")


def _module_name(path):
    rel = os.path.relpath(path, ROOT)[:-len(".py")].replace(os.sep, ".")
    return rel[:-len(".__init__")] if rel.endswith(".__init__") else rel


def _modules():
    """{module name: (path, ast tree)} of every .py file under TOP_PACKAGES."""
    out = {}
    for top in TOP_PACKAGES:
        for directory, dirs, files in os.walk(ROOT / top):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(directory, name)
                    with open(path, encoding="utf-8") as f:
                        out[_module_name(path)] = (path, ast.parse(f.read(), path))
    return out


def _lazy_exports(tree):
    """A package __init__'s `_EXPORTS = {name: module}` table (names it imports on first
    access), or {}."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_EXPORTS"
                                                for t in node.targets):
            table = ast.literal_eval(node.value)
            return {k: v for k, v in table.items() if isinstance(v, str)}
    return {}


def _imports(name, path, tree):
    """[(imported module or None for an outside one, name imported or None, line)] of
    every import statement of one module, wherever it stands."""
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, None, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                module = base + ("." + node.module if node.module else "")
            else:
                module = node.module
            found += [(module, alias.name, node.lineno) for alias in node.names]
    return found


def _graph():
    """(edges {module: {module it imports: first line}}, private [(module, line, text)])."""
    modules = _modules()
    exports = {name: _lazy_exports(tree) for name, (path, tree) in modules.items()
               if path.endswith("__init__.py")}
    edges = {name: {} for name in modules}
    private = []
    for name, (path, tree) in modules.items():
        for module, imported, line in _imports(name, path, tree):
            if imported is None:   # import a.b.c: the longest part that is one of ours
                target = module
                while target and target not in modules:
                    target = target.rpartition(".")[0]
            elif f"{module}.{imported}" in modules:   # a submodule
                target = f"{module}.{imported}"
            elif imported in exports.get(module, {}):
                target = exports[module][imported]
            else:
                target = module if module in modules else None
            if not target:
                continue   # the standard library or a third-party package
            edges[name].setdefault(target, line)
            if imported and imported.startswith("_") and not (
                    imported.startswith("__") and imported.endswith("__")):
                private.append((name, line, f"from {module} import {imported}"))
    return edges, private


def _cycles(edges):
    """[(one cycle [a, b, ..., a], every module of its strongly connected component)] for
    each component that has a cycle (Tarjan)."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges[v]:
                components.append(component)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    cycles = []
    for component in components:   # a path back to the start, inside the component
        start = min(component)
        parents, queue = {start: None}, [start]
        while queue:
            v = queue.pop(0)
            back = start in edges[v]
            if back:
                path = [v]
                while parents[path[-1]] is not None:
                    path.append(parents[path[-1]])
                cycles.append((path[::-1] + [start], sorted(component)))
                break
            for w in sorted(edges[v]):
                if w in component and w not in parents:
                    parents[w] = v
                    queue.append(w)
    return cycles


def _describe(found, edges):
    cycle, component = found
    text = " → ".join(f"{a} (line {edges[a][b]})" for a, b in zip(cycle, cycle[1:])) + \
        f" → {cycle[-1]}"
    if len(component) > len(cycle) - 1:
        text += f"\n  (one of the loops among {', '.join(component)})"
    return text


def test_graph_sees_function_level_and_package_imports():
    edges, _ = _graph()
    # a late import inside a function counts (convert.py imports the registry there)
    assert "ernie_doc.auto" in edges["ernie_doc.cli.convert"]
    # `from ernie_doc.checkpoint import io` is the submodule; a lazy export leads to its module
    assert "ernie_doc.checkpoint.io" in edges["ernie_doc.modeling.pretrained"]
    assert "ernie_doc.modeling" in edges["ernie_doc.cli.export"]
    # a task head imports the registry it registers with
    assert "ernie_doc.auto" in edges["tasks.hotpotqa.head"]
    cycle = _cycles({"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}})
    assert cycle == [(["a", "b", "c", "a"], ["a", "b", "c"])]


def test_no_import_cycles():
    edges, _ = _graph()
    cycles = _cycles(edges)
    assert not cycles, "import cycles:\n" + "\n".join(_describe(c, edges) for c in cycles)


def test_checkpoint_package_is_a_leaf():
    """ernie_doc.checkpoint knows formats and names, never a model class."""
    edges, _ = _graph()
    above = ("ernie_doc.heads", "ernie_doc.modeling", "ernie_doc.auto", "ernie_doc.predict.engine",
             "ernie_doc.training", "ernie_doc.lm", "ernie_doc.pretraining", "tasks")
    wrong = [f"{name} imports {target} (line {line})"
             for name, targets in edges.items() if name.startswith("ernie_doc.checkpoint")
             for target, line in targets.items() if target.startswith(above)]
    assert not wrong, "\n".join(wrong)


def test_no_private_names_imported():
    _, private = _graph()
    assert not private, "private names imported from another module:\n" + "\n".join(
        f"{name} line {line}: {text}" for name, line, text in private)


# == layers ====================================================================================
# Each rule: (modules it binds, what they never import). A package's name covers its submodules.
LAYER_RULES = (
    (("ernie_doc.explain", "ernie_doc.predict", "ernie_doc.kinds", "ernie_doc.assemble"),
     ("ernie_doc.training",)),
    # attribution reads a model through the pipeline it is given: `pipeline(...).explain`
    (("ernie_doc.explain",), ("ernie_doc.predict", "ernie_doc.cli")),
    (("ernie_doc.modeling", "ernie_doc.checkpoint", "ernie_doc.hub", "ernie_doc.config"),
     ("ernie_doc.kinds", "ernie_doc.training", "ernie_doc.predict", "ernie_doc.explain",
      "ernie_doc.cli")),
    (("tasks",), ("ernie_doc.training", "ernie_doc.predict", "ernie_doc.explain",
                  "ernie_doc.cli")),
)


def _within(name, prefixes):
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _layer(name):
    """The node of the layer graph a module belongs to: its subpackage of ernie_doc
    (ernie_doc.predict.pipeline → ernie_doc.predict), a top-level module itself
    (ernie_doc.assemble), `tasks` for the task folders."""
    parts = name.split(".")
    return "tasks" if parts[0] == "tasks" else ".".join(parts[:2])


def _layer_graph(edges):
    """{layer: {layer it imports: (module, imported module, line)}}, between layers only."""
    graph = {}
    for name, targets in edges.items():
        for target, line in targets.items():
            a, b = _layer(name), _layer(target)
            graph.setdefault(a, {})
            graph.setdefault(b, {})
            if a != b:
                graph[a].setdefault(b, (name, target, line))
    return graph


def _layer_problems(edges):
    wrong = [f"{name} imports {target} (line {line})"
             for bound, forbidden in LAYER_RULES
             for name, targets in edges.items() if _within(name, bound)
             for target, line in targets.items() if _within(target, forbidden)]
    graph = _layer_graph(edges)
    for cycle, _ in _cycles({a: set(b) for a, b in graph.items()}):
        wrong.append("layer cycle: " + " → ".join(
            f"{a} ({'{} imports {} line {}'.format(*graph[a][b])})"
            for a, b in zip(cycle, cycle[1:])) + f" → {cycle[-1]}")
    return wrong


def test_layers_read_downwards():
    """Prediction, export, attribution (explain/), the task kinds and the assembly never import
    training/; the model, checkpoints, hub and model config know nothing of kinds, training,
    prediction, attribution or the commands; and no two layers (subpackages, top-level
    modules) import each other, directly or around a loop, late imports included."""
    edges, _ = _graph()
    wrong = _layer_problems(edges)
    assert not wrong, "\n".join(wrong)


def test_layer_rules_catch_what_they_forbid():
    """The rules on a made-up graph shaped like the package before predict/ and kinds/:
    prediction on top of training, training's state reading prediction's file name, a model
    config reaching the hub that reaches it back."""
    edges = {"ernie_doc.pipeline": {"ernie_doc.training.prepare": 46},
             "ernie_doc.predict.pipeline": {"ernie_doc.training.prepare": 46},
             "ernie_doc.training.prepare": {"ernie_doc.kinds.base": 39},
             "ernie_doc.training.state": {"ernie_doc.predict.model_folder": 34},
             "ernie_doc.predict.model_folder": {},
             "ernie_doc.explain.engine": {"ernie_doc.training.state": 12},
             "ernie_doc.modeling.model": {"ernie_doc.explain.render": 9},
             "ernie_doc.kinds.base": {},
             "ernie_doc.config": {"ernie_doc.hub.registry": 401},
             "ernie_doc.hub.registry": {"ernie_doc.hub.cache": 1},
             "ernie_doc.hub.cache": {"ernie_doc.checkpoint.io": 655},
             "ernie_doc.checkpoint.io": {"ernie_doc.config": 33}}
    wrong = _layer_problems(edges)
    assert "ernie_doc.predict.pipeline imports ernie_doc.training.prepare (line 46)" in wrong
    assert "ernie_doc.explain.engine imports ernie_doc.training.state (line 12)" in wrong
    assert "ernie_doc.modeling.model imports ernie_doc.explain.render (line 9)" in wrong
    cycles = [w for w in wrong if w.startswith("layer cycle: ")]
    assert any("ernie_doc.predict" in w and "ernie_doc.training" in w for w in cycles), wrong
    assert any("ernie_doc.config" in w and "ernie_doc.hub" in w for w in cycles), wrong


# == the lazy imports ==========================================================================
def _lazy_list():
    """ruff.toml's banned-module-level-imports: the modules imported only inside functions."""
    text = (ROOT / "ruff.toml").read_text(encoding="utf-8")
    block = re.search(r"^banned-module-level-imports = \[(.*?)^\]", text, re.S | re.M).group(1)
    return re.findall(r'"([^"]+)"', "\n".join(line.split("#")[0] for line in block.splitlines()))


def test_the_lazy_modules_of_the_package_import_paddle_at_their_top():
    """An ernie_doc module is on the lazy list only when importing it loads paddle (its top,
    its package's, or a module's they import at theirs): the others are imported at the top."""
    modules, lazy = _modules(), _lazy_list()
    assert "paddle" in lazy
    tops = {name: _top_level_imports(modules, name) for name in modules}
    heavy = {name for name, found in tops.items() if "paddle" in found}
    while True:   # a module is heavy when its package or a module it imports at its top is
        more = {name for name in modules if name not in heavy and (
            tops[name] & heavy or any(name.startswith(h + ".") for h in heavy))}
        if not more:
            break
        heavy |= more
    light = [name for name in lazy if name.startswith("ernie_doc") and name not in heavy]
    assert not light, f"on ruff.toml's lazy list, but paddle-free: {light}"


def test_optional_and_posix_modules_are_never_imported_at_a_top():
    """The lazy list's third-party and POSIX-only entries (matplotlib, visualdl, ...) stay
    inside functions in every module, also in those where ruff's TID253 is off because they
    import paddle at their top (there PLC0415 has no exceptions, so this test holds them)."""
    optional = [m for m in _lazy_list() if m != "paddle" and not m.startswith("ernie_doc")]
    assert "matplotlib" in optional
    found = []
    for name, (path, tree) in _modules().items():
        for node in tree.body:
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path}:{node.lineno}: {n}" for n in names
                      if any(n == m or n.startswith(m + ".") for m in optional)]
    assert not found, found


def _top_level_imports(modules, name):
    """{"paddle" if it imports paddle} | {the modules of ours} `name` imports at its top."""
    path, tree = modules[name]
    body = ast.Module(body=[n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))],
                      type_ignores=[])
    found = set()
    for module, imported, _ in _imports(name, path, body):
        if module.split(".")[0] == "paddle":
            found.add("paddle")
        for target in ([f"{module}.{imported}", module] if imported else [module]):
            if target in modules:
                found.add(target)
                break
    return found


def test_help_does_not_import_paddle():
    """`ernie-doc --help` and the --help of every command that lists no heads answer without
    importing paddle (export, convert and explain list the heads: their registry loads it)."""
    commands = ["", "finetune", "pretrain", "train-tokenizer", "run-document", "predict",
                "context", "download", "plan"]
    code = ("import sys\nfrom ernie_doc.cli import main\n"
            f"for name in {commands!r}:\n"
            "    try:\n        main([name, '--help'] if name else ['--help'])\n"
            "    except SystemExit:\n        pass\n"
            "    if 'paddle' in sys.modules:\n        sys.exit(name or 'ernie-doc')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, f"imports paddle: {proc.stderr[-500:]}"
