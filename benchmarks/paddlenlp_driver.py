"""Run PaddleNLP's ERNIE-Doc classifier script (model_zoo/ernie-doc/run_classifier.py)
offline and unmodified: the reference contender of tools/benchmark_finetune.py.

    python -m benchmarks.paddlenlp_driver --script DIR/run_classifier.py \\
        --data-dir DATA --tokenizer TOKDIR [--model-config JSON] [--threads N] \\
        -- SCRIPT_ARGS ...

Four things the script needs cannot be had offline (three downloads and punkt's data); before
it runs (runpy, as `__main__`, with SCRIPT_ARGS as its argv and its own folder first on
sys.path, as `python script.py` has it) exactly these entry points are replaced, nothing in the
script itself:

* `datasets.load_dataset(name, split=...)`: HF `datasets.Dataset`s (`text`, and `label` as a
  2-class ClassLabel) read from DATA/<split>.txt, TSVs in the official IMDB layout (a header
  row naming `label` and `text_a`, tab-separated, no quoting);
* `ErnieDocBPETokenizer.from_pretrained(name)`: the same class built from TOKDIR's vocab.txt,
  encoder.json and vocab.bpe;
* nltk's `sent_tokenize` (the BPE tokenizer splits sentences with it; punkt's data cannot be
  installed offline): `ernie_doc.tokenization.sentences.rule_split_sentences`, the splitter
  this project's reader uses without punkt, so both contenders read the same sentences;
* `ErnieDocForSequenceClassification.from_pretrained(name, num_classes=K)`: the class built
  with random weights from PaddleNLP's own configuration of `name`
  (`ErnieDocModel.pretrained_init_configuration[name]`) updated with --model-config.

Three more things stop the script here (paddle 3, a CPU), none of them in the script's code:

* the script builds every dataset's text preprocessor when it is imported, HYP's too, which
  imports BeautifulSoup (bs4); IMDB never calls it, so a missing bs4 becomes a module whose
  BeautifulSoup raises;
* it always passes AdamW an `lr_ratio` (layer-wise decay), which paddle's AdamW refuses on a
  CPU build. `paddle.optimizer.AdamW` becomes a subclass that drops it on a CPU when it is 1.0
  for every parameter (the script's default --layerwise_decay 1.0: the same update);
* it multiplies paddle.metric.Accuracy's float32 correctness mask by an int64 tensor, which
  paddle 3 refuses (no float x int promotion): `Accuracy.compute` returns the mask as int64,
  which Accuracy.update counts the same.

CPU threads: OMP_NUM_THREADS / MKL_NUM_THREADS (the caller sets them; paddle reads them at
import) and paddle's math threads, set here to --threads.
"""
import argparse
import json
import os
import runpy
import sys
import types
import warnings
import zlib  # noqa: F401  before paddle (2.6.2 import-order bug, see ernie_doc/__init__)
from typing import Any, Callable, Dict, List, Optional, Tuple

# paddle's import warns about a C++ compiler cache it never uses here
warnings.filterwarnings("ignore", message="No ccache found", category=UserWarning)

TOKENIZER_FILES = {"vocab_file": "vocab.txt", "encoder_json_path": "encoder.json",
                   "vocab_bpe_path": "vocab.bpe"}


