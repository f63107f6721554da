"""What the two benchmarks share: --threads and --output, setting the CPU threads, the
environment block and printing/writing the JSON result.

tools/benchmark_model.py (benchmarks/model.py) measures the model itself,
tools/benchmark_train.py (benchmarks/train.py) real pretraining runs.
"""
import argparse
import json
import os
import platform
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence

# The repository, which holds both ernie_doc and benchmarks/ (a checkout-only folder): the
# subprocesses of the benchmarks import them from there.
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def add_common_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: paddle's)")
    p.add_argument("--output", default=None, help="also write the JSON here")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output")


def check_output(p: argparse.ArgumentParser, args: argparse.Namespace,
                 inputs: Sequence[Optional[str]] = ()) -> None:
    """--output must be writable and follow ernie_doc.outputs' rule against `inputs` (the
    files and folders the tool reads): never one of them or inside them, a regular file or
    nothing, an existing file only with --overwrite. Checked before minutes of measuring,
    not after; the report is then renamed into place (a link there is replaced, never
    written through)."""
    if args.output is not None:
        # no paddle import: threads are not set
        from ernie_doc.errors import OutputError
        from ernie_doc.outputs import check_output as check_path
        from ernie_doc.outputs import unwritable_file
        try:
            check_path(args.output, [path for path in inputs if path],
                       exists_ok=args.overwrite)
        except OutputError as e:
            p.error(str(e))
        problem = unwritable_file(args.output)
        if problem:
            p.error(f"--output {problem}")


def set_threads(threads: Optional[int]) -> None:
    """Before `import paddle`: paddle reads OMP_NUM_THREADS at import."""
    if threads is not None:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(threads)


def apply_paddle_threads(threads: Optional[int]) -> None:
    if threads is not None:
        from ernie_doc.utils import set_paddle_threads
        set_paddle_threads(threads)


def emit(result: Dict[str, Any], args: argparse.Namespace) -> None:
    """The load average at the end, then the JSON on stdout and (atomically) in --output."""
    try:  # other work on the machine skews timings: say how busy it was
        result["environment"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    text = json.dumps(result, indent=2)
    print(text)
    if args.output:
        from ernie_doc.utils import atomic_write_text, write_error_types, write_failure
        try:
            atomic_write_text(args.output, text + "\n")
        except write_error_types() as e:   # full disk, read-only (checked free at the start)
            message = write_failure(e, args.output, "--output", target_is_dir=False)
            if message is None:
                raise
            print(f"error: {message} (the results are on stdout above)", file=sys.stderr)
            sys.exit(2)


def allocated_bytes() -> int:
    """Bytes paddle's allocator holds for live tensors right now on the current device (host
    memory on a CPU). Unlike the RSS, it excludes what the allocator and the libraries keep
    cached, so it measures what a loop retains, not how big its working set once was."""
    import paddle
    try:
        from paddle.base import core
    except ImportError:   # paddle 2.4 and earlier
        from paddle.fluid import core
    device = paddle.get_device()
    if device.startswith("gpu"):
        index = int(device.split(":")[1]) if ":" in device else 0
        return int(core.device_memory_stat_current_value("Allocated", index))
    return int(core.host_memory_stat_current_value("Allocated", 0))


def retention(allocated_after: List[int]) -> Dict[str, Any]:
    """Whether a stream retains memory: allocated bytes after segment n and after segment 2n
    of a stream of 2n (or 2n + 1) segments → {segments, allocated_bytes, growth_bytes, flat}.
    The state a stream carries (the memories) has a fixed size, so the second half must end
    with exactly what the first ended with; anything kept per segment (an output list, a
    graph chained through the memories) grows by n times its size. None under 2 segments."""
    n = len(allocated_after) // 2
    if n < 1:
        return {"segments": [len(allocated_after)], "flat": None}
    first, second = int(allocated_after[n - 1]), int(allocated_after[2 * n - 1])
    return {"segments": [n, 2 * n], "allocated_bytes": [first, second],
            "growth_bytes": second - first, "flat": second <= first}


def measure_retention(step: Callable[[int], Any], segments: int) -> Dict[str, Any]:
    """Run step(0) .. step(2·segments − 1), reading `allocated_bytes` after each, →
    `retention` of the series."""
    allocated = []
    for i in range(2 * segments):
        step(i)
        allocated.append(allocated_bytes())
    return retention(allocated)


def environment(args: argparse.Namespace, paddlenlp: bool = True) -> Dict[str, Any]:
    """Versions, CPU count, threads and load average; paddlenlp: also its version (its import
    takes seconds)."""
    import paddle
    env = {
        "python": platform.python_version(),
        "paddle": paddle.__version__,
        "cpu_count": os.cpu_count(),
        "threads_arg": args.threads,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "machine": platform.machine(),
    }
    if paddlenlp:
        try:
            import paddlenlp
            env["paddlenlp"] = paddlenlp.__version__
        except Exception:  # noqa: BLE001 - the baseline is optional
            env["paddlenlp"] = None
    try:
        env["load_average_at_start"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    return env
