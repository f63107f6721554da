"""The documentation's code is executed: every python and shell block of README.md and of
docs/*.md runs as written, one case per block (id `README.md:L<line of the fence>`), in a fresh
workspace holding a copy of tasks/, tools/ and configs/ with the long runs shrunk, the
released names served as tiny checkpoints from a hand-filled cache (offline), and the files
its marker's setups write (tests/readme_fixtures.py). A block is not run only when its marker
says `skip` with a reason; test_not_run_blocks_have_reasons counts them and prints the list. A
block marked `by=tests/test_x.py::test_y` is run as written by that test, with its own
assertions, and not a second time here (test_blocks_run_by_a_test_are_run_there)."""
import re
from pathlib import Path

import pytest
import readme_fixtures as rf

BLOCKS = rf.collect_blocks()
TIMEOUT = 240


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    return rf.Shared(tmp_path_factory.mktemp("readme"))


# a block that starts two ranks joins the suite's two_ranks tests (one worker under xdist:
# two launches at once starve each other's collective start-up on 2 cores)
TWO_RANKS = re.compile(r"fleetrun|--nproc[ =]+\S*\s*2|NPROC=[2-9]")


def _params():
    for block in BLOCKS:
        if block.run_by:
            continue
        marks = [pytest.mark.skip(reason=f"not run: {block.skip_reason}")] \
            if block.skip_reason is not None else []
        if TWO_RANKS.search(block.code):
            marks.append(pytest.mark.two_ranks)
        yield pytest.param(block, id=block.id, marks=marks)


