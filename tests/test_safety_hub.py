"""The hub and its cache under attack and faults (ernie_doc.hub): a planted link is never
written through, a killed download leaves nothing after the next run, every download is
bounded in time and size, a redirect stays on its host, a failed first fetch is never trusted,
trust is keyed by the full URL, a cache entry holds only what its manifest lists, and every
bad setting is one line. Real HTTP against servers these tests start on 127.0.0.1 (the
fixtures of test_hub.py); the deadlines are set small, so each case takes about a second."""
import gzip
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import test_hub
from helpers import ROOT
from test_hub import _WORKER, NAME, PDPARAMS, TARBALL, TINY, VOCAB, VOCAB_TEXT

from ernie_doc.hub import HubError, resolve

# test_hub's fixtures: its tiny released model and a fresh cache with a 127.0.0.1 server
model_files = test_hub.model_files
hub = test_hub.hub

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
        end = time.time() + 4   # the server gives up after 4 s (bounds the old code)
        try:
            while time.time() < end:
                handler.wfile.write(b"x")
                handler.wfile.flush()
                time.sleep(0.2)
        except OSError:   # the client hung up
            pass

    hub(routes={VOCAB: drip})
    monkeypatch.setenv("ERNIE_DOC_DOWNLOAD_DEADLINE", "1")
    started = time.monotonic()
    with pytest.raises(HubError) as e:
        resolve(NAME, kind="tokenizer")
    elapsed = time.monotonic() - started
    assert "not finished after 1 s" in str(e.value) and "ERNIE_DOC_DOWNLOAD_DEADLINE" \
        in str(e.value) and "\n" not in str(e.value)
    assert elapsed < 2.5, elapsed
    assert cache_files(tmp_path / "cache") == []


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
    with pytest.raises(HubError, match=r"longer than 1,048,576 bytes, .*MAX_BYTES"):
        resolve(server.url + "/direct/model.pdparams")
    assert cache_files(cache) == []

    register(Release(NAME, dict(TINY),
                     weights={"paddlenlp": Remote(HOST + PDPARAMS, max_bytes=256 << 10)},
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
    """The same path on two hosts is two records; a record of the older layout (keyed by the
    path) is trusted only for the URL it names, never for another host."""
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
        {"/m/model.tar.gz": {"sha256": "0" * 64, "size": 1, "url": url_a,
                             "first_seen": "2026-01-01"}}))
    with pytest.raises(HubError, match=r"differs from the expected 0{64}"):
        resolve(url_a)   # the old record still holds for the URL it was recorded for
    assert os.path.isdir(resolve(url_b))   # ... and not for another host
    assert checksums(cache)[url_b]["sha256"] == hashlib.sha256(other).hexdigest()

    (cache / "checksums.json").write_text("{}")
    assert os.path.isdir(resolve(url_a))
    records = checksums(cache)
    assert list(records) == [url_a]
    assert records[url_a]["sha256"] == hashlib.sha256(tarball).hexdigest()


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
    # under the full URL and under the path (the older layout)
    ("record without sha256", {}, _records({URL: {"size": 3}, "/x/model.tar.gz": {"size": 3}}),
     URL, "holds no 64-hex"),
    ("record a string", {}, _records({URL: "abc", "/x/model.tar.gz": "abc"}), URL,
     "is a str, not an object"),
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
        "error: ERNIE_DOC_TIMEOUT='abc': expected a number of seconds above 0"]
