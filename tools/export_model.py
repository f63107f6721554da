#!/usr/bin/env python
"""Export ERNIE-Doc (bare or with a task head) for paddle.inference.

    python tools/export_model.py --config ernie-doc-base-en --output out/ernie_doc \
        [--head sequence_classification --num-labels 2 | question_answering |
         token_classification --num-labels N | multiple_choice --num-choices 4]
        [--batch-size 8 | --batch-size dynamic] [--seq-len 512]

--config is a checkpoint directory in any layout `from_pretrained` reads (official, PaddleNLP,
ours), or a preset name / config JSON (random weights, for trying the pipeline). Writes <output>.json (paddle 3.x) or <output>.pdmodel
(paddle 2.6), <output>.pdiparams and the sidecar <output>.meta.json; prints a JSON summary.
See ernie_doc/inference.py for the exported signature and the Predictor that runs it.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args(argv=None):
    from ernie_doc.heads import HEADS
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True,
                   help="preset name, config JSON, or checkpoint directory")
    p.add_argument("--output", required=True, help="output prefix, e.g. out/ernie_doc")
    p.add_argument("--head", default="none",
                   choices=["none"] + [h for h in HEADS if h != "pretraining"])
    p.add_argument("--num-labels", type=int, default=None,
                   help="sequence/token classification labels (default: the config's)")
    p.add_argument("--num-choices", type=int, default=4, help="multiple choice: choices")
    p.add_argument("--batch-size", default="dynamic",
                   help="fixed batch size, or 'dynamic' (default)")
    p.add_argument("--seq-len", type=int, default=None,
                   help="segment length T (default: max_position_embeddings)")
    args = p.parse_args(argv)
    if args.batch_size == "dynamic":
        args.batch_size = None
    else:
        try:
            args.batch_size = int(args.batch_size)
        except ValueError:
            p.error(f"--batch-size must be an integer or 'dynamic', got {args.batch_size!r}")
    return args


def head_kwargs(args):
    if args.head in ("sequence_classification", "token_classification") and args.num_labels:
        return {"num_labels": args.num_labels}
    if args.head == "multiple_choice":
        return {"num_choices": args.num_choices}
    return {}


def build_model(args):
    """The model to export: (model, where its weights came from)."""
    from ernie_doc import ErnieDocConfig, ErnieDocModel
    from ernie_doc.heads import HEADS

    cls = ErnieDocModel if args.head == "none" else HEADS[args.head]
    kwargs = head_kwargs(args)
    if os.path.isdir(args.config):
        return cls.from_pretrained(args.config, **kwargs), f"from_pretrained({args.config})"
    print("warning: --config is not a checkpoint directory: exporting random weights",
          file=sys.stderr)
    return cls(ErnieDocConfig.from_any(args.config), **kwargs), "random"


def main(argv=None):
    args = parse_args(argv)
    from ernie_doc.inference import export

    model, source = build_model(args)
    seq_len = args.seq_len or model.config.max_position_embeddings
    info = export(model, args.output, seq_len=seq_len, batch_size=args.batch_size)
    summary = {
        "model_path": info["model_path"],
        "params_path": info["params_path"],
        "meta_path": info["meta_path"],
        "model_class": info["model_class"],
        "weights": source,
        "seq_len": info["seq_len"],
        "batch_size": info["batch_size"],
        "memory_shape": info["memory_shape"],
        "inputs": [i["name"] for i in info["inputs"]],
        "outputs": [o["name"] for o in info["outputs"]],
    }
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
