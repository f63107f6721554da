"""Ranks watching each other: when one rank stops (its process killed, its node gone), the others
exit with one line naming it (status PEER_LOST) instead of waiting in a collective call.

`watch`: heartbeat counters in paddle's TCP store (rank 0's); `joining`: a bound on joining the
process group; `telling`: an error before training travels to the other ranks. Why not paddle's
own errors, and what each line says: docs/pretraining.md, "Several nodes"."""
import contextlib
import ctypes
import os
import signal
import socket
import sys
import threading
import time
from typing import Callable, Dict, Iterator, List, Optional, Tuple

from ernie_doc.errors import ErnieDocError, PeerLost

PEER_LOST = 75     # EX_TEMPFAIL: the run can go on (resume)
KEY = "ernie_doc/alive/{}"
JOINING = "ernie_doc/joining/{}"   # 1 once that rank began to join (Joining)
FAILED = "ernie_doc/failed/{}"     # the error line a rank stopped on before training (tell)
TOLD = "ernie_doc/told/{}"         # 1 once that line is there


class _SigAction(ctypes.Structure):
    """glibc's struct sigaction (Linux): the handler, the mask (1024 bits), the flags."""
    _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * (1024 // 64)),
                ("flags", ctypes.c_int), ("restorer", ctypes.c_void_p)]


_SA_SIGINFO, _SA_RESTART = 0x4, 0x10000000
_SA_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)


def _chain(previous: "_SigAction", signum: int, info, context) -> None:
    """Run the signal handler `previous` describes as the kernel would have (with the siginfo
    when its flags ask for it); nothing for SIG_DFL (0) or SIG_IGN (1): the abort goes on."""
    if not previous.handler or previous.handler == 1:
        return
    if previous.flags & _SA_SIGINFO:
        _SA_HANDLER(previous.handler)(signum, info, context)
    else:
        ctypes.CFUNCTYPE(None, ctypes.c_int)(previous.handler)(signum)


def interval_for(timeout: float) -> float:
    """Seconds between a watch's heartbeats: a tenth of the timeout, within [0.2, 2]."""
    return min(2.0, max(0.2, timeout / 10))


def quick_window(timeout: float) -> float:
    """The silence that decides once a collective call failed: five heartbeats (a live peer
    beats whatever its main thread does), never more than the timeout."""
    return min(timeout, 5 * interval_for(timeout))


def lost_ranks(now: float, moved: Dict[int, float], answered: float, store_error: Optional[str],
               window: float, grace: float = 0.0,
               rank: int = 1) -> Optional[Tuple[List[int], str]]:
    """The decision of rank `rank` → ([ranks lost], why) or None (all alive). moved: peer →
    when its counter last moved; answered: when the store (rank 0's) last answered;
    store_error: its failure, if any (decided once `grace`, the seconds left to wait, is 0 or
    less). Times: one clock's."""
    if rank != 0 and store_error is not None and grace <= 0:
        return [0], "the TCP store it hosts stopped answering"
    if rank != 0 and now - answered > window:
        return [0], f"the TCP store it hosts has not answered for {window:g} s"
    stale = sorted(p for p, t in moved.items() if now - t > window)
    return (stale, f"no heartbeat for {window:g} s") if stale else None


def describe(ranks: List[int], local_size: int) -> str:
    """"rank 1 (node 1)", "ranks 2 (node 1), 3 (node 1)": nodes counted as the launcher
    numbers ranks, `local_size` per node."""
    parts = [f"{r} (node {r // max(1, local_size)})" for r in ranks]
    return ("rank " if len(parts) == 1 else "ranks ") + ", ".join(parts)


