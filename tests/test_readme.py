"""The documentation's code is executed: every python and shell block of README.md and of
docs/*.md runs as written, one case per block (id `README.md:L<line of the fence>`), in a fresh
workspace holding a copy of tasks/, tools/ and configs/ with the long runs shrunk, the
released names served as tiny checkpoints from a hand-filled cache (offline), and the files
its marker's setups write (tests/readme_fixtures.py). A block is not run only when its marker
says `skip` with a reason; test_not_run_blocks_have_reasons counts them and prints the list."""
import re

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
    with capsys.disabled():
        print(f"\nREADME code blocks: {len(BLOCKS) - len(skipped)} run, "
              f"{len(skipped)} not run")
        for b in skipped:
            print(f"  {b.id}: {b.skip_reason}")


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
        "print(1)\n```\n", encoding="utf-8")
    blocks = rf.collect_blocks(tmp_path)
    assert [(b.id, b.lang, b.setups, b.env, b.skip_reason) for b in blocks] == [
        ("README.md:L8", "bash", ["doc"], {"A": "1", "B": "2"}, None),
        ("README.md:L13", "python", [], {}, "needs 2 GPUs")]
    assert blocks[0].code == "echo hi\n"
    (tmp_path / "docs" / "a.md").write_text("<!-- test: skip reason=x -->\n\ntext\n",
                                            encoding="utf-8")
    with pytest.raises(ValueError, match="docs/a.md:1"):
        rf.collect_blocks(tmp_path)
