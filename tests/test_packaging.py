"""What `pip install .` ships and what the requirement files install, checked without building
or installing anything (CI's .ci/smoke.sh installs the wheel for real): every source folder is
a package setup.py lists, the user's requirements hold no development tool, and the
development files include the user's."""
import os
import re
import runpy
from pathlib import Path

import pytest
import setuptools

ROOT = Path(__file__).resolve().parents[1]
# development tools and the references (PaddleNLP with what it pulls in, nltk): never a user's
# install
DEV_ONLY = {"pytest", "pytest-xdist", "ruff", "isort", "mypy", "paddlenlp", "datasets", "pyarrow",
            "huggingface-hub", "aistudio-sdk", "fastapi", "uvicorn", "nltk"}
PADDLE = {"paddlepaddle", "paddlepaddle-gpu"}


def setup_arguments(root=ROOT):
    """setup.py's keyword arguments, as setup() would get them: run in `root` (pip builds
    there; find_packages reads the working directory) with setup() replaced."""
    seen, saved, cwd = {}, setuptools.setup, os.getcwd()
    setuptools.setup = lambda **kw: seen.update(kw)
    try:
        os.chdir(root)
        runpy.run_path(str(root / "setup.py"), run_name="__main__")
    finally:
        os.chdir(cwd)
        setuptools.setup = saved
    return seen


def source_packages(root=ROOT):
    """The import name of every folder under ernie_doc/ and tasks/ holding .py files (tasks/
    installs as ernie_doc_tasks)."""
    names = set()
    for top, installed in (("ernie_doc", "ernie_doc"), ("tasks", "ernie_doc_tasks")):
        for path in (root / top).rglob("*.py"):
            rel = path.parent.relative_to(root / top)
            if "__pycache__" not in rel.parts:
                names.add(".".join((installed, *rel.parts)))
    return names


def requirements(name, root=ROOT):
    """{distribution name (normalised): pin} of a requirements file, following `-r`."""
    pins = {}
    for line in (root / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-r "):
            pins.update(requirements(line[3:].strip(), root))
            continue
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)==([A-Za-z0-9_.+-]+)", line)
        assert match, f"{name}: {line!r} is not an exact pin"
        pins[re.sub(r"[-_.]+", "-", match.group(1)).lower()] = match.group(2)
    return pins


def missing_packages(root=ROOT):
    return sorted(source_packages(root) - set(setup_arguments(root)["packages"]))


def test_every_source_folder_is_a_package_setup_ships():
    # a folder without __init__.py is left out of the wheel by find_packages, and only an
    # editable install (which maps the checkout) hides it
    assert missing_packages() == []
    assert {"ernie_doc.training", "ernie_doc.cli", "ernie_doc_tasks.imdb"} <= source_packages()


def test_the_check_sees_a_folder_without_init(tmp_path):
    for rel in ("setup.py", "README.md", "ernie_doc/_version.py", "ernie_doc/__init__.py",
                "ernie_doc/training/trainer.py", "tasks/__init__.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((ROOT / rel).read_text())
    assert missing_packages(tmp_path) == ["ernie_doc.training"]


@pytest.mark.parametrize("name", ["requirements.txt", "requirements-gpu.txt"])
def test_the_users_requirements_run_the_model_and_nothing_else(name):
    pins = requirements(name)
    assert not DEV_ONLY & set(pins), f"{name} installs development tools"
    assert len(PADDLE & set(pins)) == 1
    declared = {re.split(r"[<>=\[ ]", r)[0].lower() for r in setup_arguments()["install_requires"]}
    assert not PADDLE & declared   # paddle is the user's choice (CPU or GPU build)
    # what the package declares, plus protobuf (held to the version paddle and paddlenlp share)
    # and visualdl (the run's vdl/ scalars and, through matplotlib, curves.png)
    assert set(pins) - PADDLE == declared | {"protobuf", "visualdl"}


def test_the_development_files_include_the_users():
    user, dev = requirements("requirements.txt"), requirements("requirements-dev.txt")
    assert dev.items() >= user.items()
    assert {"pytest", "pytest-xdist", "ruff", "isort", "mypy", "paddlenlp"} <= set(dev)
    # nltk at ERNIE-Doc's pin, the `nltk` extra's: the tests against nltk run in CI
    assert setup_arguments()["extras_require"]["nltk"] == [f"nltk=={dev['nltk']}"] == \
        ["nltk==3.6.2"]
    # the paddle 2.6.2 development set: the same libraries and tools, paddle 2.6.2
    dev26 = requirements("requirements-paddle26.txt")
    assert dev26.pop("paddlepaddle") == "2.6.2" and dev.pop("paddlepaddle") == "3.3.1"
    assert dev26 == dev
    gpu = requirements("requirements-gpu.txt")
    assert gpu.pop("paddlepaddle-gpu") == "2.6.2"
    assert gpu == {k: v for k, v in user.items() if k != "paddlepaddle"}


def test_the_requirement_files_name_readme_sections_that_exist():
    """A comment's `README "X"` names a heading of README.md."""
    headings = {line.lstrip("#").strip() for line in
                (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
                if line.startswith("## ")}
    named = {(path.name, section) for path in ROOT.glob("requirements*.txt")
             for section in re.findall(r'README "([^"]+)"', path.read_text(encoding="utf-8"))}
    assert named and {(name, s) for name, s in named if s not in headings} == set()


def test_the_missing_paddle_hint_names_the_pinned_builds():
    # the one line `ernie-doc` prints without paddle (CI's smoke sees it in a fresh venv)
    from ernie_doc.cli import PADDLE_MISSING
    cpu, gpu = requirements("requirements.txt"), requirements("requirements-gpu.txt")
    assert f"paddlepaddle=={cpu['paddlepaddle']}" in PADDLE_MISSING
    assert f"paddlepaddle-gpu=={gpu['paddlepaddle-gpu']}" in PADDLE_MISSING


def test_the_benchmarks_stay_in_the_checkout():
    # benchmarks/ is a package of the checkout only: setup.py never ships it, and nothing
    # installed imports it, its PaddleNLP driver or its reference model
    assert (ROOT / "benchmarks" / "__init__.py").is_file()
    assert not any(p == "benchmarks" or p.startswith("benchmarks.")
                   for p in setup_arguments()["packages"])
    pattern = re.compile(r"\bbenchmarks\.|(import|from) benchmarks\b|paddlenlp_driver|"
                         r"ernie_doc\.reference|ernie_doc\.cli\.benchmark")
    for top in ("ernie_doc", "tasks"):
        for path in (ROOT / top).rglob("*.py"):
            found = pattern.search(path.read_text(encoding="utf-8"))
            assert found is None, f"{path.relative_to(ROOT)}: {found.group(0)}"
