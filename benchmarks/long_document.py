"""One long document through `predict`, in a process of its own: tokens/s and resident memory.

Run by benchmarks/predict.py (`--long-document TOKENS ...`) as a script, with the ernie_doc
to measure first on PYTHONPATH (this checkout's, or `--compare-with`'s): this file imports
nothing else of the checkout, so an older ernie_doc is measured with the same harness.

    python benchmarks/long_document.py MODEL INPUT FORMAT TOKENS THREADS BATCH_SIZE

The document is the input's texts joined (cycled when too few) until the model's tokenizer
counts TOKENS. It prints JSON lines: {"progress": ...} every few seconds while it is read (so
a run stopped by a timeout still says how far it got and how much memory it held), then the
result: document tokens, seconds, tokens/s, the model calls' share, peak (of the reading
alone where the kernel allows resetting it) and final resident memory, and the prediction."""
import json
import os
import sys
import threading
import time
from typing import Any, Dict, List

PROGRESS_SECONDS = 5.0


class TimedModel:
    """The pipeline's model with each call timed and the tokens it read counted (the real
    tokens of the batch: attention_mask's sum)."""

    def __init__(self, model):
        self.model, self.config = model, model.config
        self.seconds, self.tokens, self.calls = 0.0, 0, 0

    def eval(self):
        return self

    def __call__(self, input_ids, *args, **kwargs):
        start = time.perf_counter()
        out = self.model(input_ids, *args, **kwargs)
        for value in vars(out).values() if not hasattr(out, "_fields") else out:
            if hasattr(value, "numpy"):   # wait for the result (nothing runs lazily on CPU,
                value.numpy()             # but a GPU would return before finishing)
                break
        self.seconds += time.perf_counter() - start
        mask = args[2] if len(args) > 2 else kwargs.get("attention_mask")
        self.tokens += int(mask.sum()) if mask is not None else int(input_ids.size)
        self.calls += 1
        return out


def status_bytes(field: str) -> int:
    """A size from /proc/self/status ("VmRSS", "VmHWM": resident now, its peak)."""
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def resident_bytes() -> int:
    return status_bytes("VmRSS")


def reset_peak() -> bool:
    """Start the peak resident memory (VmHWM) anew, so it measures the document's reading
    alone, not the set-up before it; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def long_text(path: str, fmt: str, tokenizer: Any, tokens: int) -> str:
    """The input's texts, in order and cycled, joined by a space until the tokenizer counts
    `tokens` in them (each text counted once, when first used)."""
    from ernie_doc.predict.pipeline import read_inputs
    texts: List[str] = []
    for item in read_inputs(path, fmt):
        text = item if isinstance(item, str) else (item or {}).get("text")
        if isinstance(text, str) and text.strip():
            texts.append(text)
    if not texts:
        raise SystemExit(f"{path}: no document with a text")
    counts: Dict[int, int] = {}
    parts, total = [], 0
    while total < tokens:
        k = len(parts) % len(texts)
        if k not in counts:
            counts[k] = len(tokenizer.encode(texts[k]))
        parts.append(texts[k])
        total += counts[k]
    return " ".join(parts)


def measure(model: str, path: str, fmt: str, tokens: int, threads: int,
            batch_size: int) -> Dict[str, Any]:
    """The document of `tokens` tokens through Pipeline.stream, timed, its memory sampled."""
    from ernie_doc.predict.pipeline import Pipeline
    pipe = Pipeline.from_pretrained(model, batch_size=batch_size or None, threads=threads)
    text = long_text(path, fmt, pipe.tokenizer, tokens)
    list(pipe.stream([text[:2000]]))   # the first steps build paddle's kernels and caches
    timed = TimedModel(pipe.model)
    pipe.model = pipe.run.model = timed
    counted, encode = [], pipe.tokenizer.encode

    def counting_encode(*args, **kwargs):
        ids = encode(*args, **kwargs)
        counted.append(len(ids))
        return ids
    pipe.tokenizer.encode = counting_encode
    peak_of_read = reset_peak()
    start, done = time.perf_counter(), threading.Event()

    def report():   # how far, and how much memory, while the document is read
        while not done.wait(PROGRESS_SECONDS):
            print(json.dumps({"progress": {
                "seconds": round(time.perf_counter() - start, 1), "model_calls": timed.calls,
                "model_tokens": timed.tokens, "rss_mib": round(resident_bytes() / 2**20, 1)}}),
                flush=True)
    watch = threading.Thread(target=report, daemon=True)
    watch.start()
    [record] = pipe.stream([text])
    seconds = time.perf_counter() - start
    done.set()
    return {"tokens": counted[0], "seconds": round(seconds, 2),
            "tokens_per_sec": round(counted[0] / seconds, 1), "segments": record["segments"],
            "model_calls": timed.calls, "model_seconds": round(timed.seconds, 2),
            "model_share": round(timed.seconds / seconds, 3),
            # tokenizing, cutting, scheduling, collating, the tensors, the row outputs
            "outside_model_ms_per_call": round((seconds - timed.seconds) / max(1, timed.calls)
                                               * 1e3, 3),
            "peak_rss_mib": round(status_bytes("VmHWM") / 2**20, 1),
            "peak_rss_of": "the reading" if peak_of_read else "the process",
            "rss_at_end_mib": round(resident_bytes() / 2**20, 1),
            "prediction": {k: v for k, v in record.items() if k not in ("index",)},
            "ernie_doc": os.path.dirname(os.path.dirname(os.path.abspath(
                sys.modules["ernie_doc"].__file__)))}


def main(argv: List[str]) -> int:
    model, path, fmt, tokens, threads, batch_size = argv
    threads = int(threads)
    if threads:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(threads)
    print(json.dumps({"result": measure(model, path, fmt, int(tokens), threads or 1,
                                        int(batch_size))}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
