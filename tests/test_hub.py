"""Released models by name (ernie_doc.hub): real HTTP against a server these tests start on
127.0.0.1. The server answers a bounded number of requests and stops by itself; nothing here
reaches the internet (ERNIE_DOC_MIRROR sends every URL to it, and the cache lives in a
temporary ERNIE_DOC_HOME)."""
import hashlib
import http.server
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import threading
import time

import numpy as np
import pytest
from helpers import ROOT, shared_path

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
