"""What tests/test_readme.py needs to run the documentation's code blocks: the blocks and their
markers, the workspace a block runs in (a copy of the checkout's tasks/, tools/, benchmarks/ and
configs/ with the long runs shrunk), the released names served from a hand-filled cache with tiny
checkpoints, and the small fixed registry of setups a marker may name.

A block's marker is an HTML comment on the line right above its opening fence (readers do not
see it); its words are shell-like:

    <!-- test: setup=imdb-data,doc -->              files the block reads, from SETUPS
    <!-- test: env="JOBS=1" -->                       extra environment, KEY=VALUE words
    <!-- test: skip reason="needs 2 GPUs" -->         not run; the reason is required
    <!-- test: by=tests/test_x.py::test_y -->         run as written by that test instead
                                                      (which asserts more than its exit status)

Blocks whose language is python, bash, sh or shell are code; a fence without a language is
output (tables, listings) and is never run.
"""
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

import yaml

ROOT = Path(__file__).resolve().parents[1]
CODE_LANGS = {"python": "python", "py": "python", "bash": "bash", "sh": "bash",
              "shell": "bash", "console": "bash"}
MARKER = re.compile(r"^\s*<!--\s*test:(.*?)-->\s*$")
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")
MARKER_KEYS = ("setup", "env", "skip", "reason", "by")


@dataclass
class Block:
    """One fenced code block: the page (relative to the repository), the line of its opening
    fence (1-based), its language (python or bash) and text, and its marker's words."""
    page: str
    line: int
    lang: str
    code: str
    marker: Dict[str, str] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.page}:L{self.line}"

    @property
    def skip_reason(self) -> Optional[str]:
        return self.marker.get("reason", "") if "skip" in self.marker else None

    @property
    def run_by(self) -> Optional[str]:
        """The test (`tests/test_x.py::test_y`) that runs this block as written, or None."""
        return self.marker.get("by") or None

    @property
    def setups(self) -> List[str]:
        return [s for s in self.marker.get("setup", "").split(",") if s]

    @property
    def env(self) -> Dict[str, str]:
        pairs = shlex.split(self.marker.get("env", ""))
        bad = [p for p in pairs if "=" not in p]
        if bad:
            raise ValueError(f"{self.id}: env words must be KEY=VALUE, got {bad}")
        return dict(p.split("=", 1) for p in pairs)


def parse_marker(text: str, where: str) -> Dict[str, str]:
    """The words of a `<!-- test: ... -->` comment → {key: value} ("skip" maps to "");
    ValueError naming `where` for an unknown key."""
    out = {}
    for word in shlex.split(text):
        key, _, value = word.partition("=")
        if key not in MARKER_KEYS:
            raise ValueError(f"{where}: unknown marker key {key!r} (known: {MARKER_KEYS})")
        out[key] = value
    return out