class PeerWatch:
    """One rank's watch over the others (`start`, `stop`, `settle`). store: add(key, n) → the
    counter (paddle's TCPStore); hint() → the sentence after the verdict (what to resume);
    `exit` ends the process (os._exit: the main thread may be blocked in C++)."""

    def __init__(self, store, rank: int, world: int, timeout: float,
                 hint: Callable[[], str] = lambda: "", local_size: int = 1,
                 exit: Callable[[int], None] = os._exit,
                 clock: Callable[[], float] = time.monotonic):
        self.store, self.rank, self.timeout, self.hint = store, rank, float(timeout), hint
        self.local_size, self.exit, self.clock = local_size, exit, clock
        self.interval = interval_for(self.timeout)
        self.window = self.timeout
        now = clock()
        self.moved = {p: now for p in range(world) if p != rank}
        self.counts: Dict[int, int] = {}
        self.answered, self.store_error, self.failed_at = now, None, None
        self.stopped = threading.Event()
        self.verdict: Optional[str] = None
        self._abort = None   # (libc, the SIGABRT action it replaced): catch_abort
        self._handler = None   # the C-level SIGABRT handler (catch_abort)
        self._threads = [threading.Thread(target=self._beat, daemon=True, name="peers-beat"),
                         threading.Thread(target=self._judge, daemon=True, name="peers-judge")]

    def start(self) -> "PeerWatch":
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        """No verdict from now on (this rank ends on its own). Waits for a store call under
        way: a thread inside one when the interpreter exits aborts the process."""
        self.stopped.set()
        if self._abort is not None and threading.current_thread() is threading.main_thread():
            libc, previous = self._abort
            # paddle's own handler again, with its flags (SA_SIGINFO: it reads the siginfo)
            libc.sigaction(int(signal.SIGABRT), ctypes.byref(previous), None)
            self._abort = None
        for thread in self._threads:
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join(2 * self.interval + 1)

    def settle(self) -> None:
        """A collective call failed: give the watch the short window to name a lost peer (it
        ends the process then); return when every peer still beats."""
        self.window = quick_window(self.timeout)
        end = self.clock() + self.window + 3 * self.interval
        while self.clock() < end and not self.stopped.is_set():
            time.sleep(self.interval / 4)
        self.stop()

    def catch_abort(self) -> None:
        """paddle raises a collective call's failure inside backward (the gradient all-reduce)
        as a C++ exception it cannot convert: std::terminate aborts the process with no Python
        error. A C-level SIGABRT handler (main thread) gives the watch its short window first;
        with no verdict (an abort that is not a lost peer's doing) the handler it replaced runs
        as it would have (paddle's crash report), then the abort goes on. Linux only (the
        layout of `struct sigaction`); elsewhere nothing is installed."""
        if not sys.platform.startswith("linux"):
            return
        libc = ctypes.CDLL(None, use_errno=True)
        previous = _SigAction()
        libc.sigaction(int(signal.SIGABRT), None, ctypes.byref(previous))

        def on_abort(signum, info, context):
            self.settle()   # ends the process on a verdict; else puts `previous` back
            _chain(previous, signum, info, context)

        handler = _SA_HANDLER(on_abort)
        action = _SigAction(handler=ctypes.cast(handler, ctypes.c_void_p).value,
                            flags=_SA_SIGINFO | _SA_RESTART)
        if libc.sigaction(int(signal.SIGABRT), ctypes.byref(action), None) != 0:
            raise OSError(ctypes.get_errno(), "sigaction(SIGABRT)")
        # the callback outlives stop(): stop() runs inside it (settle)
        self._abort, self._handler = (libc, previous), handler

    def observe(self) -> None:
        """One heartbeat: add to this rank's counter, note the peers whose counter moved."""
        self.store.add(KEY.format(self.rank), 1)
        for peer in self.moved:
            count = self.store.add(KEY.format(peer), 0)
            if count != self.counts.get(peer):
                self.counts[peer] = count
                self.moved[peer] = self.clock()
        self.answered = self.clock()

    def _beat(self) -> None:
        while not self.stopped.is_set():
            try:
                self.observe()
            except Exception as e:  # noqa: BLE001  the store's errors: ValueError, RuntimeError
                self.store_error = (str(e).strip().splitlines() or [type(e).__name__])[-1]
                self.failed_at = self.clock()
                return
            self.stopped.wait(self.interval)

    def decide(self) -> Optional[str]:
        """The one line when a peer is lost, else None. A store failure waits two heartbeats
        first: a rank that ends on its own (the run finished) stops its watch meanwhile."""
        now = self.clock()
        grace = 0.0 if self.failed_at is None else self.failed_at + 2 * self.interval - now
        found = lost_ranks(now, self.moved, self.answered, self.store_error, self.window, grace,
                           self.rank)
        if found is None:
            return None
        ranks, why = found
        hint = self.hint()
        return f"error: {describe(ranks, self.local_size)} stopped: {why}" + \
            (f"; {hint}" if hint else "")

    def _judge(self) -> None:
        while not self.stopped.wait(self.interval / 2):
            line = self.decide()
            if line is None or self.stopped.is_set():
                continue
            self.verdict = line
            sys.stdout.flush()
            print(line, file=sys.stderr, flush=True)
            self.exit(PEER_LOST)
            return


