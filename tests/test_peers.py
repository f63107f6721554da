"""ernie_doc.peers: the ranks watch each other. Its decisions on a fake store and clock, then real
processes: two simulated nodes (two launchers on this host, `--nnodes 2`) pretraining the tiny
config, where

1. node 1's worker is killed mid-run: node 0 exits within the bound with one line naming rank 1;
2. the run resumes on both nodes, and rank 0 is killed while it writes a checkpoint: node 1
   exits with one line naming rank 0, the checkpoint being written is left incomplete and
   `latest` still names the previous one;
3. the run resumes on both nodes from there to the end: its parameters equal a 2-process run's
   (`--nproc_per_node 2`) exactly, and so do its logged records.

The three runs build on each other (module-scoped fixtures, one run each)."""
import contextlib
import json
import os
import re

import numpy as np
import pytest
from helpers import ROOT, free_port, launch_two_nodes, launch_two_ranks
from test_pretrain import tiny, write_corpus

from ernie_doc import peers

TIMEOUT = 3   # peer_timeout of the runs here (default 20)
JOIN = 3      # peer_join_timeout of the runs that fail before training (default 120)
COMMON = ("max_steps=8", "save_steps=2", f"peer_timeout={TIMEOUT}")


# -- the decision ------------------------------------------------------------------------------
class FakeStore:
    def __init__(self):
        self.counts, self.values, self.broken = {}, {}, False

    def add(self, key, n):
        if self.broken:
            raise ValueError("TCP send error. Details: Broken pipe.")
        self.counts[key] = self.counts.get(key, 0) + n
        return self.counts[key]

    def set(self, key, value):
        self.values[key] = value

    def get(self, key):
        return self.values[key].encode()


def fake_watch(rank=0, world=3, timeout=10.0):
    now = [100.0]
    exits = []
    watch = peers.PeerWatch(FakeStore(), rank, world, timeout, lambda: "resume: here",
                            local_size=2, exit=exits.append, clock=lambda: now[0])
    return watch, now, exits


def test_a_peer_silent_for_the_timeout_is_lost_and_named_with_its_node():
    watch, now, _ = fake_watch()
    assert watch.interval == 1.0 and peers.quick_window(10) == 5.0
    watch.observe()
    now[0] += 9.9
    watch.store.add(peers.KEY.format(1), 1)   # rank 1 beats, rank 2 does not
    watch.observe()
    assert watch.decide() is None
    now[0] += 0.2
    assert watch.decide() == ("error: rank 2 (node 1) stopped: no heartbeat for 10 s; "
                              "resume: here")
    now[0] += 10
    watch.observe()
    assert watch.decide().startswith("error: ranks 1 (node 0), 2 (node 1) stopped")


def test_a_failed_collective_call_decides_in_the_quick_window():
    watch, now, _ = fake_watch()
    watch.observe()
    now[0] += 5.5
    assert watch.decide() is None            # within the timeout
    watch.window = peers.quick_window(watch.timeout)   # what settle() sets
    assert "no heartbeat for 5 s" in watch.decide()


def test_the_store_failing_names_rank_0_after_a_grace_of_two_heartbeats():
    watch, now, _ = fake_watch(rank=1)
    watch.observe()
    watch.store.broken = True
    watch._beat()   # returns at the failure
    assert watch.store_error and watch.decide() is None
    now[0] += 2.1
    assert watch.decide().startswith("error: rank 0 (node 0) stopped: the TCP store it hosts "
                                     "stopped answering")
    # a store that hangs: no answer for the window
    watch, now, _ = fake_watch(rank=1)
    now[0] += 10.5
    assert "has not answered for 10 s" in watch.decide()
    # rank 0 hosts the store: never its own verdict
    assert peers.lost_ranks(110, {1: 109}, 0, "broken", 10, rank=0) is None
    assert peers.lost_ranks(110, {1: 109}, 0, "broken", 10, rank=1)[0] == [0]