def pages(root: Path = ROOT) -> List[Path]:
    """README.md and every docs/*.md page."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def collect_blocks(root: Path = ROOT) -> List[Block]:
    """Every fenced block of code (python or shell) of the pages, in page order. A marker not
    directly above an opening fence is a ValueError (it would silently mark nothing)."""
    blocks = []
    for page in pages(root):
        rel = page.relative_to(root).as_posix()
        lines = page.read_text(encoding="utf-8").splitlines()
        fence, marker, marker_line = None, None, 0
        for i, line in enumerate(lines, 1):
            if fence is not None:
                close = line.strip()
                if close and close == fence[1][0] * len(close) and len(close) >= len(fence[1]):
                    if fence[2] is not None:
                        blocks.append(Block(rel, fence[0], fence[2], "\n".join(fence[3]) + "\n",
                                            fence[4]))
                    fence = None
                elif fence[2] is not None:
                    fence[3].append(line[len(fence[5]):] if line.startswith(fence[5]) else line)
                continue
            m = MARKER.match(line)
            if m:
                marker, marker_line = parse_marker(m.group(1), f"{rel}:{i}"), i
                continue
            m = FENCE.match(line)
            if m:
                lang = CODE_LANGS.get(m.group(3).lower()) if m.group(3) else None
                if marker is not None and marker_line != i - 1:
                    raise ValueError(f"{rel}:{marker_line}: a test marker must be on the line "
                                     f"right above a code fence")
                if marker is not None and lang is None:
                    raise ValueError(f"{rel}:{marker_line}: a test marker above a block that "
                                     f"is not code")
                fence = [i, m.group(2), lang, [], marker or {}, m.group(1)]
                marker = None
                continue
            if marker is not None and line.strip():
                raise ValueError(f"{rel}:{marker_line}: a test marker must be on the line "
                                 f"right above a code fence")
    return blocks


def block_run_by(test: str) -> Block:
    """The one block whose marker says `by=<test>`: a test that runs a documented command as
    written, with its own assertions (test_readme then does not run it a second time)."""
    found = [b for b in collect_blocks() if b.run_by == test]
    if len(found) != 1:
        raise LookupError(f"{len(found)} documentation blocks are marked by={test}")
    return found[0]


# --- the released names, tiny -------------------------------------------------------------

# The released names keep their architecture's shape of config (preset keys, pad id) but get
# a tiny size, so `from_pretrained("ernie-doc-base-en")` loads in well under a second.
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2)
EN_WORDS = ["hello", "world", "movie", "great", "review", "document", "long", "the"]
ZH_CHARS = "长文档建模的一个是在有我们谁哪里"


def _bpe_files(directory: Path) -> int:
    """A byte-level BPE of every byte plus a few merges, in the official layout (vocab.txt in
    RoBERTa order: [CLS] [PAD] [SEP] [UNK], the GPT-2 ids, [MASK]) → the vocabulary size."""
    from ernie_doc.tokenization.bpe import bytes_to_unicode
    pieces = list(bytes_to_unicode().values())
    merges = []
    for word in EN_WORDS:
        for w in (word, "\u0120" + word):
            cur = w[0]
            for ch in w[1:]:
                if cur + ch not in pieces:
                    merges.append((cur, ch))
                    pieces.append(cur + ch)
                cur += ch
    encoder = {p: i for i, p in enumerate(pieces)}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "encoder.json").write_text(json.dumps(encoder), encoding="utf-8")
    (directory / "vocab.bpe").write_text(
        "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
    lines = ["[CLS]", "[PAD]", "[SEP]", "[UNK]"] + [str(i) for i in range(len(pieces))] + \
        ["[MASK]"]
    (directory / "vocab.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(lines)


def _wordpiece_files(directory: Path) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    lines = ["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"] + list(ZH_CHARS) + \
        list("abcdefghijklmnopqrstuvwxyz0123456789.,!?") + EN_WORDS
    (directory / "vocab.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(lines)


def _tar_dir(src: Path, arcroot: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for base, _, files in os.walk(src):
            for name in sorted(files):
                path = os.path.join(base, name)
                tar.add(path, arcname=os.path.join(arcroot, os.path.relpath(path, src)))
    return buf.getvalue()


def _download_target(downloads: Path, url: str) -> Path:
    """Where a file of `url` is put by hand: downloads/ + the URL's path (as
    ernie_doc.hub.cache.download_path lays it out under $ERNIE_DOC_HOME)."""
    return downloads.joinpath(*[p for p in url.split("://", 1)[1].split("/")[1:] if p])


def build_releases(root: Path) -> Dict[str, str]:
    """Tiny checkpoints and tokenizer files of every released name, put where a user puts
    them by hand (`$ERNIE_DOC_HOME/downloads/<URL path>`) under root/downloads, and the
    hook (root/hook/sitecustomize.py, with root/tiny.json) that makes the names' presets and
    pinned tokenizer hashes the tiny ones in every Python process of a block → the
    environment a block needs for them."""
    import paddle

    from ernie_doc import ErnieDocConfig, ErnieDocModel
    from ernie_doc import releases as registry
    downloads = root / "downloads"
    spec = {"presets": {}, "tokenizers": {}}
    sizes = {"ernie-doc-base-en": _bpe_files(root / "tok" / "en"),
             "ernie-doc-base-zh": _wordpiece_files(root / "tok" / "zh")}
    sizes["ernie-doc-large-en"] = sizes["ernie-doc-base-en"]
    for name, release in registry.RELEASES.items():
        if name not in sizes:
            continue
        tok_dir = root / "tok" / ("zh" if name.endswith("-zh") else "en")
        preset = dict(ErnieDocConfig.from_any(release.preset).to_dict())
        overrides = dict(TINY, vocab_size=sizes[name])
        spec["presets"][name] = overrides
        config = ErnieDocConfig.from_dict({**preset, **overrides})
        paddle.seed(0)
        model = ErnieDocModel(config)
        out = root / "models" / name
        for source, remote in release.weights.items():
            target = _download_target(downloads, remote.url)
            target.parent.mkdir(parents=True, exist_ok=True)
            if source == "official":
                model.save_pretrained(str(out / "official" / "params"), format="official")
                os.remove(out / "official" / "params" / "ernie_config.json")
                target.write_bytes(_tar_dir(out / "official", name))
            else:
                model.save_pretrained(str(out / "paddlenlp"), format="paddlenlp")
                shutil.copyfile(out / "paddlenlp" / "model_state.pdparams", target)
        hashes = {}
        for filename, remote in release.tokenizer.items():
            target = _download_target(downloads, remote.url)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(tok_dir / filename, target)
            hashes[filename] = hashlib.sha256(target.read_bytes()).hexdigest()
        spec["tokenizers"][name] = hashes
    spec["presets"]["ernie-doc-small"] = dict(TINY)   # the small preset, smaller still
    (root / "tiny.json").write_text(json.dumps(spec, indent=1), encoding="utf-8")
    hook = root / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    # the hook, then this checkout (its ernie_doc, whatever is installed in the venv)
    return {"ERNIE_DOC_README_TINY": str(root / "tiny.json"),
            "PYTHONPATH": os.pathsep.join([str(hook), str(ROOT)])}


# Run at the start of every Python process of a block (PYTHONPATH): once ernie_doc.config or
# ernie_doc.releases is imported, the released names' presets and pinned tokenizer hashes
# become the tiny ones of ERNIE_DOC_README_TINY; once ernie_doc.cli.finetune is, a task named
# by its name (`ernie-doc finetune imdb`) reads its config from the workspace's shrunk copy of
# tasks/ (ERNIE_DOC_README_TASKS), as `tools/finetune.py tasks/imdb/config.yaml` there does.
# Nothing is imported before that (a python that never imports ernie_doc pays nothing).
SITECUSTOMIZE = '''\
import importlib.abc
import importlib.util
import json
import os
import sys

_SPEC = os.environ.get("ERNIE_DOC_README_TINY")
_PATCHED = ("ernie_doc.config", "ernie_doc.releases", "ernie_doc.cli.finetune")


def _shrunk_tasks(module):
    tasks = os.environ.get("ERNIE_DOC_README_TASKS")
    packaged = module.config_path

    def config_path(config):
        path = packaged(config)
        if not tasks or not config or path == config:   # a file given, not a task's name
            return path
        copy = os.path.join(tasks, str(config), "config.yaml")
        return copy if os.path.isfile(copy) else path
    module.config_path = config_path


def _patch(name, module):
    if name == "ernie_doc.cli.finetune":
        _shrunk_tasks(module)
        return
    with open(_SPEC, encoding="utf-8") as f:
        spec = json.load(f)
    if name == "ernie_doc.config":
        for preset, overrides in spec["presets"].items():
            module.PRESETS[preset] = {**module.PRESETS[preset], **overrides}
    else:
        import dataclasses
        for release, hashes in spec["tokenizers"].items():
            old = module.RELEASES[release]
            tokenizer = {f: dataclasses.replace(r, sha256=hashes[f])
                         for f, r in old.tokenizer.items()}
            module.register(dataclasses.replace(old, tokenizer=tokenizer))


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _PATCHED:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(name, module)
        spec.loader.exec_module = exec_module
        return spec


if _SPEC:
    sys.meta_path.insert(0, _Finder())
'''


# --- the workspace ------------------------------------------------------------------------

# What the checkout copy in a workspace changes, so the documented commands run in seconds:
# {file: {dotted key: value}}. The commands a reader sees are unchanged; the sizes are not.
SHRINK: Dict[str, Dict[str, object]] = {
    "tasks/longdep/config.yaml": {
        "reader.num_docs": {"train": 32, "dev": 16, "test": 16}, "epochs": 1,
        "batch_size": 8, "logging_steps": 0},
    "configs/pretrain/tiny.yaml": {
        "data_dir": ["README.md", "configs"], "max_steps": 4, "warmup_steps": 1, "save_steps": 2,
        "logging_steps": 2, "tokenizer_vocab_size": 300, "max_seq_len": 32, "batch_size": 2,
        "model_overrides": {"num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2,
                            "memory_len": 16}},
    "tasks/wikitext103/config_tiny.yaml": {"max_steps": 6, "eval_steps": 3, "logging_steps": 3},
    # tokenizer=train: a vocabulary the fixture's few reviews can fill
    "tasks/imdb/config.yaml": {"epochs": 1, "batch_size": 2, "max_seq_len": 32, "stride": 16,
                               "tokenizer_vocab_size": 60},
}
CHECKOUT_PARTS = ("tasks", "tools", "benchmarks", "configs", "README.md")


def _set_dotted(data: dict, key: str, value: object) -> None:
    *parents, last = key.split(".")
    for p in parents:
        data = data.setdefault(p, {})
    data[last] = value


def build_checkout(dest: Path) -> Path:
    """A copy of the checkout's CHECKOUT_PARTS (tasks/, tools/, benchmarks/, configs/,
    README.md) at dest, with SHRINK applied → dest."""
    ignore = shutil.ignore_patterns("__pycache__", "output", "*.pyc")
    for part in CHECKOUT_PARTS:
        src = ROOT / part
        if src.is_dir():
            shutil.copytree(src, dest / part, ignore=ignore)
        else:
            shutil.copyfile(src, dest / part)
    for rel, changes in SHRINK.items():
        path = dest / rel
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        for key, value in changes.items():
            _set_dotted(data, key, value)
        path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return dest


def block_env(ws: Path, extra: Dict[str, str], mpl: Optional[Path] = None) -> Dict[str, str]:
    """The environment of a block run in ws: this venv's commands first, the tiny released
    names from the workspace's own cache, offline, one thread."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ERNIE_DOC_", "PYTEST_", "COV_"))}
    env.update({
        "PATH": os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),
        "HOME": str(ws / ".home"), "ERNIE_DOC_HOME": str(ws / ".cache"),
        "ERNIE_DOC_OFFLINE": "1", "ERNIE_DOC_PROGRESS": "0", "OMP_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "ERNIE_DOC_SHARED": str(ws / ".no-shared"),
        # `ernie-doc finetune TASK` reads the shrunk tasks/TASK/config.yaml (SITECUSTOMIZE)
        "ERNIE_DOC_README_TASKS": str(ws / "tasks"),
        # matplotlib's font cache, built once per module rather than once per block
        "MPLCONFIGDIR": str(ws.parent / ".matplotlib") if mpl is None else str(mpl)})
    env.update(extra)
    return env


