"""Run one long document through ERNIE-Doc segment by segment, carrying the memories.

    ernie-doc run-document [--model ernie-doc-base-en|CHECKPOINT_DIR --text doc.txt]

Prints each segment's shapes and time, then a JSON summary; with no --model, a randomly
initialised `ernie-doc-small` on a deterministic synthetic document (offline). A bad argument
or input prints one `error:` line, exit 2 (--debug: traceback).
"""
import argparse
import json
import os
import stat
import sys
import time
import zlib  # noqa: F401  before paddle (2.6.2 import-order bug, see ernie_doc/__init__)

import numpy as np

from ernie_doc.cli import exit_on_user_error, user_error_types, with_notes_on_stdout
from ernie_doc.config import ErnieDocConfig
from ernie_doc.data import segment_batches
from ernie_doc.errors import InputError
from ernie_doc.hub import is_released, is_url
from ernie_doc.hub.archive import is_archive
from ernie_doc.outputs import check_output, unwritable_file
from ernie_doc.resources import release_free_memory
from ernie_doc.tokenization import load_tokenizer
from ernie_doc.utils import atomic_write_text, read_utf8

MAX_TOKENS = 10_000_000   # the synthetic document is held as int64 ids (80 MB at the most)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="ernie-doc-small",
                   help="a released name (its weights, fetched once into the cache), a "
                        "checkpoint directory, URL or .tar.gz, or a preset name / config json "
                        "(random weights)")
    p.add_argument("--text", help="a UTF-8 text file (default: synthetic token ids)")
    p.add_argument("--tokenizer", help="tokenizer directory or released name (default: "
                                       "--model's, when it is a checkpoint or a released "
                                       "name)")
    p.add_argument("--tokens", type=int, default=4096, help="length of the synthetic document")
    p.add_argument("--seq-len", type=int, help="segment length T (default: max positions)")
    p.add_argument("--recurrence", choices=["enhanced", "xl", "none"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", help="also write the JSON summary here")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    args = p.parse_args(argv)
    if not 1 <= args.tokens <= MAX_TOKENS:
        p.error(f"--tokens must be in [1, {MAX_TOKENS:,}], got {args.tokens}")
    if args.seq_len is not None and args.seq_len < 1:
        p.error(f"--seq-len must be a positive integer, got {args.seq_len}")
    if not 0 <= args.seed < 2 ** 32:
        p.error(f"--seed must be in [0, 2^32), got {args.seed}")
    if args.output is not None and (args.output.endswith(os.sep) or os.path.isdir(args.output)):
        p.error(f"--output {args.output}: is a directory; give a file name")
    return args


def _regular_file(path, what):
    """Refuse before any work what cannot be read as `what`: missing, a directory, a FIFO
    (reading it would block) or a device."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise InputError(f"{what} {path}: {e.strerror}") from None
    if stat.S_ISDIR(mode):
        raise InputError(f"{what} {path}: is a directory, not a text file")
    if not stat.S_ISREG(mode):
        raise InputError(f"{what} {path}: not a regular file")


def check_inputs(args):
    """Everything about the files that can be checked before paddle and the model load."""
    if args.text is not None:
        _regular_file(args.text, "--text")
        if args.tokenizer is None and not os.path.isdir(args.model) and \
                not is_checkpoint_spec(args.model):
            raise InputError("--text needs --tokenizer DIR (or a checkpoint directory as "
                             "--model)")
    if args.tokenizer is not None and not os.path.exists(args.tokenizer) and \
            not is_checkpoint_spec(args.tokenizer):
        raise InputError(f"--tokenizer {args.tokenizer}: no such file or directory")
    if args.output is not None:
        problem = unwritable_file(args.output)
        if problem:
            raise InputError(f"--output {problem}")
        check_output(args.output, [args.text, args.tokenizer, args.model], exists_ok=True,
                     error=InputError)   # replaced as before, but never an input nor a FIFO


def is_checkpoint_spec(spec) -> bool:
    """A released name, URL or archive: weights that ernie_doc.hub.resolve fetches (a preset
    that was never released, e.g. ernie-doc-small, is a config: random weights)."""
    return is_released(spec) or is_url(spec) or (os.path.isfile(spec) and is_archive(spec))


def load_model(spec, recurrence=None):
    from ernie_doc.modeling import ErnieDocModel
    overrides = {"recurrence": recurrence} if recurrence else {}
    if os.path.isdir(spec) or is_checkpoint_spec(spec):
        return ErnieDocModel.from_pretrained(spec, **overrides)
    return ErnieDocModel(ErnieDocConfig.from_any(spec, **overrides))


def document_ids(args, config):
    """The document's token ids (int64 [n]) and the tokenizer (None for the synthetic
    document)."""
    if args.text is None:
        rng = np.random.RandomState(args.seed)
        return rng.randint(4, config.vocab_size, args.tokens).astype(np.int64, copy=False), None
    source = args.tokenizer or args.model
    try:
        tokenizer = load_tokenizer(source)
    except FileNotFoundError as e:   # the place exists (check_inputs): no tokenizer files in it
        raise InputError(f"--tokenizer {source}: {e}" if args.tokenizer else
                         f"--model {source}: {e}; give --tokenizer DIR") from None
    text = read_utf8(args.text, InputError)
    if not text.strip():
        raise InputError(f"--text {args.text}: the file holds no text")
    ids = np.asarray(tokenizer.encode(text), dtype=np.int64)
    release_free_memory()   # what tokenizing a long text freed (a Python int a token ...)
    if not len(ids):
        raise InputError(f"--text {args.text}: the text has no tokens for this tokenizer")
    return ids, tokenizer


def run(args):
    import paddle

    paddle.seed(args.seed)
    model = load_model(args.model, args.recurrence)
    model.eval()
    config = model.config
    seg_len = args.seq_len or config.max_position_embeddings
    if seg_len > config.max_position_embeddings:
        raise InputError(f"--seq-len {seg_len} exceeds the model's max_position_embeddings "
                         f"{config.max_position_embeddings}")
    ids, _ = document_ids(args, config)
    print(f"model: L={config.num_hidden_layers} H={config.hidden_size} "
          f"M={config.memory_len} recurrence={config.recurrence}; document: {len(ids)} tokens "
          f"in segments of {seg_len}")
    memories, segments, seconds = None, 0, 0.0   # nothing kept per segment
    with paddle.no_grad():
        for chunk, mask, new_doc in segment_batches([ids], seg_len, pad_id=config.pad_token_id,
                                                    return_tensors="pd"):
            t0 = time.perf_counter()
            out = model(chunk, memories, attention_mask=mask, reset_memory=new_doc)
            memories = out.memories
            took = time.perf_counter() - t0
            segments, seconds = segments + 1, seconds + took
            mem_shape = None if memories is None else list(memories.shape)
            print(f"segment {segments:4d}: sequence_output {list(out.sequence_output.shape)} "
                  f"pooled {list(out.pooled_output.shape)} memories {mem_shape} "
                  f"{took * 1000:8.1f} ms")
    summary = {"tokens": len(ids), "segments": segments, "seq_len": seg_len,
               "seconds": round(seconds, 4),
               "tokens_per_second": round(segments * seg_len / max(seconds, 1e-9), 1),
               "pooled_output_norm": round(float(paddle.linalg.norm(out.pooled_output)), 6)}
    print(json.dumps(summary))
    if args.output:
        atomic_write_text(args.output, json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv=None):
    """→ the JSON summary (dict). Bad input: one `error:` line and exit status 2."""
    args = parse_args(argv)
    try:
        check_inputs(args)
        return run(args)
    except user_error_types() as e:   # or a failed --output write (full disk ...)
        exit_on_user_error(e, args.debug, args.output, "--output", target_is_dir=False)
        raise


def command(argv=None) -> int:
    return with_notes_on_stdout(main, argv)


if __name__ == "__main__":
    sys.exit(command())