def master_endpoint() -> Tuple[str, int]:
    """(host, port) of the TCP store `paddle.distributed.init_parallel_env` met through, found
    as paddle finds it: MASTER_ADDR and MASTER_PORT, else PADDLE_MASTER, else the first of
    PADDLE_TRAINER_ENDPOINTS (the launcher sets them)."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    endpoint = f"{addr}:{port}" if addr and port else (
        os.environ.get("PADDLE_MASTER") or os.environ["PADDLE_TRAINER_ENDPOINTS"].split(",")[0])
    host, port = endpoint.rsplit(":", 1)
    return host, int(port)


def watch(timeout: float, hint: Callable[[], str] = lambda: "") -> Optional[PeerWatch]:
    """Start this rank's watch (after init_parallel_env, every rank at once: after a barrier)
    → the PeerWatch, or None with one rank or `timeout` 0. Its own connection to the store:
    the process group's is not for a second thread."""
    from ernie_doc import distributed as dist
    world = dist.world_size()
    if world == 1 or not timeout:
        return None
    from paddle.base import core
    host, port = master_endpoint()
    store = core.TCPStore(host, port, False, world, 900)
    peer_watch = PeerWatch(store, dist.rank(), world, timeout, hint,
                           dist.local_size() or 1).start()
    if threading.current_thread() is threading.main_thread():
        try:
            peer_watch.catch_abort()
        except (OSError, AttributeError):   # no C library to ask
            pass
    return peer_watch