def split_argv(argv: List[str]) -> Tuple[List[str], List[str]]:
    """argv → (this driver's arguments, the script's: everything after the first `--`)."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def parse_args(argv: List[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--script", required=True, help="PaddleNLP's run_classifier.py")
    p.add_argument("--data-dir", required=True, help="<split>.txt TSVs (train.txt, test.txt)")
    p.add_argument("--tokenizer", required=True, help="vocab.txt, encoder.json, vocab.bpe")
    p.add_argument("--model-config", default="{}",
                   help="JSON object over the released configuration (tiny shapes in tests)")
    p.add_argument("--threads", type=int, default=None, help="paddle's CPU math threads")
    p.add_argument("--flush-denormals", action="store_true",
                   help="flush denormal floats to zero first (ernie_doc.utils.flush_denormals, "
                        "what our runs do by default), for a comparison at equal numerics")
    args = p.parse_args(argv)
    try:
        args.model_config = json.loads(args.model_config)
    except ValueError as e:
        p.error(f"--model-config: not JSON ({e})")
    if not isinstance(args.model_config, dict):
        p.error("--model-config: expected a JSON object")
    return args


def read_imdb_tsv(path: str) -> Dict[str, List[Any]]:
    """An official-layout IMDB TSV → {"text": [...], "label": [int ...]} in file order, the
    text as it is in the file (the script cleans it itself). DataError (a ValueError naming
    the file and line) for a missing column or a bad row."""
    from ernie_doc.data.document import read_tsv
    records = [record for _, record in read_tsv(path, ("label", "text_a"))[1]]
    return {"text": [r["text_a"] for r in records], "label": [int(r["label"]) for r in records]}


def local_load_dataset(data_dir: str) -> Callable[..., Any]:
    """A stand-in for `datasets.load_dataset(name, split=...)` → a function returning one HF
    Dataset per split (a list for a list of splits), read from data_dir/<split>.txt."""
    import datasets

    features = datasets.Features({"text": datasets.Value("string"),
                                  "label": datasets.ClassLabel(num_classes=2)})

    def load_dataset(name: str, *args: Any, split: Any = None, **kwargs: Any) -> Any:
        def one(s):
            columns = read_imdb_tsv(os.path.join(data_dir, f"{s}.txt"))
            return datasets.Dataset.from_dict(columns, features=features)
        if isinstance(split, (list, tuple)):
            return [one(s) for s in split]
        return one(split or "train")
    return load_dataset


def install_sentence_splitter() -> None:
    """nltk's sent_tokenize → rule_split_sentences: patched on nltk when it is installed (its
    punkt data is not), else a stand-in `nltk` module with only that function (PaddleNLP's
    BPE tokenizer imports nltk when built and calls `nltk.tokenize.sent_tokenize`)."""
    from ernie_doc.tokenization.sentences import rule_split_sentences
    try:
        import nltk
        import nltk.tokenize
    except ImportError:
        nltk = types.ModuleType("nltk")
        nltk.tokenize = types.ModuleType("nltk.tokenize")
        sys.modules["nltk"], sys.modules["nltk.tokenize"] = nltk, nltk.tokenize
    nltk.tokenize.sent_tokenize = rule_split_sentences


def install_bs4_stand_in() -> None:
    """Without BeautifulSoup (bs4) installed: a stand-in `bs4` whose BeautifulSoup raises.
    The script builds every dataset's text preprocessor at import, HYP's too, which imports
    bs4; IMDB's never calls it, so IMDB runs need no HTML parser."""
    try:
        import bs4  # noqa: F401
    except ImportError:
        bs4 = types.ModuleType("bs4")

        def beautiful_soup(*args, **kwargs):
            raise ImportError("bs4 (beautifulsoup4) is not installed; only PaddleNLP's hyp "
                              "dataset needs it")
        bs4.BeautifulSoup = beautiful_soup
        sys.modules["bs4"] = bs4


def uniform_lr_ratio(lr_ratio: Any, parameters: Any) -> bool:
    """Whether `lr_ratio` gives every parameter (a list of them, or of param-group dicts)
    the ratio 1.0: what layer-wise decay 1.0, the script's default, gives."""
    params = []
    for item in parameters or []:
        params.extend(item["params"] if isinstance(item, dict) else [item])
    return bool(params) and all(float(lr_ratio(p)) == 1.0 for p in params)