def link_tree(src: Path, dst: Path) -> None:
    """dst mirrors src with hard links (regular files, as the cache requires of downloads/)."""
    for base, _, files in os.walk(src):
        target = dst / os.path.relpath(base, src)
        target.mkdir(parents=True, exist_ok=True)
        for name in files:
            os.link(os.path.join(base, name), target / name)


def run(cmd: List[str], cwd: Path, env: Dict[str, str], timeout: float = 300):
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


# --- setups: the files a block reads ------------------------------------------------------

REVIEWS = {"pos": ["A great movie, I loved it. The long story was great.",
                   "Hello world, what a great film: the review is great!",
                   "Great acting and a great long document of a movie."],
           "neg": ["The movie was bad. I did not like the long story.",
                   "A bad film, the world is bored by it.",
                   "Bad acting, a bad review, the worst document."]}


def imdb_data(ws: Path, shared: "Shared") -> None:
    """aclImdb/{train,test}/{pos,neg}/ID_RATING.txt, three reviews each."""
    for split in ("train", "test"):
        for label, texts in REVIEWS.items():
            d = ws / "aclImdb" / split / label
            d.mkdir(parents=True, exist_ok=True)
            for i, text in enumerate(texts):
                (d / f"{i}_{8 if label == 'pos' else 2}.txt").write_text(text, encoding="utf-8")


