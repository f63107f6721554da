"""Released models by name (ernie_doc.hub): real HTTP against a server these tests start on
127.0.0.1. The server answers a bounded number of requests and stops by itself; nothing here
reaches the internet (ERNIE_DOC_MIRROR sends every URL to it, and the cache lives in a
temporary ERNIE_DOC_HOME)."""
import gzip
import hashlib
import http.server
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time

import numpy as np
import pytest
from helpers import ROOT, one_error_line, shared_path

from ernie_doc.errors import HubError
from ernie_doc.hub import Release, Remote
from ernie_doc.hub import archive as hub_archive
from ernie_doc.hub import cache as hub_cache
from ernie_doc.hub import fetch as hub_fetch
from ernie_doc.hub import register, resolve, unregister

NAME = "ernie-doc-hubtest"
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, vocab_size=40,
            memory_len=8, max_position_embeddings=64, pad_token_id=0)
TARBALL = "/models/model-ernie-doc-hubtest.tar.gz"
PDPARAMS = "/nlp/ernie-doc-hubtest/ernie-doc-hubtest.pdparams"
VOCAB = "/nlp/ernie-doc-hubtest/vocab.txt"
VOCAB_TEXT = "\n".join(["[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]"]
                       + [chr(0x4e00 + i) for i in range(30)] + list("abcde")) + "\n"


class Server:
    """A local HTTP server: `files` {path: bytes}; `cut` {path: bytes sent before the
    connection is dropped (the full Content-Length is announced)}; `delay` seconds between
    64 KiB chunks; `routes` {path: fn(handler, n)} answering a path by hand (n: the how-many-th
    request of it). It counts GET requests per path, answers at most `max_requests`, and
    stops after `lifetime` seconds whatever happens."""

    def __init__(self, files, cut=None, delay=0.0, max_requests=20, lifetime=60.0,
                 routes=None):
        self.files, self.cut, self.delay = dict(files), dict(cut or {}), delay
        self.routes = dict(routes or {})
        self.requests = {}
        self.max_requests = max_requests
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                owner.requests[self.path] = owner.requests.get(self.path, 0) + 1
                if self.path in owner.routes:
                    owner.routes[self.path](self, owner.requests[self.path])
                    return
                body = owner.files.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                limit = owner.cut.get(self.path, len(body))
                for start in range(0, limit, 1 << 16):
                    if owner.delay:
                        time.sleep(owner.delay)
                    self.wfile.write(body[start:min(limit, start + (1 << 16))])
                    self.wfile.flush()
                if limit < len(body):   # drop the connection mid-file
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.timeout = 0.2
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._stop = threading.Event()
        deadline = time.time() + lifetime

        def serve():
            while not self._stop.is_set() and time.time() < deadline and \
                    sum(self.requests.values()) < self.max_requests:
                self.httpd.handle_request()
            self.httpd.server_close()

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()

    def total(self):
        return sum(self.requests.values())

    def stop(self):
        self._stop.set()
        self.thread.join(5)


def _tar_bytes(add):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        add(tar)
    return buf.getvalue()


def _add_tree(tar, directory, arcroot):
    for base, _, files in os.walk(directory):
        for name in sorted(files):
            path = os.path.join(base, name)
            tar.add(path, arcname=os.path.join(arcroot, os.path.relpath(path, directory)))


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    """A tiny model written by our official-layout writer, as a tarball (`params/` inside a
    top folder, no config: the release's preset fills it in) and as a PaddleNLP .pdparams."""
    import paddle

    from ernie_doc import ErnieDocConfig, ErnieDocModel
    paddle.seed(3)
    model = ErnieDocModel(ErnieDocConfig(**TINY))
    tmp = tmp_path_factory.mktemp("release")
    model.save_pretrained(str(tmp / "official" / "params"), format="official")
    os.remove(tmp / "official" / "params" / "ernie_config.json")
    tarball = _tar_bytes(lambda tar: _add_tree(tar, str(tmp / "official"), "ernie-doc-hubtest"))
    model.save_pretrained(str(tmp / "nlp"), format="paddlenlp")
    pdparams = (tmp / "nlp" / "model_state.pdparams").read_bytes()
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    return {"tarball": tarball, "pdparams": pdparams, "state": state}


