"""The benchmarks: checkout-only (never installed), run as tools/benchmark_<x>.py.

    model.py             the model's throughput against PaddleNLP, parity and streaming
    train.py             pretraining throughput: real runs with 1..N processes
    predict.py           predict throughput per engine on real documents
    finetune.py          fine-tuning side by side with PaddleNLP's ERNIE-Doc script
    paddlenlp_driver.py  runs that script offline for finetune.py
    reference.py         PaddleNLP's ErnieDocModel behind our calling convention
    common.py            what they share: --threads, --output, the JSON report
"""
# first, as the `ernie-doc` command has it: ernie_doc imports zlib before paddle can be, and
# ernie_doc.cli filters paddle's import warning (stderr keeps only an error line)
import ernie_doc.cli  # noqa: F401