# -- joining the process group ------------------------------------------------------------------
def not_joined(rank: int, world: int, joined: Optional[List[int]], answering: bool,
               timeout: float, endpoint: str, local_size: int = 1) -> str:
    """What rank `rank` says (PeerLost's message) when the process group has not formed
    `timeout` seconds after it began to join. joined: the ranks marked in the store (`marked`;
    None: not read); answering: whether the store at `endpoint` (host:port, rank 0's) did."""
    head = f"did not join the process group within {timeout:g} s"
    slow = "or raise peer_join_timeout for a slower start (a download, a corpus check)"
    if rank != 0 and not answering:
        return (f"{describe([0], local_size)} {head}: nothing answers at {endpoint}, where it "
                f"serves the TCP store; see node 0's log for an error before training, check "
                f"that it started and that this node reaches that address, {slow}")
    if joined is None:   # rank 0, its own store silent
        return (f"the process group did not form within {timeout:g} s: the TCP store this "
                f"rank serves at {endpoint} did not answer")
    missing = sorted(set(range(world)) - set(joined))
    if not missing:
        return (f"the process group did not form within {timeout:g} s though every rank "
                f"reached it; check that the nodes reach each other on every port, not only "
                f"{endpoint}")
    nodes = sorted({r // max(1, local_size) for r in missing})
    logs = (f"node {nodes[0]}'s log" if len(nodes) == 1 else
            "the logs of nodes " + ", ".join(map(str, nodes)))
    return (f"{describe(missing, local_size)} {head}; see {logs} for an error before "
            f"training, check that {'it' if len(nodes) == 1 else 'each'} started and reaches "
            f"{endpoint}, {slow}")


class _SigEvent(ctypes.Structure):
    """glibc's struct sigevent (Linux, 64 bytes): with notify SIGEV_THREAD_ID, the timer sends
    `signo` to the thread `tid`."""
    _fields_ = [("value", ctypes.c_void_p), ("signo", ctypes.c_int), ("notify", ctypes.c_int),
                ("tid", ctypes.c_int), ("pad", ctypes.c_int * 11)]


class _TimerSpec(ctypes.Structure):
    """struct itimerspec: the interval (0: once), then the first expiry (seconds, nanoseconds)."""
    _fields_ = [("interval_sec", ctypes.c_long), ("interval_nsec", ctypes.c_long),
                ("sec", ctypes.c_long), ("nsec", ctypes.c_long)]


_SIGEV_THREAD_ID, _CLOCK_MONOTONIC = 4, 1


def alarm(seconds: float, callback: Callable[[], None]) -> Optional[Callable[[], None]]:
    """callback() after `seconds`, on this thread, from a C-level SIGALRM handler: it runs even
    while the thread is blocked inside a C++ call that holds the GIL (paddle's TCP store and
    gloo rendezvous do), where neither a Python signal handler nor another thread can run →
    cancel() (disarms, and puts back the SIGALRM action it replaced), or None where no such
    timer can be made (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "timer_create"):   # glibc before 2.34: the timers are in librt
        libc = ctypes.CDLL("librt.so.1", use_errno=True)
    previous, timer = _SigAction(), ctypes.c_void_p()
    handler = _SA_HANDLER(lambda signum, info, context: callback())
    action = _SigAction(handler=ctypes.cast(handler, ctypes.c_void_p).value,
                        flags=_SA_SIGINFO | _SA_RESTART)
    if libc.sigaction(int(signal.SIGALRM), ctypes.byref(action), ctypes.byref(previous)):
        raise OSError(ctypes.get_errno(), "sigaction(SIGALRM)")
    event = _SigEvent(signo=int(signal.SIGALRM), notify=_SIGEV_THREAD_ID,
                      tid=threading.get_native_id())
    nanoseconds = max(1, round(seconds * 1e9))   # 0 would disarm it
    spec = _TimerSpec(sec=nanoseconds // 10**9, nsec=nanoseconds % 10**9)
    if libc.timer_create(_CLOCK_MONOTONIC, ctypes.byref(event), ctypes.byref(timer)) or \
            libc.timer_settime(timer, 0, ctypes.byref(spec), None):
        errno = ctypes.get_errno()
        libc.sigaction(int(signal.SIGALRM), ctypes.byref(previous), None)
        raise OSError(errno, "timer_create")

    def cancel():
        libc.timer_delete(timer)
        # a signal already sent was delivered on the way back from timer_delete
        libc.sigaction(int(signal.SIGALRM), ctypes.byref(previous), None)
        cancel.handler = None
    cancel.handler = handler   # the callback lives as long as the timer
    return cancel


def marked(store, world: int) -> List[int]:
    """The ranks that marked themselves in the store (JOINING), rank 0 among them: it serves
    the store."""
    return [0] + [r for r in range(1, world) if store.add(JOINING.format(r), 0)]


class Joining:
    """This rank's bound on joining the process group (`joining`): `timeout` seconds from its
    start. A rank other than 0 first waits, in Python, for rank 0's TCP store to answer at
    host:port and marks itself there (JOINING); `expire` (the alarm) then names the ranks that
    never did. connect(host, port, timeout) → a client of the store (add(key, n) → the counter),
    OSError while nothing listens."""

    def __init__(self, rank: int, world: int, timeout: float, host: str, port: int,
                 local_size: int = 1, connect: Optional[Callable] = None,
                 exit: Callable[[int], None] = os._exit,
                 clock: Callable[[], float] = time.monotonic):
        self.rank, self.world, self.timeout = rank, world, float(timeout)
        self.host, self.port, self.local_size = host, port, local_size
        self.connect, self.exit, self.clock = connect or store_client, exit, clock
        self.deadline = clock() + self.timeout
        self.joined = False    # set once init_parallel_env returned: the alarm is void
        self.verdict: Optional[str] = None

    def line(self, joined: Optional[List[int]], answering: bool) -> str:
        return not_joined(self.rank, self.world, joined, answering, self.timeout,
                          f"{self.host}:{self.port}", self.local_size)

    def arrive(self) -> None:
        """Rank 0: nothing (its store starts inside init_parallel_env). Another rank: wait
        for rank 0's store, then mark this rank; PeerLost (the one line) at the deadline."""
        if self.rank == 0:
            return
        while True:
            try:
                store = self.connect(self.host, self.port, self.timeout)
                store.add(JOINING.format(self.rank), 1)
                return
            except Exception:  # noqa: BLE001  OSError (nothing listens yet), the store's
                if self.clock() >= self.deadline:
                    raise PeerLost(self.line(None, False)) from None
                time.sleep(min(interval_for(self.timeout) / 2, 0.5))

    def expire(self) -> None:
        """The alarm: unless joined, the one line from what the store says now, then exit."""
        if self.joined:
            return
        try:   # an exception must not end the handler: the wait would go on
            try:
                joined = marked(self.connect(self.host, self.port, self.timeout), self.world)
                answering = True
            except Exception:  # noqa: BLE001  OSError, the store's errors: nothing answers
                joined, answering = None, False
            self.verdict = "error: " + self.line(joined, answering)
            with contextlib.suppress(Exception):   # the thread was stopped inside a write
                sys.stdout.flush()
            os.write(2, self.verdict.encode() + b"\n")   # not sys.stderr: its lock may be held
        finally:
            self.exit(PEER_LOST)


def _meets_over_http() -> bool:
    import paddle
    return os.environ.get("PADDLE_DISTRI_BACKEND", "auto") == "auto" and \
        paddle.device.get_device() == "cpu"


def store_client(host: str, port: int, timeout: float):
    """A client of paddle's TCP store at host:port (not counted among the ranks it waits
    for); OSError at once while nothing listens (paddle's client would retry for `timeout`)."""
    socket.create_connection((host, port), timeout=1).close()
    from paddle.base import core
    return core.TCPStore(host, port, False, 0, max(1, int(timeout)))


@contextlib.contextmanager
def joining(timeout: float) -> Iterator[Optional[Joining]]:
    """Around init_parallel_env: joining the process group within `timeout` seconds, or one
    line naming the ranks that did not join and exit status PEER_LOST (`Joining`; PeerLost
    before init_parallel_env). None with one rank or `timeout` 0: paddle's own wait (900 s);
    so too on CPU without the launcher's PADDLE_DISTRI_BACKEND: paddle's ranks then meet
    through an HTTP server, not the TCP store this reads. Entered once the device is set."""
    from ernie_doc import distributed as dist
    world = dist.world_size()
    if world == 1 or not timeout or _meets_over_http():
        yield None
        return
    host, port = master_endpoint()
    join = Joining(dist.rank(), world, timeout, host, port, dist.local_size() or 1)
    join.arrive()
    # at least a second: the alarm is meant to find the thread waiting inside paddle's C++,
    # not running Python (rank 0's deadline is a full `timeout` away; another rank's may not)
    try:
        cancel = alarm(max(1.0, join.deadline - join.clock()), join.expire)
    except (OSError, AttributeError):   # no timer to be had: rank 0 waits as paddle does
        cancel = None
    try:
        yield join
    finally:
        join.joined = True
        if cancel is not None:
            cancel()


# -- between joining and training --------------------------------------------------------------
def tell(line: str) -> None:
    """Leave this rank's error line in rank 0's TCP store (FAILED), for the ranks whose next
    collective call fails when this one exits (`heard`). Rank 0's own store ends with it."""
    from ernie_doc import distributed as dist
    host, port = master_endpoint()
    store = store_client(host, port, 2)
    store.set(FAILED.format(dist.rank()), line)
    store.add(TOLD.format(dist.rank()), 1)


def heard() -> Optional[str]:
    """Why a collective call failed before training, from the store: the first peer's error
    line (`tell`), rank 0 gone when the store does not answer, else None."""
    from ernie_doc import distributed as dist
    host, port = master_endpoint()
    rank, local_size = dist.rank(), dist.local_size() or 1
    try:
        store = store_client(host, port, 2)
        told = [r for r in range(dist.world_size())
                if r != rank and store.add(TOLD.format(r), 0)]
        if not told:
            return None
        line = store.get(FAILED.format(told[0])).decode("utf-8", "replace")
        return f"{describe(told[:1], local_size)} stopped before training: {line}"
    except Exception:  # noqa: BLE001  OSError, the store's errors: rank 0 and its store gone
        if rank == 0:
            return None
        return (f"{describe([0], local_size)} stopped before training: nothing answers at "
                f"{host}:{port}, where it served the TCP store; see node 0's log for its error")


@contextlib.contextmanager
def telling() -> Iterator[None]:
    """Once the process group is joined, until every rank is ready to train (no watch yet):
    this rank's own error (ErnieDocError, OSError: its one line) is left for the others
    (`tell`); a failed collective call of this rank (gloo raises once a peer exited) becomes
    PeerLost naming the peer and its error (`heard`), not gloo's traceback that names no
    rank. Outside a joined group, nothing."""
    from ernie_doc import distributed as dist
    try:
        yield
    except PeerLost:
        raise
    except Exception as e:
        if not dist.joined():
            raise
        if isinstance(e, (ErnieDocError, OSError)):
            with contextlib.suppress(Exception):   # rank 0's store gone too: nothing to tell
                tell(str(e))
            raise
        line = heard()
        if line is None:
            raise
        raise PeerLost(line) from e
