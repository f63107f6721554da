"""Run one long document through ERNIE-Doc segment by segment, carrying the memories.

    python tools/run_document.py                                   # offline built-in default
    python tools/run_document.py --model ernie-doc-base-en --text doc.txt --tokenizer DIR
    python tools/run_document.py --model CHECKPOINT_DIR --text doc.txt

Prints each segment's shapes and time, then a JSON summary. The built-in default is a
randomly initialised `ernie-doc-small` on a deterministic 4,096-token synthetic document.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="ernie-doc-small",
                   help="preset name, config json, or checkpoint directory")
    p.add_argument("--text", help="a UTF-8 text file (default: synthetic token ids)")
    p.add_argument("--tokenizer", help="directory with the tokenizer files (default: --model "
                                       "when it is a directory)")
    p.add_argument("--tokens", type=int, default=4096, help="length of the synthetic document")
    p.add_argument("--seq-len", type=int, help="segment length T (default: max positions)")
    p.add_argument("--recurrence", choices=["enhanced", "xl", "none"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", help="also write the JSON summary here")
    return p.parse_args(argv)


def load_model(spec, recurrence=None):
    from ernie_doc import ErnieDocConfig, ErnieDocModel
    overrides = {"recurrence": recurrence} if recurrence else {}
    if os.path.isdir(spec):
        return ErnieDocModel.from_pretrained(spec, **overrides)
    return ErnieDocModel(ErnieDocConfig.from_any(spec, **overrides))


def document_ids(args, config):
    if args.text is None:
        rng = np.random.RandomState(args.seed)
        return rng.randint(4, config.vocab_size, args.tokens).tolist(), None
    from ernie_doc.tokenization import load_tokenizer
    source = args.tokenizer or (args.model if os.path.isdir(args.model) else None)
    if source is None:
        raise SystemExit("error: --text needs --tokenizer DIR (or a checkpoint directory as "
                         "--model)")
    tokenizer = load_tokenizer(source)
    with open(args.text, encoding="utf-8") as f:
        return tokenizer.encode(f.read()), tokenizer


def main(argv=None):
    args = parse_args(argv)
    import paddle
    paddle.seed(args.seed)
    model = load_model(args.model, args.recurrence)
    model.eval()
    config = model.config
    seg_len = args.seq_len or config.max_position_embeddings
    ids, _ = document_ids(args, config)
    if not ids:
        raise SystemExit(f"error: {args.text}: the document is empty")
    print(f"model: L={config.num_hidden_layers} H={config.hidden_size} "
          f"M={config.memory_len} recurrence={config.recurrence}; document: {len(ids)} tokens "
          f"in segments of {seg_len}")
    memories, times = None, []
    from ernie_doc.data.segment import windows
    with paddle.no_grad():
        for start, end in windows(len(ids), seg_len, seg_len):
            chunk = ids[start:end]
            mask = [1.0] * len(chunk) + [0.0] * (seg_len - len(chunk))
            chunk = chunk + [config.pad_token_id] * (seg_len - len(chunk))
            t0 = time.perf_counter()
            out = model(paddle.to_tensor([chunk], dtype="int64"), memories,
                        attention_mask=paddle.to_tensor([mask]))
            memories = out.memories
            times.append(time.perf_counter() - t0)
            mem_shape = None if memories is None else list(memories.shape)
            print(f"segment {len(times):4d}: sequence_output {list(out.sequence_output.shape)} "
                  f"pooled {list(out.pooled_output.shape)} memories {mem_shape} "
                  f"{times[-1] * 1000:8.1f} ms")
    summary = {"tokens": len(ids), "segments": len(times), "seq_len": seg_len,
               "seconds": round(sum(times), 4),
               "tokens_per_second": round(len(times) * seg_len / sum(times), 1),
               "pooled_output_norm": round(float(paddle.linalg.norm(out.pooled_output)), 6)}
    print(json.dumps(summary))
    if args.output:
        from ernie_doc.utils import atomic_write_text
        atomic_write_text(args.output, json.dumps(summary, indent=2) + "\n")
    return summary


if __name__ == "__main__":
    main()