def install_cpu_adamw() -> None:
    """paddle.optimizer.AdamW → a subclass that drops an all-ones `lr_ratio` on a CPU.

    The script always passes lr_ratio (its layer-wise decay) and paddle's AdamW refuses any
    lr_ratio in a CPU build ("'lr_ratio' is unimplemented in CPU"), so the script cannot
    train on a CPU at all. With ratio 1.0 for every parameter (--layerwise_decay 1.0, its
    default) the update is the same without it; any other ratio still reaches paddle's own
    check and error."""
    import paddle

    base = paddle.optimizer.AdamW

    class AdamW(base):
        def __init__(self, *args, lr_ratio=None, parameters=None, **kwargs):
            if lr_ratio is not None and paddle.get_device() == "cpu" and \
                    uniform_lr_ratio(lr_ratio, parameters):
                lr_ratio = None
            super().__init__(*args, lr_ratio=lr_ratio, parameters=parameters, **kwargs)

    AdamW.__name__ = AdamW.__qualname__ = base.__name__
    paddle.optimizer.AdamW = AdamW


def install_integer_accuracy() -> None:
    """paddle.metric.Accuracy.compute → the same correctness mask as int64 instead of float32.

    The script multiplies that mask by the batch's int64 `need_cal_loss`; paddle 3 no longer
    promotes float32 x int64 tensors and raises (paddle 2 did). As 0/1 integers the product
    works, and Accuracy.update counts them the same, so the accuracies it logs are unchanged.
    """
    import paddle

    accuracy = paddle.metric.Accuracy
    if getattr(accuracy.compute, "integer_mask", False):
        return
    compute = accuracy.compute

    def integer_compute(self, pred, label, *args):
        return paddle.cast(compute(self, pred, label, *args), "int64")

    integer_compute.integer_mask = True
    accuracy.compute = integer_compute


def install(data_dir: str, tokenizer_dir: str, model_config: Dict[str, Any]) -> None:
    """Replace the script's four offline-impossible entry points, and the three things that
    stop it under this paddle: bs4 when it is missing, AdamW's lr_ratio on a CPU, Accuracy's
    float mask (see the module's doc)."""
    # paddlenlp before datasets, as the script imports them (PaddleNLP warns about the
    # other order): local_load_dataset imports datasets
    from paddlenlp.transformers import (ErnieDocBPETokenizer, ErnieDocForSequenceClassification,
                                        ErnieDocModel)

    load_dataset = local_load_dataset(data_dir)
    sys.modules["datasets"].load_dataset = load_dataset
    install_sentence_splitter()
    install_bs4_stand_in()
    install_cpu_adamw()
    install_integer_accuracy()
    files = {key: os.path.join(tokenizer_dir, name) for key, name in TOKENIZER_FILES.items()}

    def tokenizer_from_pretrained(cls, name, *args, **kwargs):
        return cls(files["vocab_file"], encoder_json_path=files["encoder_json_path"],
                   vocab_bpe_path=files["vocab_bpe_path"])

    def model_from_pretrained(cls, name, *args, num_classes=2, **kwargs):
        values = dict(ErnieDocModel.pretrained_init_configuration[name])
        values.update(model_config)
        return cls(cls.config_class(**values, num_classes=num_classes))

    ErnieDocBPETokenizer.from_pretrained = classmethod(tokenizer_from_pretrained)
    ErnieDocForSequenceClassification.from_pretrained = classmethod(model_from_pretrained)


def main(argv: Optional[List[str]] = None) -> int:
    """Patch, then run the script → 0 when it returns (a SystemExit of the script exits
    with its status)."""
    own, script_args = split_argv(list(sys.argv[1:] if argv is None else argv))
    args = parse_args(own)
    if args.threads is not None:
        from ernie_doc.utils import set_paddle_threads
        set_paddle_threads(args.threads)
    if args.flush_denormals:
        from ernie_doc.utils import flush_denormals
        flush_denormals()
    install(args.data_dir, args.tokenizer, args.model_config)
    script = os.path.abspath(args.script)
    sys.argv = [script, *script_args]
    sys.path.insert(0, os.path.dirname(script))   # its `from data import ...`
    runpy.run_path(script, run_name="__main__")   # its sys.exit(...) ends this process
    return 0


if __name__ == "__main__":
    sys.exit(main())