class SlowStore(FakeStore):
    def add(self, key, n):
        import time
        time.sleep(0.3)
        return super().add(key, n)


def test_a_stopped_watch_never_exits_the_process():
    watch, now, exits = fake_watch(timeout=2.0)
    watch.store = SlowStore()
    watch.start()
    watch.stop()
    # stop() waited for the store call under way: a thread inside one when the interpreter
    # exits aborts the process (seen: "terminate called without an active exception")
    assert not any(thread.is_alive() for thread in watch._threads)
    now[0] += 100
    watch.settle()   # returns at once: stopped
    assert exits == [] and watch.verdict is None


ABORT = """
import ctypes, os, signal, sys
sys.path.insert(0, {root!r})
from ernie_doc import peers

# the handler the watch replaces, as paddle installs its own: SA_SIGINFO, reading the siginfo
def previous(signum, info, context):
    code = ctypes.cast(info, ctypes.POINTER(ctypes.c_int))[0]   # siginfo_t.si_signo
    os.write(2, f"previous handler: signal {{signum}}, si_signo {{code}}\\n".encode())

handler = peers._SA_HANDLER(previous)
action = peers._SigAction(handler=ctypes.cast(handler, ctypes.c_void_p).value,
                          flags=peers._SA_SIGINFO)
ctypes.CDLL(None).sigaction(int(signal.SIGABRT), ctypes.byref(action), None)

class Store:
    def __init__(self):
        self.n = 0
    def add(self, key, n):
        self.n += n
        return self.n if {alive} else 0

watch = peers.PeerWatch(Store(), 0, 2, {timeout}, lambda: "resume here")
watch.counts[1] = 0
if not {alive}:
    watch.moved[1] -= 20   # rank 1 silent for 20 s: lost in the quick window (10 s), not before
watch.start()
{catch}
os.abort()   # what paddle's failed gradient all-reduce ends in (std::terminate)
"""
PREVIOUS = "previous handler: signal 6, si_signo 6"


# alive: a short timeout, so that the quick window the handler waits for is short (1 s)
@pytest.mark.parametrize("catch, alive, status, last", [
    # a lost peer: the one line, exit 75 (paddle's crash report would say nothing of it)
    ("watch.catch_abort()", False, peers.PEER_LOST,
     "error: rank 1 (node 1) stopped: no heartbeat for 10 s; resume here"),
    # every peer alive (a genuine abort): the replaced handler runs as the kernel would have
    # run it (paddle's crash report), then the abort
    ("watch.catch_abort()", True, -6, PREVIOUS),
    ("", False, -6, PREVIOUS),                    # no watch: paddle's abort
])
def test_an_abort_in_a_collective_call_waits_for_the_verdict(catch, alive, status, last):
    import subprocess
    import sys
    script = ABORT.format(root=str(ROOT), catch=catch, alive=alive,
                          timeout=2.0 if alive else 100.0)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == status, proc.stderr[-2000:]
    assert proc.stderr.splitlines()[-1] == last, proc.stderr[-2000:]
    assert (PREVIOUS in proc.stderr) == (status != peers.PEER_LOST)


def sigabrt_action():
    import ctypes
    import signal
    action = peers._SigAction()
    ctypes.CDLL(None).sigaction(int(signal.SIGABRT), None, ctypes.byref(action))
    return action.handler, action.flags


def test_a_stopped_watch_puts_back_the_abort_handler_it_replaced():
    import ctypes
    import signal
    libc = ctypes.CDLL(None)
    handler = peers._SA_HANDLER(lambda *args: None)
    action = peers._SigAction(handler=ctypes.cast(handler, ctypes.c_void_p).value,
                              flags=peers._SA_SIGINFO)
    saved = peers._SigAction()
    libc.sigaction(int(signal.SIGABRT), ctypes.byref(action), ctypes.byref(saved))
    try:
        before = sigabrt_action()
        assert before[1] & peers._SA_SIGINFO   # as paddle's own handler
        watch, _, _ = fake_watch()
        watch.catch_abort()
        assert sigabrt_action()[0] != before[0]
        watch.stop()
        assert sigabrt_action() == before   # the handler and its flags (SA_SIGINFO)
    finally:
        libc.sigaction(int(signal.SIGABRT), ctypes.byref(saved), None)


