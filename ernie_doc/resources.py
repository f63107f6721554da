"""Will it fit? Memory estimates made from a config before anything is allocated, so that a
config that needs more memory than is available is one error line with the numbers, not a
MemoryError minutes into a run. The terms: docs/design-notes.md, "Memory estimates"."""
import ctypes
import functools
import math
import os
from typing import Callable, Optional

from ernie_doc.errors import ConfigError

GiB = float(1 << 30)


def _meminfo_available() -> Optional[int]:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _cgroup_available() -> Optional[int]:
    """What a cgroup (v2, else v1) memory limit leaves, or None without a limit."""
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_file, encoding="ascii") as f:
                limit = f.read().strip()
            with open(usage_file, encoding="ascii") as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or not limit.isdigit() or int(limit) >= 1 << 60:
            return None   # no limit (v1 writes a huge number)
        return max(0, int(limit) - usage)
    return None


def _status_bytes(field: str) -> Optional[int]:
    """A `VmSize:`-style field of /proc/self/status in bytes, or None."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _rlimit_available() -> Optional[int]:
    """What this process's own limits leave: soft RLIMIT_AS less VmSize and soft RLIMIT_DATA
    less VmData; None when neither is set."""
    try:
        import resource
    except ImportError:   # not on a POSIX system
        return None
    values = []
    for name, field in (("RLIMIT_AS", "VmSize"), ("RLIMIT_DATA", "VmData")):
        which = getattr(resource, name, None)
        if which is None:
            continue
        try:
            soft = resource.getrlimit(which)[0]
        except (OSError, ValueError):
            continue
        if soft == resource.RLIM_INFINITY or soft < 0:
            continue
        values.append(max(0, soft - (_status_bytes(field) or 0)))
    return min(values) if values else None


def current_device() -> str:
    """"gpu" when paddle places new tensors on a GPU, else "cpu"."""
    import paddle
    return "gpu" if str(paddle.get_device()).startswith("gpu") else "cpu"


def available_memory(device: Optional[str] = None) -> Optional[int]:
    """Bytes this process can still allocate on `device` (None: paddle's current), or None
    when unknown. CPU: MemAvailable within cgroup and rlimits; GPU: the total memory."""
    device = device or current_device()
    if device == "gpu":
        try:
            import paddle
            return int(paddle.device.cuda.get_device_properties(0).total_memory)
        except Exception:   # no CUDA build or no device: nothing to say  # noqa: BLE001
            return None
    values = [v for v in (_meminfo_available(), _cgroup_available(), _rlimit_available())
              if v is not None]
    return min(values) if values else None


def parameter_count(build: Callable[[int], object], layers: int) -> int:
    """Parameters of `build(layers)`'s model, exact and fast: only one- and two-layer models are
    built (under paddle.LazyGuard); each further layer adds what the second did."""
    import paddle

    def count(n: int) -> int:
        with paddle.LazyGuard():
            layer = build(n)
        # Python integers: numpy's int64 product wraps around for absurd shapes
        return sum(math.prod(int(d) for d in p.shape) for p in layer.parameters())

    if layers <= 2:
        return count(layers)
    one, two = count(1), count(2)
    return one + (layers - 1) * (two - one)


def activation_bytes(layers: int, rows: int, tokens: int, keys: int, hidden: int,
                     heads: int) -> int:
    """Activations kept for backward by `layers` Transformer layers reading `rows` rows of
    `tokens` tokens that attend to `keys` keys (tokens + memory): per token Korthikanti et
    al.'s count in float32, 68·H + 10·heads·K, and what relative attention adds, the position
    queries (4·H) and the position scores before the shift (4·heads·(K + T), at most K + T
    columns); per row, the tokens + keys position rows it reads (4·(T + K)·H)."""
    per_token = 72 * hidden + 10 * heads * keys + 4 * heads * (keys + tokens)
    return layers * rows * (tokens * per_token + 4 * (tokens + keys) * hidden)


def layer_input_bytes(layers: int, rows: int, keys: int, hidden: int) -> int:
    """What recomputing `layers` layers in backward keeps of each: its inputs, the `keys`
    rows (tokens + memory) of `rows` rows, float32."""
    return 4 * layers * rows * keys * hidden


def recomputed_activation_bytes(layers: int, rows: int, tokens: int, keys: int, hidden: int,
                                heads: int) -> int:
    """activation_bytes when each layer is recomputed in backward (`recompute: true`): every
    layer's inputs, and one layer's activations while it is recomputed."""
    return layer_input_bytes(layers, rows, keys, hidden) + \
        activation_bytes(1, rows, tokens, keys, hidden, heads)


def describe(nbytes: float, gib_from: float = 0.1) -> str:
    """A size in GiB from `gib_from` GiB up, else in MiB."""
    return f"{nbytes / GiB:.1f} GiB" if nbytes >= gib_from * GiB else \
        f"{nbytes / (1 << 20):.0f} MiB"


def check_fits(parts: dict, what: str, device: Optional[str] = None,
               available: Optional[int] = None) -> int:
    """The total of `parts` ({label: bytes}); ConfigError when it exceeds what `device` has
    (`available` overrides the measurement)."""
    device = device or current_device()
    total = int(sum(parts.values()))
    free = available_memory(device) if available is None else available
    if free is not None and total > free:
        detail = " + ".join(f"{label} {describe(n)}" for label, n in parts.items() if n)
        where = "the GPU's memory" if device == "gpu" else "the memory available"
        raise ConfigError(f"{what}: needs about {describe(total)} ({detail}) but {where} is "
                          f"{describe(free)}; use a smaller model, batch_size or max_seq_len")
    return total


# What a layer costs beyond its tensors' data, counted low: a mistyped num_hidden_layers of
# 10**6 with a tiny hidden size is then refused at once.
LAYER_OVERHEAD = 128 << 10


def training_parts(params: int, layers: int, rows: int, tokens: int, memory_len: int,
                   hidden: int, heads: int, training: bool = True,
                   recompute: bool = False) -> dict:
    """The estimate of the module docstring, by part ({label: bytes}), with LAYER_OVERHEAD
    per layer; `recompute`: the layers' activations recomputed in backward."""
    weights = 4 * params
    parts = {"weights": weights}
    if training:
        parts["gradients + Adam moments"] = 3 * weights
        kept = recomputed_activation_bytes if recompute else activation_bytes
        parts["activations"] = kept(layers, rows, tokens, tokens + memory_len, hidden, heads)
    else:   # no graph kept: one layer's activations at a time
        parts["activations"] = activation_bytes(1, rows, tokens, tokens + memory_len, hidden,
                                                heads)
    parts["memories"] = 4 * layers * rows * memory_len * hidden
    parts["layer objects"] = LAYER_OVERHEAD * layers
    return parts


@functools.lru_cache(maxsize=1)
def _libc() -> Optional[ctypes.CDLL]:
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:   # not glibc
        return None


def release_free_memory() -> bool:
    """Give the C heap's free pages back to the system (glibc's malloc_trim) → whether any were:
    after a large transient (tokenizing a long document) the freed memory would otherwise stay
    resident for the rest of the run. False without glibc."""
    libc = _libc()
    return bool(libc.malloc_trim(0)) if libc is not None else False