@pytest.mark.parametrize("block", _params())
def test_block_runs(block, shared, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    env = shared.workspace(ws, block.setups)
    env.update(block.env)
    if block.lang == "python":
        script = ws / ".block.py"
        cmd = ["python", str(script)]
    else:
        script = ws / ".block.sh"
        cmd = ["bash", "-e", "-o", "pipefail", str(script)]
    script.write_text(block.code, encoding="utf-8")
    proc = rf.run(cmd, ws, env, timeout=TIMEOUT)
    assert proc.returncode == 0, (
        f"{block.id} ({block.lang}) exited {proc.returncode}\n--- block\n{block.code}"
        f"--- stdout (tail)\n{proc.stdout[-2000:]}\n--- stderr (tail)\n{proc.stderr[-4000:]}")


def test_not_run_blocks_have_reasons(capsys):
    """Every block marked not-run states why; the count and the reasons are printed (the
    report `pytest -s` shows) and the run/not-run totals cover every code block."""
    skipped = [b for b in BLOCKS if b.skip_reason is not None]
    assert all(b.skip_reason.strip() for b in skipped), \
        [b.id for b in skipped if not b.skip_reason.strip()]
    assert BLOCKS, "no code block found"
    elsewhere = [b for b in BLOCKS if b.run_by]
    assert not [b.id for b in elsewhere if b.skip_reason is not None]
    with capsys.disabled():
        print(f"\nREADME code blocks: {len(BLOCKS) - len(skipped) - len(elsewhere)} run here, "
              f"{len(elsewhere)} run by another test, {len(skipped)} not run")
        for b in elsewhere:
            print(f"  {b.id}: run by {b.run_by}")
        for b in skipped:
            print(f"  {b.id}: {b.skip_reason}")


def test_blocks_run_by_a_test_are_run_there():
    """A `by=tests/test_x.py::test_y` marker names a test function that exists and takes the
    block through readme_fixtures.block_run_by (so it runs the block's text as it stands)."""
    marked = [b for b in BLOCKS if b.run_by]
    for block in marked:
        path, _, name = block.run_by.partition("::")
        source = rf.ROOT / path
        assert source.is_file() and re.search(rf"^def {name}\(", source.read_text(
            encoding="utf-8"), re.M), f"{block.id}: by={block.run_by}: no such test"
        text = source.read_text(encoding="utf-8")
        assert "block_run_by(" in text and f'"{block.run_by}"' in text, \
            f"{block.id}: {block.run_by} does not run the block (rf.block_run_by)"
        assert rf.block_run_by(block.run_by) is not None


def test_python_blocks_import_ernie_doc_before_paddle():
    """paddle's own import warns "No ccache found" on stderr; ernie_doc's import silences it
    for what follows, so a block a user copies imports ernie_doc first and prints nothing."""
    late = []
    for block in rf.collect_blocks():
        if block.lang != "python":
            continue
        imports = [line.split()[1].split(".")[0] for line in block.code.splitlines()
                   if re.match(r"(import|from) (paddle|ernie_doc)\b", line)]
        if {"paddle", "ernie_doc"} <= set(imports) and \
                imports.index("paddle") < imports.index("ernie_doc"):
            late.append(block.id)
    assert late == []


def test_every_setup_a_marker_names_exists():
    """A marker names only setups of the fixed registry (a typo fails here, not as a
    puzzling missing file)."""
    for block in BLOCKS:
        assert set(block.setups) <= set(rf.SETUPS), (block.id, block.setups)
        block.env  # noqa: B018  KEY=VALUE words, or a ValueError naming the block


def test_parser_finds_code_not_output(tmp_path):
    """Fences without a language are output; a marker attaches to the fence right below it;
    a stray marker is an error naming its line."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "# t\n\n```\nvariant  accuracy\n```\n\n<!-- test: setup=doc env=\"A=1 B=2\" -->\n"
        "```bash\necho hi\n```\n\n<!-- test: skip reason=\"needs 2 GPUs\" -->\n```python\n"
        "print(1)\n```\n\n<!-- test: by=tests/test_x.py::test_y -->\n```bash\nls\n```\n",
        encoding="utf-8")
    blocks = rf.collect_blocks(tmp_path)
    assert [(b.id, b.lang, b.setups, b.env, b.skip_reason, b.run_by) for b in blocks] == [
        ("README.md:L8", "bash", ["doc"], {"A": "1", "B": "2"}, None, None),
        ("README.md:L13", "python", [], {}, "needs 2 GPUs", None),
        ("README.md:L18", "bash", [], {}, None, "tests/test_x.py::test_y")]
    assert blocks[0].code == "echo hi\n"
    (tmp_path / "docs" / "a.md").write_text("<!-- test: skip reason=x -->\n\ntext\n",
                                            encoding="utf-8")
    with pytest.raises(ValueError, match="docs/a.md:1"):
        rf.collect_blocks(tmp_path)


# [text](target) outside code; a target with a scheme (https:, mailto:) is not checked
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose(text: str, code: str = "") -> str:
    """The text of a page without its fenced blocks, inline code spans replaced by `code`."""
    text = re.sub(r"^([ \t]*)(```+|~~~+).*?^\1\2[ \t]*$", "", text, flags=re.S | re.M)
    return re.sub(r"`+([^`\n]*)`+", code, text)


def anchors(page: Path) -> set:
    """The anchors GitHub gives a page's headings: lower case, punctuation but `-` and `_`
    dropped, spaces as `-`, a repeated one suffixed -1, -2, ..."""
    seen: dict = {}
    out = set()
    # a heading's code span keeps its text in the anchor, as on GitHub
    for line in _prose(page.read_text(encoding="utf-8"), r"\1").splitlines():
        m = HEADING.match(line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(2).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_relative_links_resolve():
    """Every relative link of README.md and docs/*.md names an existing file, and its
    #anchor a heading of that page (the pages link to each other's sections)."""
    bad = []
    for page in rf.pages():
        rel = page.relative_to(rf.ROOT).as_posix()
        for target in LINK.findall(_prose(page.read_text(encoding="utf-8"))):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                bad.append(f"{rel}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                bad.append(f"{rel}: {target}: no such heading")
    assert not bad, "\n".join(bad)


PINNED = re.compile(r"`(tests/test_\w+\.py)(?:::(\w+))?`")


def test_differences_name_tests_that_exist():
    """Every `tests/test_x.py::test_y` docs/differences.md names (the test pinning a row's
    default) is a test function of that file: a renamed test must not leave a row unpinned."""
    page = rf.ROOT / "docs" / "differences.md"
    named = PINNED.findall(page.read_text(encoding="utf-8"))
    assert len(named) >= 10
    bad = []
    for path, name in named:
        source = rf.ROOT / path
        if not source.is_file():
            bad.append(f"{path}: no such file")
        elif name and not re.search(rf"^def {name}\(", source.read_text(encoding="utf-8"),
                                    re.M):
            bad.append(f"{path}::{name}: no such test")
    assert not bad, "\n".join(bad)