def test_the_default_bound_is_below_gloos_timeout():
    """gloo gives up on a silent peer after 30 s, on paddle 2.6.2 by aborting the process."""
    from ernie_doc.run_config import DEFAULTS
    timeout = DEFAULTS["peer_timeout"]
    assert timeout == 20 and peers.interval_for(timeout) == 2 and peers.quick_window(timeout) == 10


def test_the_join_bound_defaults_to_120_s_and_is_checked():
    from ernie_doc.errors import ConfigError
    from ernie_doc.run_config import DEFAULTS, load_config
    assert DEFAULTS["peer_join_timeout"] == 120
    for value in ("-1", "2.5", "soon"):
        with pytest.raises(ConfigError, match="peer_join_timeout: must be a non-negative "
                                              "integer"):
            load_config(None, ["task=longdep", "kind=classification",
                               f"peer_join_timeout={value}"])


def test_peer_timeout_0_or_one_rank_watches_nothing(monkeypatch):
    assert peers.watch(0) is None   # one rank (no launcher here)
    with peers.joining(3) as join:
        assert join is None
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")
    assert peers.watch(0) is None   # peer_timeout: 0, paddle's own behaviour
    with peers.joining(0) as join:   # peer_join_timeout: 0, likewise
        assert join is None
    monkeypatch.delenv("PADDLE_DISTRI_BACKEND", raising=False)
    with peers.joining(3) as join:   # CPU ranks not from the launcher meet over HTTP, no store
        assert join is None
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "6170")
    assert peers.master_endpoint() == ("10.0.0.1", 6170)


# -- joining the process group ----------------------------------------------------------------
def test_not_joined_names_the_missing_ranks_their_nodes_and_what_to_check():
    assert peers.not_joined(0, 2, [0], True, 3, "10.0.0.1:6170") == (
        "rank 1 (node 1) did not join the process group within 3 s; see node 1's log for an "
        "error before training, check that it started and reaches 10.0.0.1:6170, or raise "
        "peer_join_timeout for a slower start (a download, a corpus check)")
    # two nodes of 2 ranks, node 1's never came; three nodes, 1 and 2 missing
    assert peers.not_joined(0, 4, [0, 1], True, 120, "h:1", local_size=2).startswith(
        "ranks 2 (node 1), 3 (node 1) did not join the process group within 120 s; see node "
        "1's log")
    assert "ranks 1 (node 1), 2 (node 2) did not join the process group within 3 s; see the " \
           "logs of nodes 1, 2 for an error before training, check that each started" in \
        peers.not_joined(0, 3, [0], True, 3, "h:1")
    # rank 0's store does not answer: rank 0 is the one missing
    assert peers.not_joined(1, 2, None, False, 3, "10.0.0.1:6170") == (
        "rank 0 (node 0) did not join the process group within 3 s: nothing answers at "
        "10.0.0.1:6170, where it serves the TCP store; see node 0's log for an error before "
        "training, check that it started and that this node reaches that address, or raise "
        "peer_join_timeout for a slower start (a download, a corpus check)")
    assert "though every rank reached it; check that the nodes reach each other on every " \
           "port, not only h:1" in peers.not_joined(1, 2, [0, 1], True, 3, "h:1")


