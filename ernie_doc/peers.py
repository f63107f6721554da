"""Ranks watching each other: when one rank stops (its process killed, its node gone), the others
exit with one line naming it instead of waiting in a collective call.

Every rank's watch adds 1 to its own counter in paddle's TCP store (the one
`init_parallel_env` meets through, served by rank 0's process, reachable from every node) every
`interval` seconds and reads the others' counters. A peer whose counter has not moved for
`timeout` seconds (the run config's `peer_timeout`), or the store not answering (rank 0's
process gone), ends this process: one `error:` line on stderr naming the rank, its node and the
checkpoint to resume from, exit status PEER_LOST. After a collective call failed (`settle`), a
live peer still beats, so `quick_window` seconds of silence decide.

Why not paddle's own errors: a killed peer makes gloo raise at once, but with a traceback that
names no rank, or abort the process from C++ when the failed call is the gradient all-reduce
inside backward (`catch_abort` waits for the verdict there); a peer that hangs or whose node is
cut off blocks gloo for its 30 s timeout, and NCCL for longer. Details: docs/pretraining.md,
"Several nodes"."""
import ctypes
import os
import signal
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

PEER_LOST = 75     # EX_TEMPFAIL: the run can go on (resume)
KEY = "ernie_doc/alive/{}"


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