def doc(ws: Path, shared: "Shared") -> None:
    """doc.txt: one long English document."""
    text = " ".join(REVIEWS["pos"] + REVIEWS["neg"]) + "\n"
    (ws / "doc.txt").write_text(text * 20, encoding="utf-8")


def imdb_run(ws: Path, shared: "Shared") -> None:
    """output/imdb: a fine-tuned IMDB run (the module's shared one) and the data it read."""
    imdb_data(ws, shared)
    shutil.copytree(shared.imdb_run(), ws / "output" / "imdb")


def checkpoint(ws: Path, shared: "Shared") -> None:
    """CHECKPOINT_DIR: a from_pretrained directory with its tokenizer (the run's best/)."""
    shutil.copytree(shared.imdb_run() / "best", ws / "CHECKPOINT_DIR")


def export(ws: Path, shared: "Shared") -> None:
    """out/ernie_doc: the export of the tiny released base-en (the Export section's first
    command, run once per module)."""
    shutil.copytree(shared.export(), ws / "out")


def reviews(ws: Path, shared: "Shared") -> None:
    """reviews/: one text file per document; big.jsonl: the same as JSON lines."""
    (ws / "reviews").mkdir()
    lines = []
    for i, text in enumerate(REVIEWS["pos"] + REVIEWS["neg"]):
        (ws / "reviews" / f"r{i}.txt").write_text(text, encoding="utf-8")
        lines.append(json.dumps({"id": f"r{i}", "text": text}))
    (ws / "big.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def tarballs(ws: Path, shared: "Shared") -> None:
    """model-ernie-doc-*.tar.gz: the released official archives (tiny), as downloaded."""
    for path in (shared.root / "releases" / "downloads").glob("model-ernie-doc-*.tar.gz"):
        shutil.copyfile(path, ws / path.name)


def my_finetuned(ws: Path, shared: "Shared") -> None:
    """my-finetuned: a fine-tuned from_pretrained directory (the IMDB run's best/)."""
    shutil.copytree(shared.imdb_run() / "best", ws / "my-finetuned")


def _zh_questions(n: int, seed: int) -> List[tuple]:
    """n (id, context, question, answer, answer_start) of 20-40 characters of ZH_CHARS."""
    import numpy as np
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        context = "".join(rng.choice(list(ZH_CHARS[:12]), size=int(rng.integers(20, 40))))
        start = int(rng.integers(0, len(context) - 3))
        out.append((f"q{seed}-{i}", context, "谁在哪里", context[start:start + 2], start))
    return out


def cmrc_run(ws: Path, shared: "Shared") -> None:
    """output/cmrc2018: a fine-tuned span QA run (the module's shared one); questions.jsonl:
    questions to answer (id, question, context)."""
    shutil.copytree(shared.cmrc_run(), ws / "output" / "cmrc2018")
    lines = [json.dumps({"id": q, "question": qq, "context": c}, ensure_ascii=False)
             for q, c, qq, _, _ in _zh_questions(3, 7)]
    (ws / "questions.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


SETUPS: Dict[str, Callable[[Path, "Shared"], None]] = {
    "imdb-data": imdb_data, "doc": doc, "imdb-run": imdb_run, "checkpoint": checkpoint,
    "reviews": reviews, "export": export, "cmrc-run": cmrc_run, "tarballs": tarballs,
    "my-finetuned": my_finetuned,
}


class Shared:
    """What blocks share within one test module (one per xdist worker): the checkout copy,
    the tiny releases and, built on first use, one tiny fine-tuned IMDB run."""

    def __init__(self, root: Path):
        self.root = root
        self.checkout = build_checkout(root / "checkout")
        self.release_env = build_releases(root / "releases")
        self._imdb_run: Optional[Path] = None
        self._export: Optional[Path] = None
        self._cmrc_run: Optional[Path] = None

    def workspace(self, ws: Path, setups: List[str]) -> Dict[str, str]:
        """Fill ws (empty) for a block → its base environment."""
        for part in CHECKOUT_PARTS:
            src = self.checkout / part
            (shutil.copytree if src.is_dir() else shutil.copyfile)(src, ws / part)
        link_tree(self.root / "releases" / "downloads", ws / ".cache" / "downloads")
        (ws / ".home").mkdir()
        for name in setups:
            if name not in SETUPS:
                raise ValueError(f"unknown setup {name!r} (known: {sorted(SETUPS)})")
            SETUPS[name](ws, self)
        return block_env(ws, self.release_env, self.root / "matplotlib")

    def imdb_run(self) -> Path:
        """A tiny IMDB fine-tuning run from the tiny released base-en (built once)."""
        if self._imdb_run is None:
            ws = self.root / "imdb-run"
            ws.mkdir()
            env = self.workspace(ws, ["imdb-data"])
            proc = run(["ernie-doc", "finetune", "imdb", "--set", "data_dir=aclImdb",
                        "init_checkpoint=ernie-doc-base-en", "output_dir=output/imdb",
                        "epochs=1", "batch_size=2", "max_seq_len=32", "stride=16",
                        "progress=false"], ws, env)
            assert proc.returncode == 0, proc.stderr[-3000:]
            self._imdb_run = ws / "output" / "imdb"
        return self._imdb_run

    def export(self) -> Path:
        """out/ of `ernie-doc export --config ernie-doc-base-en --output out/ernie_doc
        --seq-len 512` (built once)."""
        if self._export is None:
            ws = self.root / "export"
            ws.mkdir()
            env = self.workspace(ws, [])
            proc = run(["ernie-doc", "export", "--config", "ernie-doc-base-en", "--output",
                        "out/ernie_doc", "--seq-len", "512"], ws, env)
            assert proc.returncode == 0, proc.stderr[-3000:]
            self._export = ws / "out"
        return self._export

    def cmrc_run(self) -> Path:
        """A tiny CMRC2018 (span QA) run from the tiny released base-zh (built once)."""
        if self._cmrc_run is None:
            ws = self.root / "cmrc-run"
            ws.mkdir()
            env = self.workspace(ws, [])
            data = ws / "cmrc"
            data.mkdir()
            for k, name in enumerate(("cmrc2018_train.json", "cmrc2018_dev.json")):
                paragraphs = [{"context": c, "qas": [{"id": q, "question": qq, "answers": [
                    {"text": a, "answer_start": st}]}]}
                    for q, c, qq, a, st in _zh_questions(4, k)]
                (data / name).write_text(json.dumps(
                    {"version": "v1", "data": [{"title": "t", "paragraphs": paragraphs}]},
                    ensure_ascii=False), encoding="utf-8")
            proc = run(["ernie-doc", "finetune", "cmrc2018", "--set", "data_dir=cmrc",
                        "init_checkpoint=ernie-doc-base-zh", "output_dir=output/cmrc2018",
                        "epochs=1", "batch_size=4", "max_seq_len=24", "stride=4",
                        "task_options.max_query_len=6", "task_options.max_answer_len=8",
                        "progress=false"], ws, env)
            assert proc.returncode == 0, proc.stderr[-3000:]
            self._cmrc_run = ws / "output" / "cmrc2018"
        return self._cmrc_run