def test_a_rank_waits_for_rank_0s_store_until_the_deadline_then_marks_itself(monkeypatch):
    from ernie_doc.errors import PeerLost
    monkeypatch.setattr(peers.time, "sleep", lambda seconds: None)
    now, tries = [0.0], []

    def refused(host, port, timeout):
        tries.append(now[0])
        now[0] += 0.5
        raise ConnectionRefusedError(111, "Connection refused")

    join = peers.Joining(1, 2, 3, "10.0.0.1", 6170, connect=refused, clock=lambda: now[0])
    with pytest.raises(PeerLost) as info:
        join.arrive()
    assert str(info.value).startswith("rank 0 (node 0) did not join the process group within "
                                      "3 s: nothing answers at 10.0.0.1:6170")
    assert tries == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5] and PeerLost.exit_status == peers.PEER_LOST
    # the store answers: the rank marks itself there; rank 0 never waits before its store
    store = FakeStore()
    peers.Joining(1, 2, 3, "h", 1, connect=lambda *a: store).arrive()
    peers.Joining(0, 2, 3, "h", 1, connect=refused).arrive()
    assert store.counts == {peers.JOINING.format(1): 1}


def test_at_the_deadline_the_ranks_that_never_marked_are_named(capfd):
    store, exits = FakeStore(), []
    store.add(peers.JOINING.format(1), 1)   # rank 1 arrived; node 1 (ranks 2, 3) did not
    join = peers.Joining(0, 4, 3, "h", 1, local_size=2, connect=lambda *a: store,
                         exit=exits.append)
    join.expire()
    assert exits == [peers.PEER_LOST]
    assert capfd.readouterr().err == join.verdict + "\n"
    assert join.verdict.startswith("error: ranks 2 (node 1), 3 (node 1) did not join the "
                                   "process group within 3 s")
    join.joined = True   # init_parallel_env returned just before: nothing
    join.expire()
    assert exits == [peers.PEER_LOST] and capfd.readouterr().err == ""


def test_before_training_a_ranks_error_reaches_the_others_with_its_line(monkeypatch):
    from ernie_doc import distributed
    from ernie_doc.errors import ConfigError, PeerLost
    store = FakeStore()
    monkeypatch.setattr(distributed, "joined", lambda: True)
    monkeypatch.setattr(peers, "store_client", lambda *args: store)
    for name, value in (("TRAINERS_NUM", "2"), ("TRAINER_ID", "1"), ("LOCAL_SIZE", "1"),
                        ("MASTER", "10.0.0.1:6170")):
        monkeypatch.setenv("PADDLE_" + name, value)
    with pytest.raises(ConfigError), peers.telling():   # rank 1's own error: left for the others
        raise ConfigError("output_dir /o: not empty")
    assert store.values == {peers.FAILED.format(1): "output_dir /o: not empty"}
    monkeypatch.setenv("PADDLE_TRAINER_ID", "0")   # rank 0's next collective call fails
    with pytest.raises(PeerLost, match=r"^rank 1 \(node 1\) stopped before training: "
                                       r"output_dir /o: not empty$"), peers.telling():
        raise RuntimeError("gloo: TIMEOUT self_rank = 0 pair_rank = 1")
    store.counts.clear()   # nobody told: gloo's own error
    with pytest.raises(RuntimeError, match="gloo"), peers.telling():
        raise RuntimeError("gloo: TIMEOUT")

    def refused(*args):
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(peers, "store_client", refused)   # rank 0 and its store gone
    monkeypatch.setenv("PADDLE_TRAINER_ID", "1")
    with pytest.raises(PeerLost, match=r"^rank 0 \(node 0\) stopped before training: nothing "
                                       r"answers at 10.0.0.1:6170, where it served the TCP "
                                       r"store; see node 0's log for its error$"), peers.telling():
        raise RuntimeError("gloo: Connection reset by peer")
    monkeypatch.setattr(distributed, "joined", lambda: False)   # before joining: untouched
    with pytest.raises(RuntimeError, match="gloo"), peers.telling():
        raise RuntimeError("gloo")