@pytest.fixture
def hub(tmp_path, monkeypatch, model_files):
    """A fresh cache, the test release registered, and a `serve(...)` that starts a server
    and points ERNIE_DOC_MIRROR at it."""
    monkeypatch.setenv("ERNIE_DOC_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("ERNIE_DOC_OFFLINE", raising=False)
    monkeypatch.setenv("ERNIE_DOC_PROGRESS", "0")
    monkeypatch.setenv("ERNIE_DOC_TIMEOUT", "10")
    vocab = VOCAB_TEXT.encode()
    register(Release(NAME, dict(TINY),
                     weights={"official": Remote("https://example.invalid" + TARBALL),
                              "paddlenlp": Remote("https://example.invalid" + PDPARAMS)},
                     tokenizer={"vocab.txt": Remote("https://example.invalid" + VOCAB,
                                                    hashlib.sha256(vocab).hexdigest())}))
    servers = []

    def serve(files=None, **kwargs):
        files = files if files is not None else {
            TARBALL: model_files["tarball"], PDPARAMS: model_files["pdparams"], VOCAB: vocab}
        server = Server(files, **kwargs)
        servers.append(server)
        monkeypatch.setenv("ERNIE_DOC_MIRROR", server.url)
        return server

    yield serve
    for server in servers:
        server.stop()
    unregister(NAME)


def _cache_files(cache):
    out = []
    for base, dirs, files in os.walk(cache):
        dirs[:] = [d for d in dirs if d != "locks"]
        out += [os.path.relpath(os.path.join(base, f), cache) for f in files]
    return sorted(out)


def _assert_state(model, state):
    got = {k: v.numpy() for k, v in model.state_dict().items()}
    assert sorted(got) == sorted(state)
    for key in state:
        np.testing.assert_array_equal(got[key], state[key])


def test_first_download_then_cache_without_server(hub, model_files, tmp_path):
    from ernie_doc import ErnieDocForSequenceClassification, ErnieDocModel
    from ernie_doc.tokenization import load_tokenizer
    server = hub()
    path = resolve(NAME)
    cache = tmp_path / "cache"
    assert path == str(cache / "models" / NAME / "official")
    assert server.requests == {TARBALL: 1, VOCAB: 1}
    # the archive's top folder is dropped, params/ kept; the config came from the preset
    files = _cache_files(cache)
    assert f"models/{NAME}/official/ernie_config.json" in files
    assert f"models/{NAME}/official/vocab.txt" in files
    assert f"models/{NAME}/official/params/word_embedding" in files
    assert not any(f.startswith("downloads/") for f in files)   # moved into the entries
    assert not any(".part" in f or ".tmp-" in f for f in files)
    checksums = json.loads((cache / "checksums.json").read_text())
    # trusted by the full URL the registry names (not the mirror's, not the path alone)
    assert list(checksums) == ["https://example.invalid" + TARBALL]
    assert checksums["https://example.invalid" + TARBALL]["sha256"] == \
        hashlib.sha256(model_files["tarball"]).hexdigest()

    model = ErnieDocModel.from_pretrained(NAME)
    _assert_state(model, model_files["state"])
    assert server.requests == {TARBALL: 1, VOCAB: 1}
    tok = load_tokenizer(NAME)
    assert tok.convert_tokens_to_ids(["[CLS]", "a"]) == [1, 35]

    server.stop()   # the second load needs no network
    head = ErnieDocForSequenceClassification.from_pretrained(NAME, num_labels=3)
    assert head.load_report.format == "official"
    assert len(head.load_report.missing) == 2   # the new head: linear.weight, linear.bias
    assert load_tokenizer(NAME).vocab_size == tok.vocab_size

    # a file of the entry that changes on disk is caught at the next load
    vocab = cache / "models" / NAME / "official" / "vocab.txt"
    vocab.write_text(vocab.read_text() + "extra\n")
    with pytest.raises(HubError, match=r"vocab.txt: cache entry .* is damaged: the file has "):
        resolve(NAME)


def test_paddlenlp_source_and_tokenizer_only(hub, model_files, tmp_path):
    from ernie_doc import ErnieDocModel
    server = hub()
    assert resolve(NAME, kind="tokenizer") == str(tmp_path / "cache" / "tokenizers" / NAME)
    assert server.requests == {VOCAB: 1}                 # no weights for a tokenizer
    model = ErnieDocModel.from_pretrained(NAME, source="paddlenlp")
    _assert_state(model, model_files["state"])
    assert model.load_report.format == "paddlenlp"
    assert server.requests == {VOCAB: 1, PDPARAMS: 1}    # the tokenizer entry was reused
    with pytest.raises(HubError, match="source 'hub': choose one of official, paddlenlp"):
        resolve(NAME, source="hub")
    with pytest.raises(HubError, match=r"ernie-doc-large-en: no 'paddlenlp' copy"):
        resolve("ernie-doc-large-en", source="paddlenlp")


def test_checksum_mismatch_leaves_nothing(hub, tmp_path):
    server = hub({VOCAB: b"[PAD]\n[CLS]\nnot the pinned file\n"})
    with pytest.raises(HubError) as e:
        resolve(NAME, kind="tokenizer")
    assert "differs from the expected" in str(e.value) and "\n" not in str(e.value)
    assert _cache_files(tmp_path / "cache") == []
    assert server.requests == {VOCAB: 1}

    # weights: the first fetch's hash is trusted, a different file later is refused
    (tmp_path / "cache").mkdir(exist_ok=True)
    key = "https://example.invalid" + TARBALL
    (tmp_path / "cache" / "checksums.json").write_text(json.dumps(
        {key: {"sha256": "0" * 64, "size": 1, "first_seen": "2026-01-01"}}))
    server = hub()
    with pytest.raises(HubError, match=r"sha256 [0-9a-f]{64} differs from the expected 0{64}"):
        resolve(NAME)
    # no weights, no archive, no .part (the weights are fetched before the tokenizer)
    assert _cache_files(tmp_path / "cache") == ["checksums.json"]
    assert server.requests == {TARBALL: 1}


def test_connection_cut_mid_file(hub, model_files, tmp_path):
    half = len(model_files["tarball"]) // 2
    server = hub(cut={TARBALL: half})
    with pytest.raises(HubError) as e:
        resolve(NAME)
    message = str(e.value)
    assert f"the connection closed after {half:,} of {len(model_files['tarball']):,} bytes" \
        in message
    assert hub_cache.download_path("https://example.invalid" + TARBALL) in message
    files = _cache_files(tmp_path / "cache")
    assert not any(f.startswith(("models/", "downloads/")) for f in files), files
    assert server.requests[TARBALL] == 1


_WORKER = r"""
import json, logging, sys, time
sys.path.insert(0, {root!r})
logging.basicConfig(level=logging.INFO, format="%(message)s")
from ernie_doc.hub import Release, Remote, register, resolve
register(Release({name!r}, {tiny!r},
                 weights={{"official": Remote("https://example.invalid" + {tarball!r})}},
                 tokenizer={{"vocab.txt": Remote("https://example.invalid" + {vocab!r}, {sha!r})}}))
print(json.dumps({{"path": resolve({name!r}), "end": time.time()}}))
"""


def test_two_processes_download_once(hub, model_files, tmp_path):
    server = hub(delay=0.6)   # slow enough that the second process arrives mid-download
    code = _WORKER.format(root=str(ROOT), name=NAME, tiny=TINY, tarball=TARBALL, vocab=VOCAB,
                          sha=hashlib.sha256(VOCAB_TEXT.encode()).hexdigest())
    env = dict(os.environ)
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    paths = {json.loads(o[0].strip().splitlines()[-1])["path"] for o in outs}
    assert paths == {str(tmp_path / "cache" / "models" / NAME / "official")}
    assert server.requests == {TARBALL: 1, VOCAB: 1}
    assert sum("waiting for another process" in o[1] for o in outs) == 1


def _evil_tarballs():
    def member(name, data=b"x", **attrs):
        info = tarfile.TarInfo(name)
        info.size = len(data) if attrs.get("type", tarfile.REGTYPE) == tarfile.REGTYPE else 0
        for key, value in attrs.items():
            setattr(info, key, value)
        return info, (io.BytesIO(data) if info.size else None)

    cases = {
        "dotdot": [member("pkg/../../evil.txt")],
        "absolute": [member("/tmp/evil-absolute.txt")],
        "symlink out": [member("pkg/link", type=tarfile.SYMTYPE, linkname="../../../etc")],
        "symlink absolute": [member("pkg/link", type=tarfile.SYMTYPE, linkname="/etc/passwd")],
        "hardlink out": [member("pkg/hard", type=tarfile.LNKTYPE, linkname="../outside")],
        "fifo": [member("pkg/pipe", type=tarfile.FIFOTYPE)],
        "device": [member("pkg/dev", type=tarfile.CHRTYPE, devmajor=1, devminor=3)],
    }
    out = {}
    for label, members in cases.items():
        ok = member("pkg/params/word_embedding", b"fine")
        out[label] = _tar_bytes(lambda tar, ms=[ok] + members: [tar.addfile(*m) for m in ms])
    return out


@pytest.mark.parametrize("label", ["dotdot", "absolute", "symlink out", "symlink absolute",
                                   "hardlink out", "fifo", "device"])
def test_malicious_tar_refused(hub, tmp_path, label):
    evil = _evil_tarballs()[label]
    server = hub({TARBALL: evil})
    with pytest.raises(HubError, match=r"refused to unpack: member '.*' is "):
        resolve("https://example.invalid" + TARBALL)
    assert server.requests == {TARBALL: 1}
    assert not (tmp_path / "evil.txt").exists() and not os.path.exists("/tmp/evil-absolute.txt")
    files = _cache_files(tmp_path / "cache")
    assert not any(f.startswith("urls/") for f in files), files
    # a local archive goes through the same checks
    local = tmp_path / "evil.tar.gz"
    local.write_bytes(evil)
    with pytest.raises(HubError, match="refused to unpack"):
        resolve(str(local))
    assert not (tmp_path / "cache" / "archives").exists() or \
        not any(not n.startswith(".") for n in os.listdir(tmp_path / "cache" / "archives"))


def test_offline_is_one_line_and_opens_no_socket(hub, tmp_path, monkeypatch, model_files):
    server = hub()
    monkeypatch.setenv("ERNIE_DOC_OFFLINE", "1")

    def no_socket(*args, **kwargs):
        raise AssertionError("a socket was opened in offline mode")
    monkeypatch.setattr(socket.socket, "connect", no_socket)
    with pytest.raises(HubError) as e:
        resolve(NAME)
    message = str(e.value)
    assert "\n" not in message and "ERNIE_DOC_OFFLINE is set" in message
    cache = tmp_path / "cache"
    # the URLs (as the mirror serves them) and the exact paths to put them at
    assert f"https://example.invalid{TARBALL} at {cache}/downloads{TARBALL}" in message
    assert f"https://example.invalid{VOCAB} at {cache}/downloads{VOCAB}" in message
    assert server.total() == 0

    # files put there by hand are used, verified, and left in place
    (cache / "downloads" / "models").mkdir(parents=True)
    (cache / "downloads" / "models" / TARBALL.split("/")[-1]).write_bytes(model_files["tarball"])
    (cache / "downloads" / "nlp" / NAME).mkdir(parents=True)
    (cache / "downloads" / "nlp" / NAME / "vocab.txt").write_text(VOCAB_TEXT)
    path = resolve(NAME)
    assert os.path.isfile(os.path.join(path, "params", "word_embedding"))
    assert (cache / "downloads" / "models" / TARBALL.split("/")[-1]).exists()
    assert server.total() == 0


def test_network_error_names_url_and_path(hub, tmp_path, monkeypatch):
    server = hub({})   # 404 for everything
    with pytest.raises(HubError) as e:
        resolve(NAME, kind="tokenizer")
    message = str(e.value)
    assert message == (f"{server.url}{VOCAB}: cannot download (HTTP 404); download "
                       f"{server.url}{VOCAB} yourself and put it at "
                       f"{tmp_path}/cache/downloads{VOCAB}")
    assert _cache_files(tmp_path / "cache") == []


def test_mirror_and_paths(monkeypatch, tmp_path):
    monkeypatch.setenv("ERNIE_DOC_MIRROR", "http://10.0.0.1:8080/mirror/")
    assert hub_fetch.mirrored("https://bj.bcebos.com/a/b.txt?x=1") == \
        "http://10.0.0.1:8080/mirror/a/b.txt?x=1"
    monkeypatch.setenv("ERNIE_DOC_MIRROR", "ftp://host")
    with pytest.raises(HubError, match="ERNIE_DOC_MIRROR"):
        hub_fetch.mirrored("https://a/b")
    monkeypatch.delenv("ERNIE_DOC_MIRROR")
    assert hub_fetch.mirrored("https://a/b") == "https://a/b"
    monkeypatch.setenv("ERNIE_DOC_HOME", str(tmp_path))
    assert hub_cache.download_path("https://h/x/../y/z.tar.gz") == str(tmp_path / "downloads"
                                                                          / "x" / "y" / "z.tar.gz")
    monkeypatch.delenv("ERNIE_DOC_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert hub_cache.home() == str(tmp_path / "home" / ".cache" / "ernie_doc")
    with pytest.raises(HubError, match=r"nope: no such file or directory, and not a released "
                                       r"model name \(ernie-doc-base-en, "):
        resolve("nope")
    assert resolve(str(tmp_path)) == str(tmp_path)
    assert hub_archive.is_archive("x.tgz") and not hub_archive.is_archive("x.pdparams")


def test_pinned_tokenizer_hashes_match_the_official_files():
    from ernie_doc.hub import RELEASES
    assets = shared_path("assets", "ernie-doc")
    for name, folder in (("ernie-doc-base-en", "base-en"), ("ernie-doc-base-zh", "base-zh"),
                         ("ernie-doc-large-en", "base-en")):
        for filename, remote in RELEASES[name].tokenizer.items():
            data = (assets / folder / filename).read_bytes()
            assert hashlib.sha256(data).hexdigest() == remote.sha256, (name, filename)


def _iflytek_data(root):
    rng = np.random.default_rng(0)
    chars = [chr(0x4e00 + i) for i in range(30)]
    root.mkdir()
    for name, n in (("train.json", 8), ("dev.json", 4)):
        with open(root / name, "w", encoding="utf-8") as f:
            for i in range(n):
                f.write(json.dumps({"label": str(i % 3), "label_des": "x",
                                    "sentence": "".join(rng.choice(chars, 20))},
                                   ensure_ascii=False) + "\n")
    return root


RUN = ["max_seq_len=16", "batch_size=4", "epochs=1", "learning_rate=0.001", "progress=false",
       "logging_steps=0", "eval_splits=[dev]"]


def test_finetune_with_released_names(hub, model_files, tmp_path):
    """init_checkpoint=NAME fetches the weights and tokenizer; model=NAME alone (from scratch)
    is the release's config and takes the release's tokenizer; run_config.yaml keeps the
    name."""
    import yaml

    from tools.finetune import main
    server = hub()
    data = _iflytek_data(tmp_path / "data")
    out = tmp_path / "out"
    main([str(ROOT / "tasks" / "iflytek" / "config.yaml"), "--set", f"data_dir={data}",
          f"output_dir={out}", f"init_checkpoint={NAME}", *RUN])
    assert server.requests == {TARBALL: 1, VOCAB: 1}
    assert yaml.safe_load((out / "run_config.yaml").read_text())["init_checkpoint"] == NAME
    assert (out / "best" / "vocab.txt").read_text() == VOCAB_TEXT
    results = json.loads((out / "eval_results.json").read_text())
    assert 0.0 <= results["accuracy"] <= 1.0

    out2 = tmp_path / "out2"
    main([str(ROOT / "tasks" / "iflytek" / "config.yaml"), "--set", f"data_dir={data}",
          f"output_dir={out2}", f"model={NAME}", *RUN])
    assert server.requests == {TARBALL: 1, VOCAB: 1}   # the tokenizer entry, from the cache
    from ernie_doc import ErnieDocForSequenceClassification
    best = ErnieDocForSequenceClassification.from_pretrained(str(out2 / "best"))
    assert best.config.hidden_size == TINY["hidden_size"]


def test_download_command_fills_the_cache(hub, tmp_path, capsys, monkeypatch):
    from ernie_doc.hub.cli import main
    server = hub()
    assert main([NAME, "--source", "all"]) == 0
    out = capsys.readouterr().out
    cache = tmp_path / "cache"
    assert f"{NAME} (official): {cache}/models/{NAME}/official" in out
    assert f"{NAME} (paddlenlp): {cache}/models/{NAME}/paddlenlp" in out
    assert server.requests == {TARBALL: 1, PDPARAMS: 1, VOCAB: 1}
    assert main(["--list"]) == 0
    listing = capsys.readouterr().out
    assert f"  official   cached  https://example.invalid{TARBALL}" in listing
    assert "  paddlenlp  -       https://bj.bcebos.com/paddlenlp/models/transformers/" \
           "ernie-doc-base-en/ernie-doc-base-en.pdparams" in listing
    monkeypatch.setenv("ERNIE_DOC_OFFLINE", "1")
    assert main(["ernie-doc-base-zh"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ernie-doc-base-zh: not in the cache")
    assert main([]) == 2


def test_tools_take_released_names(hub, model_files, tmp_path, capsys):
    """convert, run-document and export read a released name through the same resolver."""
    from ernie_doc import ErnieDocModel
    from ernie_doc.cli import convert, run_document
    server = hub()
    assert convert.main([NAME, str(tmp_path / "ours"), "--to", "ours", "--quiet"]) == 0
    _assert_state(ErnieDocModel.from_pretrained(str(tmp_path / "ours")), model_files["state"])
    text = tmp_path / "doc.txt"
    text.write_text("".join(chr(0x4e00 + i % 30) for i in range(200)), encoding="utf-8")
    run_document.main(["--model", NAME, "--text", str(text), "--seq-len", "32"])
    assert "segments" in capsys.readouterr().out
    assert server.requests == {TARBALL: 1, VOCAB: 1}


# The hub and its cache under attack and faults (ernie_doc.hub): a planted link is never
# written through, a killed download leaves nothing after the next run, every download is
# bounded in time and size, a redirect stays on its host, a failed first fetch is never trusted,
# trust is keyed by the full URL, a cache entry holds only what its manifest lists, and every
# bad setting is one line. Real HTTP against servers these tests start on 127.0.0.1 (the
# fixtures of test_hub.py); the deadlines are set small, so each case takes about a second.


HOST = "https://example.invalid"


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def cache_listing(cache):
    """Every path under the cache except locks/ (what a run left behind)."""
    out = []
    for base, dirs, files in os.walk(cache):
        dirs[:] = [d for d in dirs if d != "locks"]
        out += [os.path.relpath(os.path.join(base, n), cache) for n in dirs + files]
    return sorted(out)


def cache_files(cache):
    """The files and links under the cache except locks/ (empty folders do not count)."""
    return [p for p in cache_listing(cache)
            if os.path.islink(os.path.join(cache, p)) or os.path.isfile(os.path.join(cache, p))]


def leftovers(cache):
    return [p for p in cache_listing(cache)
            if ".part" in p or ".tmp-" in p or ".fetch" in p]


def checksums(cache):
    path = os.path.join(cache, "checksums.json")
    return json.load(open(path)) if os.path.exists(path) else {}


def respond(handler, body, headers=(), status=200, length=True, close=False):
    handler.send_response(status)
    if length:
        handler.send_header("Content-Length", str(len(body)))
    for key, value in headers:
        handler.send_header(key, value)
    handler.end_headers()
    handler.wfile.write(body)
    if close:
        handler.close_connection = True


# -- data loss: a planted .part link ------------------------------------------------------------
def test_planted_part_link_is_never_written_through(hub, tmp_path):
    """A shared cache where someone planted downloads/<file>.part → the user's file: the
    download completes and the outside file is unchanged (and the link is left alone)."""
    from ernie_doc.hub.cli import main
    cache = tmp_path / "cache"
    victims = {}
    for path in (TARBALL, VOCAB):
        victim = tmp_path / f"victim-{os.path.basename(path)}"
        victim.write_bytes(b"the user's own file\n" * 100)
        part = cache / "downloads" / (path.lstrip("/") + ".part")
        part.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(victim, part)
        victims[victim] = sha(victim)
    hub()
    assert main([NAME]) == 0
    for victim, before in victims.items():
        assert sha(victim) == before, victim
    assert os.path.islink(cache / "downloads" / (VOCAB.lstrip("/") + ".part"))
    assert not [p for p in leftovers(cache) if not p.startswith("downloads/")]


# -- interrupted downloads ------------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
def test_kill_mid_download_then_retry_leaves_nothing(hub, model_files, tmp_path, sig):
    """kill -9 (or SIGTERM) of a process stalled mid-download from a slow server, then a
    retry: the retry succeeds and no `.tmp-*` folder and no `.part` file remain anywhere in
    the cache."""
    tarball = model_files["tarball"]

    def stall_then_serve(handler, n):
        if n == 1:   # half the file, then nothing until the client is killed
            handler.send_response(200)
            handler.send_header("Content-Length", str(len(tarball)))
            handler.end_headers()
            handler.wfile.write(tarball[:len(tarball) // 2])
            handler.wfile.flush()
            time.sleep(8)
            return
        respond(handler, tarball)

    server = hub(routes={TARBALL: stall_then_serve})
    cache = tmp_path / "cache"
    code = _WORKER.format(root=str(ROOT), name=NAME, tiny=TINY, tarball=TARBALL, vocab=VOCAB,
                          sha=hashlib.sha256(VOCAB_TEXT.encode()).hexdigest())
    proc = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 20
        while time.time() < deadline:   # until the download's file exists somewhere
            started = server.requests.get(TARBALL) and [
                p for p in cache_listing(cache) if "model-ernie-doc-hubtest.tar.gz" in p]
            if started:
                break
            time.sleep(0.05)
        assert started, "the worker never started the download"
        time.sleep(0.3)   # half the file is on its way
    finally:
        proc.send_signal(sig)
        proc.wait(10)
    assert leftovers(cache), "the kill left nothing to clean (the test did not interrupt)"
    # a link named like a stale folder is not ours: never followed, never removed
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("the user's\n")
    planted = cache / "models" / NAME / ".tmp-official-zzzzzzzz"
    os.symlink(outside, planted)
    path = resolve(NAME)
    assert os.path.isfile(os.path.join(path, "params", "word_embedding"))
    assert leftovers(cache) == [f"models/{NAME}/.tmp-official-zzzzzzzz"]
    assert os.path.islink(planted) and (outside / "keep.txt").read_text() == "the user's\n"


# -- bounds: time and size ----------------------------------------------------------------------
def test_drip_stops_at_the_download_deadline(hub, tmp_path, monkeypatch):
    """A server announcing 1,000 bytes and sending one every 0.2 s: the per-read timeout never
    trips, the total deadline (1 s here) does, and nothing is kept."""
    def drip(handler, n):
        handler.send_response(200)
        handler.send_header("Content-Length", "1000")
        handler.end_headers()
        end = time.time() + 12   # the server gives up after 12 s (bounds the old code)
        try:
            while time.time() < end:
                handler.wfile.write(b"x")
                handler.wfile.flush()
                time.sleep(0.2)
        except OSError:   # the client hung up
            pass

    hub(routes={VOCAB: drip})
    assert "ERNIE_DOC_DOWNLOAD_DEADLINE" in stopped_at_one_second(tmp_path, monkeypatch)


def stopped_at_one_second(tmp_path, monkeypatch) -> str:
    """The tokenizer's download under ERNIE_DOC_DOWNLOAD_DEADLINE=1 fails in one line within
    6 s (a drip route lasts 9 s or more) and keeps nothing → the message."""
    monkeypatch.setenv("ERNIE_DOC_DOWNLOAD_DEADLINE", "1")
    started = time.monotonic()
    with pytest.raises(HubError) as e:
        resolve(NAME, kind="tokenizer")
    elapsed = time.monotonic() - started
    assert "not finished after 1 s" in str(e.value) and "\n" not in str(e.value)
    assert elapsed < 6, elapsed
    assert cache_files(tmp_path / "cache") == []
    return str(e.value)


def _endless(handler, n):
    """No Content-Length, and a body that goes on (here until 32 MiB or the client leaves)."""
    handler.send_response(200)
    handler.end_headers()
    block = b"\0" * (1 << 16)
    try:
        for _ in range(512):
            handler.wfile.write(block)
    except OSError:
        pass
    handler.close_connection = True


def test_endless_body_stops_at_the_cap(hub, tmp_path, monkeypatch):
    """An endless body without a Content-Length stops at the cap (the registry's per-entry
    cap, or ERNIE_DOC_DOWNLOAD_MAX_BYTES for a URL given directly) with one line, and
    leaves nothing."""
    from ernie_doc.hub import Release, Remote, register
    cache = tmp_path / "cache"
    server = hub(routes={PDPARAMS: _endless, "/direct/model.pdparams": _endless},
                 files={VOCAB: VOCAB_TEXT.encode()})
    monkeypatch.delenv("ERNIE_DOC_MIRROR")
    monkeypatch.setenv("ERNIE_DOC_DOWNLOAD_MAX_BYTES", "1M")
    direct = server.url + "/direct/model.pdparams"
    # unpinned: a body without a length is refused at once (a cut could not be seen) ...
    with pytest.raises(HubError, match=r"announced no length .* no sha256 is known"):
        resolve(direct)
    assert cache_files(cache) == []
    # ... and once a sha256 is known for it, the cap stops it
    cache.mkdir(exist_ok=True)
    (cache / "checksums.json").write_text(json.dumps({direct: {"sha256": "0" * 64}}))
    with pytest.raises(HubError, match=r"longer than 1,048,576 bytes, .*MAX_BYTES"):
        resolve(direct)
    assert cache_files(cache) == ["checksums.json"]
    (cache / "checksums.json").unlink()

    register(Release(NAME, dict(TINY),
                     weights={"paddlenlp": Remote(HOST + PDPARAMS, "0" * 64,
                                                  max_bytes=256 << 10)},
                     tokenizer={"vocab.txt": Remote(HOST + VOCAB, hashlib.sha256(
                         VOCAB_TEXT.encode()).hexdigest())}))
    monkeypatch.setenv("ERNIE_DOC_MIRROR", server.url)
    with pytest.raises(HubError, match=r"the body is longer than 262,144 bytes, the "
                                       r"registry's cap for this file") as e:
        resolve(NAME, source="paddlenlp")
    assert "\n" not in str(e.value)
    assert cache_files(cache) == []


# -- redirects ----------------------------------------------------------------------------------
def test_cross_host_redirect_is_refused_without_a_mirror(hub, model_files, tmp_path,
                                                         monkeypatch):
    tarball = model_files["tarball"]
    server = hub(files={"/real/model.tar.gz": tarball})
    port = server.url.rsplit(":", 1)[1]

    def to_other_host(handler, n):
        respond(handler, b"", [("Location", f"http://localhost:{port}/real/model.tar.gz")], 302)

    def same_host(handler, n):
        respond(handler, b"", [("Location", "/real/model.tar.gz")], 302)

    server.routes.update({"/away/model.tar.gz": to_other_host, "/near/model.tar.gz": same_host})
    monkeypatch.delenv("ERNIE_DOC_MIRROR")
    with pytest.raises(HubError) as e:
        resolve(server.url + "/away/model.tar.gz")
    message = str(e.value)
    assert "refused a redirect to another host" in message and "\n" not in message
    assert f"ERNIE_DOC_MIRROR=http://localhost:{port}" in message
    assert server.requests.get("/real/model.tar.gz") is None   # never followed
    assert cache_files(tmp_path / "cache") == []
    # a redirect on the same host is followed
    assert os.path.isdir(resolve(server.url + "/near/model.tar.gz"))
    # with a mirror configured, the mirror's redirects are followed (the user chose it)
    monkeypatch.setenv("ERNIE_DOC_MIRROR", server.url)
    assert os.path.isdir(resolve(HOST + "/away/model.tar.gz"))
    assert server.requests["/real/model.tar.gz"] == 2


# -- trust on first use -------------------------------------------------------------------------
def _html_portal(handler, n):
    respond(handler, b"<!DOCTYPE html><html><body>Log in to the hotel wifi</body></html>",
            [("Content-Type", "text/html; charset=utf-8")])


def _gzip_encoded(tarball):
    def serve(handler, n):
        respond(handler, gzip.compress(tarball, mtime=0), [("Content-Encoding", "gzip")])
    return serve


def _short_unannounced(tarball):
    def serve(handler, n):   # half the file, no Content-Length: the cut cannot be seen
        respond(handler, tarball[:len(tarball) // 2], length=False, close=True)
    return serve


def _garbage(handler, n):
    respond(handler, os.urandom(3000))


@pytest.mark.parametrize("case", ["html portal", "gzip-encoded", "short body", "garbage",
                                  "garbage pdparams", "planted by hand"])
def test_a_failed_first_fetch_is_never_trusted(hub, model_files, tmp_path, case):
    """Whatever went wrong, the first fetch records no checksum and leaves no file, so the
    right file fetched next (the right mirror) is accepted."""
    cache = tmp_path / "cache"
    tarball = model_files["tarball"]
    source, path = ("paddlenlp", PDPARAMS) if case == "garbage pdparams" else \
        ("official", TARBALL)
    vocab = {VOCAB: VOCAB_TEXT.encode()}
    routes = {"html portal": _html_portal, "gzip-encoded": _gzip_encoded(tarball),
              "short body": _short_unannounced(tarball), "garbage": _garbage,
              "garbage pdparams": _garbage}
    if case == "planted by hand":
        planted = cache / "downloads" / TARBALL.lstrip("/")
        planted.parent.mkdir(parents=True)
        planted.write_bytes(os.urandom(3000))
        hub(files=vocab)
    else:
        hub(files=vocab, routes={path: routes[case]})
    with pytest.raises(HubError) as e:
        resolve(NAME, source=source)
    assert "\n" not in str(e.value)
    assert checksums(cache) == {}
    if case == "planted by hand":
        assert "put there by hand" in str(e.value) and str(planted) in str(e.value)
        assert [p for p in cache_listing(cache) if p.startswith("downloads/")
                and os.path.isfile(cache / p)] == [f"downloads{TARBALL}"]   # the user's
        planted.unlink()
    else:
        assert [p for p in cache_listing(cache) if os.path.isfile(cache / p)] == []
    hub()   # the right mirror
    entry = resolve(NAME, source=source)
    assert os.path.isdir(entry)
    assert list(checksums(cache)) == [HOST + path]


def test_trust_is_keyed_by_the_full_url(hub, model_files, tmp_path, monkeypatch):
    """The same path on two hosts is two records: a record for one host is never trusted
    for the other."""
    tarball = model_files["tarball"]
    other = gzip.compress(gzip.decompress(tarball), mtime=12345)   # same tar, other bytes
    assert other != tarball

    def by_host(handler, n):
        respond(handler, other if handler.headers["Host"].startswith("localhost") else tarball)

    server = hub(routes={"/m/model.tar.gz": by_host})
    monkeypatch.delenv("ERNIE_DOC_MIRROR")
    port = server.url.rsplit(":", 1)[1]
    url_a = f"http://127.0.0.1:{port}/m/model.tar.gz"
    url_b = f"http://localhost:{port}/m/model.tar.gz"
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "checksums.json").write_text(json.dumps(
        {url_a: {"sha256": "0" * 64, "size": 1, "url": url_a, "first_seen": "2026-01-01"}}))
    with pytest.raises(HubError, match=r"differs from the expected 0{64}"):
        resolve(url_a)   # the record holds for the URL it was recorded for
    assert os.path.isdir(resolve(url_b))   # ... and not for another host
    assert checksums(cache)[url_b]["sha256"] == hashlib.sha256(other).hexdigest()

    (cache / "checksums.json").write_text("{}")
    assert os.path.isdir(resolve(url_a))
    records = checksums(cache)
    assert list(records) == [url_a]
    assert records[url_a]["sha256"] == hashlib.sha256(tarball).hexdigest()


SHA0 = "0" * 64
# (label, records as a function of the mirror's URL of the tarball {u}, what the line says): every
# record here names a URL other than the registry's own spelling of it (the mirror's, or
# another spelling), so a lookup by that one key alone passes it by
MALFORMED_PINS = [
    ("a string", lambda u: {u: "abc"}, "is a string, not an object"),
    ("null", lambda u: {u: None}, "is null, not an object"),
    ("no sha256", lambda u: {u: {"size": 3, "url": u}}, "holds no 'sha256'"),
    ("short sha256", lambda u: {u: {"sha256": "0" * 63}},
     f"has 'sha256' \"{'0' * 63}\", not 64 hexadecimal digits"),
    ("sha256 a number", lambda u: {u: {"sha256": 12}},
     "has 'sha256' 12, not 64 hexadecimal digits"),
    ("size as text", lambda u: {u: {"sha256": SHA0, "size": "12"}},
     "has 'size' \"12\", not a number of bytes"),
    ("negative size", lambda u: {u: {"sha256": SHA0, "size": -1}},
     "has 'size' -1, not a number of bytes"),
    ("first_seen a number", lambda u: {u: {"sha256": SHA0, "first_seen": 20260101}},
     "has 'first_seen' 20260101, not text"),
    ("key no URL", lambda u: {"model-ernie-doc-hubtest.tar.gz": {"sha256": SHA0}},
     "is keyed by no http(s) URL"),
    ("url another", lambda u: {u: {"sha256": SHA0, "url": u + "x"}},
     "has 'url' \"{u}x\", another URL than its key"),
    ("registry URL respelled", lambda u: {"HTTPS://Example.invalid:443/models/./"
                                          "model-ernie-doc-hubtest.tar.gz": "abc"},
     "is a string, not an object"),
    ("two spellings disagree", lambda u: {u: {"sha256": SHA0}, u.replace("/models/", "//models/"):
                                          {"sha256": "1" * 64}},
     "names the URL of the record \"{u}\" with another sha256"),
]


@pytest.mark.parametrize("label,records,part", MALFORMED_PINS,
                         ids=[c[0] for c in MALFORMED_PINS])
def test_a_malformed_pin_is_one_line_before_any_download(hub, tmp_path, capsys, label,
                                                         records, part):
    """A checksums.json record that cannot be used, whatever URL it names, is an error naming
    the file and the record (`ernie-doc download`: one line, exit 2) before anything is
    fetched or trusted: the file is left as it was, also for a pinned tokenizer."""
    from ernie_doc.hub.cli import main
    server = hub()
    cache = tmp_path / "cache"
    cache.mkdir()
    url = server.url + TARBALL
    data = records(url)
    (cache / "checksums.json").write_text(json.dumps(data))
    before = (cache / "checksums.json").read_bytes()
    bad = list(data)[-1]
    for argv in ([NAME], [NAME, "--tokenizer-only"]):
        assert main(argv) == 2
        one_error_line(capsys, f"error: {cache / 'checksums.json'}: the record "
                               f"{json.dumps(bad)} {part.replace('{u}', url)}; fix or "
                               f"remove that record")
    assert server.total() == 0   # nothing was downloaded
    assert (cache / "checksums.json").read_bytes() == before
    assert cache_files(cache) == ["checksums.json"]


# (label, checksums.json's text for the mirror's URL {u}, the key the line names)
KEYS_TWICE = [
    ("a record twice", '{{"{u}": "abc", "{u}": {{"sha256": "%s"}}}}' % SHA0, '"{u}"'),
    ("two sha256 for one key", '{{"{u}": {{"sha256": "%s"}},\n "{u}": {{"sha256": "%s"}}}}'
     % (SHA0, "1" * 64), '"{u}"'),
    ("a field twice", '{{"{u}": {{"sha256": "%s", "sha256": "%s"}}}}' % (SHA0, "1" * 64),
     '"sha256"'),
]


@pytest.mark.parametrize("label,text,key", KEYS_TWICE, ids=[c[0] for c in KEYS_TWICE])
def test_a_key_given_twice_is_one_line_before_any_download(hub, tmp_path, capsys, label, text,
                                                           key):
    """JSON keeps the last of two values under one key without a word: a record written twice
    (the first a string) or two sha256 for one URL were trusted as the last one said. Any key
    given twice is an error naming the file and the key, before anything is fetched."""
    from ernie_doc.hub.cli import main
    server = hub()
    cache = tmp_path / "cache"
    cache.mkdir()
    url = server.url + TARBALL
    (cache / "checksums.json").write_text(text.format(u=url))
    before = (cache / "checksums.json").read_bytes()
    for argv in ([NAME], [NAME, "--tokenizer-only"]):
        assert main(argv) == 2
        one_error_line(capsys, f"error: {cache / 'checksums.json'}: the key "
                               f"{key.format(u=url)} appears twice in one object; fix or "
                               f"remove that record (nothing is downloaded or trusted")
    assert server.total() == 0
    assert (cache / "checksums.json").read_bytes() == before


def test_a_pin_holds_under_any_spelling_of_its_url(hub, model_files, tmp_path, capsys):
    """A record keyed by the registry's URL spelled otherwise (upper case, the default port,
    `/./`) pins that URL: a different file is refused and nothing is recorded."""
    from ernie_doc.hub.cli import main
    hub()
    cache = tmp_path / "cache"
    cache.mkdir()
    key = "HTTPS://Example.invalid:443/models/./model-ernie-doc-hubtest.tar.gz"
    (cache / "checksums.json").write_text(json.dumps({key: {"sha256": SHA0}}))
    assert main([NAME]) == 2
    got = hashlib.sha256(model_files["tarball"]).hexdigest()
    one_error_line(capsys, f"sha256 {got} differs from the expected {SHA0}")
    assert checksums(cache) == {key: {"sha256": SHA0}}
    assert cache_files(cache) == ["checksums.json"]


# -- cache entries hold only their manifest --------------------------------------------------
@pytest.mark.parametrize("added", ["model.safetensors", "config.json", "params/extra_tensor"])
def test_files_added_to_an_entry_are_refused(hub, tmp_path, added):
    from ernie_doc import ErnieDocModel
    hub()
    entry = resolve(NAME)
    target = os.path.join(entry, added)
    with open(target, "wb") as f:
        f.write(b"{}" if added.endswith(".json") else b"\0" * 64)
    for call in (lambda: resolve(NAME), lambda: ErnieDocModel.from_pretrained(NAME)):
        with pytest.raises(HubError) as e:
            call()
        assert str(e.value).startswith(f"{target}: cache entry {entry} holds a file its "
                                       f"manifest does not list")
        assert "\n" not in str(e.value)


# -- one line, never a traceback ------------------------------------------------------------------
def _records(value):
    return lambda cache: (cache / "checksums.json").write_text(json.dumps(value))


URL = "http://127.0.0.1:9/x/model.tar.gz"   # nothing listens on port 9: never reached
ONE_LINE = [
    ("mirror [::1", {"ERNIE_DOC_MIRROR": "http://[::1"}, None, URL, "ERNIE_DOC_MIRROR"),
    ("mirror port", {"ERNIE_DOC_MIRROR": "http://h:abc"}, None, URL, "ERNIE_DOC_MIRROR"),
    ("timeout", {"ERNIE_DOC_TIMEOUT": "abc"}, None, URL, "ERNIE_DOC_TIMEOUT='abc'"),
    ("deadline", {"ERNIE_DOC_DOWNLOAD_DEADLINE": "-1"}, None, URL,
     "ERNIE_DOC_DOWNLOAD_DEADLINE='-1'"),
    ("cap", {"ERNIE_DOC_DOWNLOAD_MAX_BYTES": "lots"}, None, URL,
     "ERNIE_DOC_DOWNLOAD_MAX_BYTES='lots'"),
    ("min speed", {"ERNIE_DOC_DOWNLOAD_MIN_SPEED": "fast"}, None, URL,
     "ERNIE_DOC_DOWNLOAD_MIN_SPEED='fast': expected a number of bytes per second, 0 (no "
     "limit) to 1 PiB"),
    ("min speed negative", {"ERNIE_DOC_DOWNLOAD_MIN_SPEED": "-1"}, None, URL,
     "ERNIE_DOC_DOWNLOAD_MIN_SPEED='-1'"),
    ("min speed time", {"ERNIE_DOC_DOWNLOAD_MIN_SPEED_TIME": "0"}, None, URL,
     "ERNIE_DOC_DOWNLOAD_MIN_SPEED_TIME='0': expected a number of seconds above 0"),
    ("record without sha256", {}, _records({URL: {"size": 3}}), URL, "holds no 'sha256'"),
    ("record a string", {}, _records({URL: "abc"}), URL, "is a string, not an object"),
    ("checksums a list", {}, _records([1, 2]), URL, "not a JSON object"),
    ("checksums not JSON", {}, lambda c: (c / "checksums.json").write_text("{oops"),
     URL, "checksums.json: unreadable"),
    ("%00", {}, None, "http://127.0.0.1:9/x%00y/model.tar.gz", "encoded control character"),
    ("direct [::1", {}, None, "http://[::1/model.tar.gz", "not a valid URL"),
]


@pytest.mark.parametrize("label,env,plant,url,part", ONE_LINE, ids=[c[0] for c in ONE_LINE])
def test_bad_settings_are_one_line(tmp_path, monkeypatch, capsys, label, env, plant, url,
                                   part):
    from ernie_doc.hub.cli import main
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv("ERNIE_DOC_HOME", str(cache))
    monkeypatch.setenv("ERNIE_DOC_TIMEOUT", "2")
    for key in ("ERNIE_DOC_MIRROR", "ERNIE_DOC_OFFLINE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    if plant:
        plant(cache)
    before = {p: sha(cache / p) for p in cache_listing(cache) if os.path.isfile(cache / p)}
    assert main([url]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("error: ") and part in err[0], err
    assert {p: sha(cache / p) for p in cache_listing(cache) if os.path.isfile(cache / p)} \
        == before


def test_the_installed_command_prints_one_line(tmp_path):
    """The same through `python -m ernie_doc.cli download` (exit 2, one stderr line)."""
    env = dict(os.environ, ERNIE_DOC_HOME=str(tmp_path / "cache"), ERNIE_DOC_TIMEOUT="abc")
    env.pop("ERNIE_DOC_MIRROR", None)
    proc = subprocess.run([sys.executable, "-m", "ernie_doc.cli", "download", URL], env=env,
                          capture_output=True, text=True, timeout=60, cwd=str(ROOT))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: ERNIE_DOC_TIMEOUT='abc': expected a number of seconds above 0 and at most "
        "2592000 (30 days)"]


# -- archives: only regular files and folders, written without following a link ---------------
def _sym(tar, name, target):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    tar.addfile(info)


def _file(tar, name, data=b"x"):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _link_chain(tar, n=12):
    """s -> ., L1 -> s/.., Lk -> L(k-1)/..: each target looks harmless on its own; together
    they climb n folders once unpacked."""
    for k in range(n, 1, -1):
        _sym(tar, f"L{k}", f"L{k - 1}/..")
    _sym(tar, "L1", "s/..")
    _sym(tar, "s", ".")


def _evil_archive(kind, victim):
    """The attacker's archives: a link chain plus a path beyond PATH_MAX (tarfile's filter
    stops resolving there) writing `victim`; a chain leading a member to `victim`."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        if kind == "path length":
            _link_chain(tar)
            comp, steps, path = "d" * 247, "abcdefghijklmnop", ""
            for ch in steps:
                info = tarfile.TarInfo(os.path.join(path, comp))
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
                _sym(tar, os.path.join(path, ch), comp)
                path = os.path.join(path, comp)
            lll = os.path.join("/".join(steps), "l" * 254)
            _sym(tar, lll, "../" * len(steps))
            _file(tar, os.path.join(lll, "L12", str(victim).lstrip("/")), b"OVERWRITTEN\n")
        else:   # the chain alone: a member named vocab.txt that leads to the victim
            _sym(tar, "vocab.txt", "L12/" + str(victim).lstrip("/"))
            _link_chain(tar)
            _file(tar, "params/word_embedding", b"\0" * 64)
    return buf.getvalue()


@pytest.mark.parametrize("kind", ["path length", "link chain"])
def test_link_tricks_never_reach_outside(hub, tmp_path, kind):
    """A hostile archive (served by URL, and as a local file) built from links that each pass
    a lexical check, or a path past PATH_MAX: refused with one line naming a link member;
    the outside file is unchanged and no entry is made."""
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"the user's own file\n")
    before = sha(victim)
    evil = _evil_archive(kind, victim)
    server = hub({"/m/evil.tar.gz": evil})
    local = tmp_path / "evil.tar.gz"
    local.write_bytes(evil)
    for spec in (server.url + "/m/evil.tar.gz", str(local)):
        with pytest.raises(HubError) as e:
            resolve(spec)
        assert "refused to unpack: member " in str(e.value) and "symbolic link" in str(e.value)
        assert "\n" not in str(e.value)
        assert sha(victim) == before
    assert not os.path.exists(tmp_path / "pwned.txt")
    assert [p for p in cache_files(tmp_path / "cache") if not p.startswith("locks")] == []


def test_entries_never_hold_or_follow_links(hub, tmp_path):
    """Hashing, verifying and completing an entry read only regular files: a link (here to a
    file outside) is refused, never read nor written through, and a manifest recording a
    link is a damaged entry."""
    from ernie_doc import releases as registry
    from ernie_doc.hub import cache as hub_cache
    from ernie_doc.hub import fetch as hub_fetch
    outside = tmp_path / "outside.txt"
    outside.write_text("outside\n")
    link = tmp_path / "link"
    os.symlink(outside, link)
    with pytest.raises(HubError, match="symbolic link"):
        hub_fetch.sha256_file(str(link))

    hub()
    entry = resolve(NAME)
    manifest = json.load(open(os.path.join(entry, ".manifest.json")))
    manifest["files"]["leak"] = {"link": str(outside)}
    os.symlink(outside, os.path.join(entry, "leak"))
    with open(os.path.join(entry, ".manifest.json"), "w") as f:
        json.dump(manifest, f)
    with pytest.raises(HubError, match="unreadable cache manifest"):
        resolve(NAME)

    # a dangling link where the tokenizer file goes: never written through
    root = tmp_path / "built"
    shutil.copytree(entry, root, ignore=shutil.ignore_patterns("vocab.txt", "leak",
                                                               ".manifest.json"))
    target = tmp_path / "pwned.txt"
    os.symlink(target, root / "vocab.txt")
    with pytest.raises(HubError, match="symbolic link"):
        hub_cache._complete_model_dir(str(root), registry.release(NAME), "origin")
    assert not target.exists()


def _many_members(n):
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        for i in range(n):
            info = tarfile.TarInfo(f"{i:06d}")
            info.mtime = 0
            gz.write(info.tobuf(tarfile.GNU_FORMAT))
        gz.write(b"\0" * 1024)
    return raw.getvalue()


def test_member_count_is_capped(hub, tmp_path):
    """12,000 empty members (a 30 KB archive): refused at the 10,001st, nothing unpacked, in
    well under a second of reading."""
    hub({"/m/many.tar.gz": _many_members(12_000)})
    url = os.environ["ERNIE_DOC_MIRROR"] + "/m/many.tar.gz"
    started = time.monotonic()
    with pytest.raises(HubError, match=r"more than 10,000 members"):
        resolve(url)
    assert time.monotonic() - started < 8
    assert [p for p in cache_files(tmp_path / "cache") if not p.startswith("locks")] == []


def test_archive_names_stay_on_one_line(hub, tmp_path, capsys):
    """A folder named with a newline (a forged second `error:` line): refused, one line."""
    from ernie_doc.hub.cli import main
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        _file(tar, "top\nerror: the model is fine/params/word_embedding", b"\0" * 8)
    hub({"/m/nl.tar.gz": buf.getvalue()})
    assert main([os.environ["ERNIE_DOC_MIRROR"] + "/m/nl.tar.gz"]) == 2
    err = capsys.readouterr().err.splitlines()
    error = err[[line.startswith("error:") for line in err].index(True):]
    assert len(error) == 1 and "control character" in error[0], err


# -- a first fetch is trusted only when it is whole and what the entry needs -------------------
def _cut_tar(tarball):
    """The model's tar (uncompressed) cut at the header of its middle member: still a valid
    tar, with half the parameters."""
    raw = gzip.decompress(tarball)
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        members = tar.getmembers()
    return raw[:members[len(members) // 2].offset]


@pytest.mark.parametrize("announced", [False, True], ids=["ended by close", "with length"])
def test_a_checkpoint_cut_at_a_member_boundary_is_not_trusted(hub, model_files, tmp_path,
                                                               announced):
    """Half the parameter files, sent without a length (ended by closing) or with its own
    length: refused, nothing recorded, and the whole file from the same URL is then
    accepted."""
    cut = _cut_tar(model_files["tarball"])

    def serve_cut(handler, n):
        respond(handler, cut, length=announced, close=True)

    server = hub(routes={TARBALL: serve_cut})
    cache = tmp_path / "cache"
    with pytest.raises(HubError) as e:
        resolve(NAME)
    assert ("announced no length" if not announced else "lacks") in str(e.value)
    assert checksums(cache) == {}
    assert not os.path.exists(cache / "models" / NAME / "official")
    server.routes.pop(TARBALL)
    assert os.path.isdir(resolve(NAME))
    assert list(checksums(cache)) == [HOST + TARBALL]


LOGIN = b"\xef\xbb\xbf<!-- portal -->\n<html><body>Log in</body></html>\n"


@pytest.mark.parametrize("path", ["/t/login.txt", "/t/vocab.txt"])
def test_a_login_page_is_never_kept(hub, tmp_path, path):
    """A login page behind a byte-order mark and a comment, sent as text/plain: a URL must
    name an archive, a checkpoint or a tokenizer file (login.txt is none), and a tokenizer
    file must not be HTML. Refused, nothing recorded or kept."""
    hub({path: LOGIN})
    with pytest.raises(HubError) as e:
        resolve(os.environ["ERNIE_DOC_MIRROR"] + path)
    assert ("HTML page" if path.endswith("vocab.txt") else "is not an archive") \
        in str(e.value)
    assert checksums(tmp_path / "cache") == {}
    assert [p for p in cache_files(tmp_path / "cache") if not p.startswith("locks")] == []


def test_announced_length_above_the_cap_is_refused(hub, tmp_path):
    """The registry's cap is a maximum: a Content-Length above it is refused before the body
    is read (not taken as the new cap)."""
    from ernie_doc.hub import Release, Remote, register
    sent = []

    def big(handler, n):
        handler.send_response(200)
        handler.send_header("Content-Length", str(1 << 20))
        handler.end_headers()
        try:
            for _ in range(16):
                handler.wfile.write(b"\0" * (1 << 16))
                sent.append(1)
        except OSError:
            pass

    hub(routes={PDPARAMS: big})
    register(Release(NAME, dict(TINY),
                     weights={"paddlenlp": Remote(HOST + PDPARAMS, max_bytes=256 << 10)},
                     tokenizer={"vocab.txt": Remote(HOST + VOCAB, hashlib.sha256(
                         VOCAB_TEXT.encode()).hexdigest())}))
    with pytest.raises(HubError, match=r"announces 1,048,576 bytes, more than 262,144, the "
                                       r"registry's cap"):
        resolve(NAME, source="paddlenlp")
    assert cache_files(tmp_path / "cache") == []


def test_errors_after_the_download_name_the_url(hub, tmp_path):
    """A fetched archive that does not unpack: the message names the URL, not the temporary
    file (gone by then)."""
    server = hub({"/m/bad.tar.gz": b"\x1f\x8b\x08\x00 not really gzip" * 10})
    url = server.url + "/m/bad.tar.gz"
    with pytest.raises(HubError) as e:
        resolve(url)
    assert str(e.value).startswith(f"{url}: not a readable tar archive")
    assert ".tmp-" not in str(e.value) and ".fetch" not in str(e.value)


# -- the deadline covers the whole fetch ---------------------------------------------------------
def _drip(head: bytes, piece: bytes, after: bytes, tail: bytes):
    """A route that sends `head`, then 30 times `piece`, a 0.3 s pause and `after` (9 s in
    all: bounds the old code), then `tail`."""
    def route(handler, n):
        handler.wfile.write(head)
        try:
            for _ in range(30):
                handler.wfile.write(piece)
                handler.wfile.flush()
                time.sleep(0.3)
                handler.wfile.write(after)
            handler.wfile.write(tail)
        except OSError:
            pass
        handler.close_connection = True
    return route


_drip_headers = _drip(b"HTTP/1.1 200 OK\r\n", b"X-A: ", b"b\r\n",
                      b"Content-Length: 0\r\n\r\n")
_drip_chunk_size = _drip(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n",
                         b"0", b"", b"\r\n\r\n")


@pytest.mark.parametrize("route", [_drip_headers, _drip_chunk_size], ids=["headers", "chunk"])
def test_deadline_covers_headers_and_chunk_lines(hub, tmp_path, monkeypatch, route):
    hub(routes={VOCAB: route})
    stopped_at_one_second(tmp_path, monkeypatch)


# -- the low-speed rule --------------------------------------------------------------------------
def _paced(body: bytes, piece: int, pause: float, lasts: float = 8.0):
    """A route announcing `body`'s length and sending `piece` bytes of it every `pause` s
    (0 bytes: none at all), for `lasts` s at most (bounds the old code)."""
    def route(handler, n):
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.flush()
        end, sent = time.time() + lasts, 0
        try:
            while time.time() < end and sent < len(body):
                time.sleep(pause)
                handler.wfile.write(body[sent:sent + piece])
                handler.wfile.flush()
                sent += piece
        except OSError:   # the client hung up
            pass
        handler.close_connection = True
    return route


def _below_the_rule(monkeypatch, capsys, min_speed: str) -> tuple:
    """`ernie-doc download NAME --tokenizer-only` under a low-speed rule of `min_speed`
    bytes/s over 1 s → (its one error line, the seconds it took, the bytes and the speed
    the line reports)."""
    import re

    from ernie_doc.hub.cli import main
    monkeypatch.setenv("ERNIE_DOC_DOWNLOAD_MIN_SPEED", min_speed)
    monkeypatch.setenv("ERNIE_DOC_DOWNLOAD_MIN_SPEED_TIME", "1")
    started = time.monotonic()
    assert main([NAME, "--tokenizer-only"]) == 2
    elapsed = time.monotonic() - started
    line = one_error_line(capsys, "(ERNIE_DOC_DOWNLOAD_MIN_SPEED and ERNIE_DOC_DOWNLOAD_MIN_"
                                  "SPEED_TIME set this rule); nothing was kept; download ")
    got = re.search(r": too slow: ([\d,]+) bytes in the last 1 s \(([\d,.]+) bytes/s\), "
                    r"below [\d,]+ bytes/s; [\d,]+ bytes of the file received \(", line)
    assert got, line
    return line, elapsed, int(got.group(1).replace(",", "")), float(got.group(2))


@pytest.mark.parametrize("route", [_paced(b"x" * 1000, 1, 0.1), _paced(b"x" * 1000, 0, 0.1),
                                   _drip_headers],
                         ids=["a byte every 0.1 s", "silence", "dripping headers"])
def test_a_drip_stops_at_the_low_speed_rule(hub, tmp_path, monkeypatch, capsys, route):
    """Below 100 bytes/s for 1 s (ERNIE_DOC_DOWNLOAD_MIN_SPEED=100,
    ERNIE_DOC_DOWNLOAD_MIN_SPEED_TIME=1), long before the read timeout (10 s) or the
    deadline (3 h): one line naming the URL, the rule and the measured speed, in about 1 s,
    and nothing kept."""
    server = hub(routes={VOCAB: route})
    line, elapsed, got, speed = _below_the_rule(monkeypatch, capsys, "100")
    assert line.startswith(f"error: {server.url}{VOCAB}: too slow: ")
    assert "below 100 bytes/s" in line
    assert got < 100 and speed == got
    assert 0.9 < elapsed < 4, elapsed
    assert cache_files(tmp_path / "cache") == []


def test_the_low_speed_rule_lets_a_download_above_it_finish(hub, tmp_path, monkeypatch,
                                                           capsys):
    """The pinned vocabulary (161 bytes) sent 10 bytes every 0.1 s, about 100 bytes/s for
    1.6 s: a rule of 1,000 bytes/s over 1 s stops it at 1 s and measures its speed; one of 20
    bytes/s lets it finish, though it lasts longer than the rule's window."""
    from ernie_doc.hub.cli import main
    hub(routes={VOCAB: _paced(VOCAB_TEXT.encode(), 10, 0.1)})
    line, elapsed, got, speed = _below_the_rule(monkeypatch, capsys, "1000")
    assert "below 1,000 bytes/s" in line
    assert 40 <= speed <= 400, line   # about 100 bytes/s of the file, and the headers
    assert 0.9 < elapsed < 1.5, elapsed
    assert cache_files(tmp_path / "cache") == []

    monkeypatch.setenv("ERNIE_DOC_DOWNLOAD_MIN_SPEED", "20")
    started = time.monotonic()
    assert main([NAME, "--tokenizer-only"]) == 0
    assert time.monotonic() - started > 1.3   # more than a window of the rule
    entry = tmp_path / "cache" / "tokenizers" / NAME
    assert (entry / "vocab.txt").read_text() == VOCAB_TEXT


def test_low_speed_settings(monkeypatch):
    """ERNIE_DOC_DOWNLOAD_MIN_SPEED (bytes/s, binary K/M/G/T, 0: no rule; default 1 KiB/s)
    and ERNIE_DOC_DOWNLOAD_MIN_SPEED_TIME (seconds; default 60)."""
    limits = hub_fetch._download_limits
    for key in ("ERNIE_DOC_DOWNLOAD_MIN_SPEED", "ERNIE_DOC_DOWNLOAD_MIN_SPEED_TIME"):
        monkeypatch.delenv(key, raising=False)
    assert (limits(None).min_speed, limits(None).speed_time) == (1024, 60.0)
    for raw, value in [("0", 0), ("512", 512), ("2K", 2048), ("1 KiB/s", 1024), ("1M", 1 << 20)]:
        monkeypatch.setenv("ERNIE_DOC_DOWNLOAD_MIN_SPEED", raw)
        assert limits(None).min_speed == value, raw
    monkeypatch.setenv("ERNIE_DOC_DOWNLOAD_MIN_SPEED_TIME", "2.5")
    assert limits(None).speed_time == 2.5
    for raw in ("-5", "1.5K", "fast", "2P"):
        monkeypatch.setenv("ERNIE_DOC_DOWNLOAD_MIN_SPEED", raw)
        with pytest.raises(HubError) as e:
            limits(None)
        assert str(e.value) == (f"ERNIE_DOC_DOWNLOAD_MIN_SPEED={raw!r}: expected a number of "
                                f"bytes per second, 0 (no limit) to 1 PiB (e.g. 1024 or 1K)")


def test_lock_wait_is_bounded(hub, tmp_path, monkeypatch):
    """Another process holding the entry's lock past the deadline: one line naming the lock
    (not an endless wait)."""
    import fcntl
    import threading
    hub()
    monkeypatch.setenv("ERNIE_DOC_DOWNLOAD_DEADLINE", "1")
    lock = tmp_path / "cache" / "locks" / f"tokenizers--{NAME}.lock"
    lock.parent.mkdir(parents=True)
    holder = open(lock, "w")
    fcntl.flock(holder, fcntl.LOCK_EX)
    outcome = []

    def run():
        started = time.monotonic()
        try:
            resolve(NAME, kind="tokenizer")
            outcome.append(("ok", time.monotonic() - started))
        except HubError as e:
            outcome.append((str(e), time.monotonic() - started))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(6)
    holder.close()   # releases the lock (lets the old code finish)
    thread.join(10)
    message, elapsed = outcome[0]
    assert "another process" in message and str(lock) in message and "\n" not in message
    assert elapsed < 5, elapsed   # a 1 s deadline; the lock was held for 6 s


# -- cleanup never follows a link, never deletes what it did not write ----------------------------
def test_cleanup_never_deletes_through_a_link(hub, model_files, tmp_path):
    """downloads/<folder> and models/<name> planted as links to the user's folders, holding
    a `.part` file and a folder named like a stale temporary one: nothing of the user's is
    deleted; a link where the cache keeps a folder is refused with one line."""
    cache = tmp_path / "cache"
    user = tmp_path / "user"
    (user / ".tmp-official-abcd1234").mkdir(parents=True)
    (user / ".tmp-official-abcd1234" / "work.txt").write_text("mine\n")
    (user / "model-ernie-doc-hubtest.tar.gz.part").write_text("mine\n")
    (cache / "downloads").mkdir(parents=True)
    os.symlink(user, cache / "downloads" / "models")
    (cache / "models").mkdir()
    os.symlink(user, cache / "models" / NAME)
    hub()
    with pytest.raises(HubError) as e:
        resolve(NAME)
    assert "is a symbolic link, where the cache keeps a folder" in str(e.value)
    assert (user / ".tmp-official-abcd1234" / "work.txt").read_text() == "mine\n"
    assert (user / "model-ernie-doc-hubtest.tar.gz.part").read_text() == "mine\n"
    os.remove(cache / "models" / NAME)
    assert os.path.isdir(resolve(NAME))   # the downloads/ link is only ever read
    assert (user / "model-ernie-doc-hubtest.tar.gz.part").read_text() == "mine\n"


def test_a_killed_checksums_write_is_cleaned(hub, tmp_path):
    """A `.tmp-checksums.json.XXXXXXXX` left by a kill is removed by the next write of the
    file (a link of that name is left alone)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / ".tmp-checksums.json.abcd1234").write_text("{")
    os.symlink(tmp_path / "elsewhere", cache / ".tmp-checksums.json.zzzz9999")
    hub()
    resolve(NAME)
    assert not (cache / ".tmp-checksums.json.abcd1234").exists()
    assert os.path.islink(cache / ".tmp-checksums.json.zzzz9999")


# -- redirects and trust keys ----------------------------------------------------------------
def test_redirect_to_another_port_is_refused(hub, model_files, tmp_path, monkeypatch):
    other = hub(files={"/real/model.tar.gz": model_files["tarball"]})
    port = other.url.rsplit(":", 1)[1]

    def to_other_port(handler, n):
        respond(handler, b"", [("Location", f"http://127.0.0.1:{port}/real/model.tar.gz")], 302)

    server = hub(routes={"/away/model.tar.gz": to_other_port})
    monkeypatch.delenv("ERNIE_DOC_MIRROR")
    with pytest.raises(HubError, match="refused a redirect to another host or port"):
        resolve(server.url + "/away/model.tar.gz")
    assert other.requests.get("/real/model.tar.gz") is None


def test_url_spellings_share_one_trust_record(hub, model_files, tmp_path, monkeypatch):
    """`//`, `/./`, %-escaped letters and an IPv6 address's long form name the same file: a
    record under one spelling holds for the others (a different file is refused)."""
    from ernie_doc.hub.cache import _checksum_key
    assert _checksum_key("HTTP://[0:0::1]:80/a//b/./c/../%6Dx%2f") == "http://[::1]/a/b/mx%2F"
    aliases = ("//m/model.tar.gz", "/m/./model.tar.gz", "/%6D/model.tar.gz")
    # the test server reads paths literally: it serves the file under every spelling
    server = hub(files={p: model_files["tarball"] for p in ("/m/model.tar.gz",) + aliases})
    monkeypatch.delenv("ERNIE_DOC_MIRROR")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "checksums.json").write_text(json.dumps(
        {server.url + "/m/model.tar.gz": {"sha256": "0" * 64}}))
    for alias in aliases:
        with pytest.raises(HubError, match=r"differs from the expected 0{64}"):
            resolve(server.url + alias)
    assert list(checksums(cache)) == [server.url + "/m/model.tar.gz"]


def test_local_archive_is_keyed_by_content(hub, tmp_path):
    """A local archive edited in place (same size, time stamp restored) is unpacked again,
    never served stale from the cache."""
    hub()
    path = tmp_path / "tok.tar"

    def write(word):
        with tarfile.open(path, "w") as tar:
            _file(tar, "tok/vocab.txt", word)
        os.utime(path, ns=(10 ** 18, 10 ** 18))

    write(b"aaaa\n")
    first = resolve(str(path))
    assert open(os.path.join(first, "vocab.txt"), "rb").read() == b"aaaa\n"
    write(b"bbbb\n")
    second = resolve(str(path))
    assert open(os.path.join(second, "vocab.txt"), "rb").read() == b"bbbb\n"


# -- settings and cache files: one line ----------------------------------------------------------
ONE_LINE_MORE = [
    ("huge timeout", {"ERNIE_DOC_TIMEOUT": "1e12", "ERNIE_DOC_DOWNLOAD_DEADLINE": "1e12"},
     None, "='1e12': expected a number of seconds"),
    ("cap of 5000 digits", {"ERNIE_DOC_DOWNLOAD_MAX_BYTES": "9" * 5000}, None,
     "ERNIE_DOC_DOWNLOAD_MAX_BYTES="),
    ("offline typo", {"ERNIE_DOC_OFFLINE": "y"}, None, "ERNIE_DOC_OFFLINE='y'"),
    ("checksums nested", {}, lambda c: (c / "checksums.json").write_text("[" * 200_000),
     "nested too deeply"),
]


@pytest.mark.parametrize("label,env,plant,part", ONE_LINE_MORE,
                         ids=[c[0] for c in ONE_LINE_MORE])
def test_more_bad_settings_are_one_line(tmp_path, monkeypatch, capsys, label, env, plant,
                                        part):
    test_bad_settings_are_one_line(tmp_path, monkeypatch, capsys, label, env, plant, URL, part)


def test_nested_manifest_is_one_line(hub, tmp_path):
    hub()
    entry = resolve(NAME, kind="tokenizer")
    with open(os.path.join(entry, ".manifest.json"), "w") as f:
        f.write("[" * 200_000)
    with pytest.raises(HubError) as e:
        resolve(NAME, kind="tokenizer")
    assert "nested too deeply" in str(e.value) and "\n" not in str(e.value)