ALARM = """
import ctypes, os, signal, sys, time
sys.path.insert(0, {root!r})
from ernie_doc import peers
start = time.monotonic()
cancel = peers.alarm(0.5, lambda: (os.write(1, b"%.2f" % (time.monotonic() - start)),
                                   os._exit(75)))
if {cancel}:
    cancel()
    print(signal.getsignal(signal.SIGALRM) == signal.SIG_DFL, end=" ", flush=True)
# blocked in C with the GIL held, as inside paddle's TCP store: no Python handler or thread runs
ctypes.PyDLL(None).sleep(1)
"""


@pytest.mark.parametrize("cancel", [False, True])
def test_the_alarm_runs_while_the_thread_holds_the_gil_in_c(cancel):
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-c", ALARM.format(root=str(ROOT), cancel=cancel)],
                          capture_output=True, text=True, timeout=60)
    if cancel:   # never fires; SIGALRM's action is the one before
        assert (proc.returncode, proc.stdout) == (0, "True "), proc.stderr[-2000:]
    else:
        assert proc.returncode == peers.PEER_LOST, proc.stderr[-2000:]
        assert 0.5 <= float(proc.stdout) < 1.5


# -- real processes: two simulated nodes ------------------------------------------------------
@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("peers-corpus"))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tmp_path_factory.mktemp("peers")


def pretrain_on_two_nodes(base, name, args, **launch):
    (base / name).mkdir()
    return launch_two_nodes(base / name, ["tools/pretrain.py", *args], **launch)


def latest(out):
    return os.path.basename(os.path.realpath(out / "checkpoints" / "latest"))


GLOG_INFO = re.compile(r"I\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] ")


def one_error_line(node, *parts):
    """The worker's log ends with its one `error:` line, with every part, and holds no
    traceback (a failure inside backward has the C++ runtime print two lines before it:
    "terminate called after throwing an instance of 'gloo::IoException'", its what()). Only
    paddle's C++ info log may follow (2.6.2's TCP store says it shut down as rank 0 exits)."""
    log = node["log"]
    lines = [line for line in log.splitlines() if line.startswith("error:")]
    ours = "\n".join(line for line in log.splitlines() if not GLOG_INFO.match(line))
    assert len(lines) == 1 and ours.rstrip().endswith(lines[0]), log[-3000:]
    assert "Traceback (most recent call last)" not in log, log[-3000:]
    for part in parts:
        assert part in lines[0], (part, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def killed_node(corpus, base):
    """Run 1: node 1's worker SIGKILLed once the first checkpoint (step 2) is complete. Rank 0
    holds in the middle of writing step 4, so that on a loaded machine the run cannot save
    more checkpoints before the kill lands (run 2 writes step 6)."""
    out = base / "out"
    link = out / "checkpoints" / "latest"
    nodes = pretrain_on_two_nodes(base, "run1", ["--set", *tiny(*corpus, out, *COMMON)],
                                  kill=(1, lambda: os.path.lexists(link)),
                                  env={"ERNIE_DOC_TEST_PAUSE_IN_SAVE": "4"})
    return out, nodes


@pytest.fixture(scope="module")
def killed_in_save(killed_node, base):
    """Run 2: resumed on both nodes; rank 0 SIGKILLed in the middle of writing step-6."""
    out, _ = killed_node
    resumed_from = latest(out)
    writing = out / "checkpoints" / "step-6.tmp" / "model.safetensors"
    nodes = pretrain_on_two_nodes(base, "run2", ["--resume", str(out)],
                                  kill=(0, writing.exists),
                                  env={"ERNIE_DOC_TEST_PAUSE_IN_SAVE": "6"})
    return out, nodes, resumed_from


@pytest.fixture(scope="module")
def resumed(killed_in_save, base):
    out, _, _ = killed_in_save
    return out, pretrain_on_two_nodes(base, "run3", ["--resume", str(out)])


@pytest.fixture(scope="module")
def two_processes(corpus, base):
    (base / "ref").mkdir()
    out = base / "ref" / "out"
    proc, logs = launch_two_ranks(base / "ref", ["tools/pretrain.py", "--set",
                                                 *tiny(*corpus, out, *COMMON)])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + logs
    return out


@pytest.mark.two_ranks
def test_a_killed_node_ends_the_other_with_one_line(killed_node):
    out, (node0, node1) = killed_node
    assert node1["status"] != 0 and node0["status"] == peers.PEER_LOST, node0["output"][-3000:]
    step = latest(out)
    assert step == "step-2"   # killed once step 2 was saved; step 4 never completes
    one_error_line(node0, "error: rank 1 (node 1) stopped: no heartbeat for",
                   f"the last complete checkpoint is {out}/checkpoints/{step}; resume with "
                   f"--resume {out} on every node")
    # the bound: peer_timeout (less once a collective call failed), and the launcher's exit
    assert node0["exited"] < TIMEOUT + 5, node0["exited"]


@pytest.mark.two_ranks
def test_a_kill_in_rank_0s_save_leaves_the_last_complete_checkpoint(killed_in_save):
    out, (node0, node1), resumed_from = killed_in_save
    assert f"resumed from {out}/checkpoints/{resumed_from}" in node0["log"]
    assert node0["status"] != 0 and node1["status"] == peers.PEER_LOST, node1["output"][-3000:]
    one_error_line(node1, "error: rank 0 (node 0) stopped: the TCP store it hosts stopped "
                          "answering", f"the last complete checkpoint is {out}/checkpoints/step-4")
    assert node1["exited"] < TIMEOUT + 5, node1["exited"]
    # the checkpoint being written does not look complete, and latest still names step-4
    assert latest(out) == "step-4"
    assert sorted(os.listdir(out / "checkpoints")) == ["latest", "step-4", "step-6.tmp"]
    assert "trainer_state.json" not in os.listdir(out / "checkpoints" / "step-6.tmp")


@pytest.mark.two_ranks
def test_two_nodes_resumed_equal_two_processes(resumed, two_processes):
    out, nodes = resumed
    assert [n["status"] for n in nodes] == [0, 0], nodes[0]["log"][-3000:] + nodes[1]["log"][-3000:]
    assert f"resumed from {out}/checkpoints/step-4" in nodes[0]["log"]
    assert sorted(os.listdir(out / "checkpoints")) == ["latest", "step-8"]
    from ernie_doc.heads import ErnieDocForPretraining
    ours = ErnieDocForPretraining.from_pretrained(out / "final").state_dict()
    theirs = ErnieDocForPretraining.from_pretrained(two_processes / "final").state_dict()
    assert sorted(ours) == sorted(theirs) and len(ours) > 5
    for key in ours:
        np.testing.assert_array_equal(ours[key].numpy(), theirs[key].numpy(), err_msg=key)
    records = []
    for run in (out, two_processes):
        with open(run / "train_log.jsonl") as f:
            records.append([{k: v for k, v in json.loads(line).items()
                             if not k.startswith("tokens_per_sec")} for line in f])
    assert len(records[0]) == 8 and records[0] == records[1]


# -- real processes: a node that fails before training, or never starts ------------------------
@pytest.mark.two_ranks
def test_a_node_failing_before_training_ends_the_other_with_one_line(corpus, base):
    """Node 1's tokenizer path is wrong: its worker exits with its error before joining the
    process group; node 0's waits for it in init_parallel_env (paddle: 900 s), here JOIN s."""
    (base / "early").mkdir()
    out, vocab = base / "early" / "out", corpus[1]
    nodes = launch_two_nodes(base / "early", lambda node: [
        "tools/pretrain.py", "--set", *tiny(corpus[0], vocab if node == 0 else vocab / "nope",
                                            out, f"peer_join_timeout={JOIN}")], timeout=150)
    node0, node1 = nodes
    assert node1["status"] != 0 and "vocab/nope: no such file" in node1["log"], node1["log"]
    assert node0["status"] == peers.PEER_LOST, node0["output"][-3000:]
    one_error_line(node0, f"error: rank 1 (node 1) did not join the process group within {JOIN} "
                          "s; see node 1's log for an error before training, check that it "
                          "started and reaches 127.0.0.1:", "raise peer_join_timeout")
    assert node0["exited"] < JOIN + 5, node0["exited"]   # after node 1's launcher exited
    assert not out.exists()


@pytest.mark.two_ranks
def test_a_node_failing_after_joining_ends_the_other_with_its_line(corpus, base):
    """Node 1's output_dir (not on a file system node 0 shares, say) holds someone else's
    file: its rank refuses it after joining the process group, while node 0's goes on to its
    first collective call (the parameters' broadcast), which fails once node 1's exits."""
    (base / "later").mkdir()
    out, foreign = base / "later" / "out", base / "later" / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("not a run\n")
    nodes = launch_two_nodes(base / "later", lambda node: [
        "tools/pretrain.py", "--set", *tiny(*corpus, out if node == 0 else foreign)],
        timeout=150)
    node0, node1 = nodes
    assert node1["status"] == 2, node1["log"][-3000:]
    theirs = one_error_line(node1, str(foreign))
    assert node0["status"] == peers.PEER_LOST, node0["output"][-3000:]
    one_error_line(node0, "error: rank 1 (node 1) stopped before training: " + theirs[7:])
    assert node0["exited"] < 10, node0["exited"]
    assert not out.exists() and os.listdir(foreign) == ["notes.txt"]


def lone_rank(rank, args, timeout=90):
    """tools/pretrain.py ARGS as rank `rank` of 2 (the environment paddle's launcher gives a
    worker of `--nnodes 2`), the other rank never started → (status, stderr, seconds from rank
    0's TCP store listening to the exit (rank 0; else None), the store's host:port)."""
    import socket
    import subprocess
    import sys
    import time
    port = free_port()
    env = {**os.environ, "PADDLE_TRAINERS_NUM": "2", "PADDLE_TRAINER_ID": str(rank),
           "PADDLE_GLOBAL_RANK": str(rank), "PADDLE_LOCAL_RANK": "0", "PADDLE_LOCAL_SIZE": "1",
           "PADDLE_MASTER": f"127.0.0.1:{port}", "PADDLE_DISTRI_BACKEND": "gloo",
           "PADDLE_TRAINER_ENDPOINTS": f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}"}
    env["PADDLE_CURRENT_ENDPOINT"] = env["PADDLE_TRAINER_ENDPOINTS"].split(",")[rank]
    proc = subprocess.Popen([sys.executable, "tools/pretrain.py", *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    listening, started = None, time.time()
    try:
        while rank == 0 and listening is None and proc.poll() is None \
                and time.time() - started < timeout:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                listening = time.time()
            time.sleep(0.05)
        _, err = proc.communicate(timeout=max(1, timeout - (time.time() - started)))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, err, listening and time.time() - listening, f"127.0.0.1:{port}"


@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_whose_peer_never_started_exits_with_one_line_within_the_bound(corpus, base,
                                                                               rank):
    """Rank 1 alone: nothing ever listens at rank 0's address (its node failed before
    training, or was never started). Rank 0 alone: its store listens, nobody joins."""
    out = base / f"alone-{rank}"
    status, err, seconds, endpoint = lone_rank(
        rank, ["--set", *tiny(*corpus, out, f"peer_join_timeout={JOIN}")])
    lines = err.strip().splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    assert status == peers.PEER_LOST and errors == lines[-1:], err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    if rank == 1:
        assert errors[0].startswith(f"error: rank 0 (node 0) did not join the process group "
                                    f"within {JOIN} s: nothing answers at {endpoint}, where it "
                                    f"serves the TCP store; see node 0's log"), errors[0]
    else:
        assert errors[0].startswith(f"error: rank 1 (node 1) did not join the process group "
                                    f"within {JOIN} s"), errors[0]
        assert JOIN - 0.5 < seconds < JOIN + 2, seconds   # from the store's start to the exit
    assert not out.exists()
