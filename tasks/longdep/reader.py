"""longdep: synthetic documents whose label joins two key tokens placed segments apart.

Task
----
A document is n windows ("segments") of `segment_tokens` = T-2 token ids, n drawn uniformly from
[min_segments, max_segments]. Tokens are filler (uniform over `filler_vocab` ids) except:

- key1 ∈ {KEY_A, KEY_B}, written at `key_count` random positions of the FIRST segment,
- key2 ∈ {KEY_C, KEY_D}, written at `key_count` random positions of the LAST segment,

label = "1" if (key1 == KEY_A) XOR (key2 == KEY_C) else "0". Labels and all four key pairs are
equally likely, so no single segment (nor the length) says anything about the label: only a
model that carries key1 from segment 1 to segment n can solve a document. The segmenter cuts
windows of segment_tokens with stride segment_tokens (no overlap), so key1 and key2 always land
in the first and the last window. Several copies of each key make the keys salient, which lets a
tiny model learn the XOR in seconds.

Why the four ablations separate (defaults: 2..4 segments, 1-layer model)
------------------------------------------------------------------------
- recurrence "none": a segment sees only itself; no segment sees both keys → chance (~50%).
- recurrence "xl" (layer n caches layer n-1's output): information moves back at most one
  segment per layer, so with L layers the last segment reaches key1 only when n <= L + 1.
  With L = 1 only 2-segment documents are solvable: accuracy ≈ 1/3 + 2/3 · 1/2 ≈ 0.67.
- recurrence "enhanced" (ERNIE-Doc, layer n caches its own output): context is unbounded, so
  every length is solvable in principle; but only the last segment can know the label and the
  memory is detached, so the model has to learn to keep key1 over n-1 hops from the last
  segment's loss alone: 3-segment documents are learnt, 4-segment ones only partly.
- "enhanced" + retrospective feed: the retrospective pass starts from the memory the skim pass
  left after the last segment (key2 seen, key1 carried), so its FIRST segment sees key1 directly
  and key2 one hop back: every document, whatever its length, is a one-hop problem, and every
  retrospective segment can know the label (the label is copied one hop at a time) → learnt
  fastest and solved at every length (~100%).

Options (all optional; unknown keys raise DataError naming the key)
--------------------------------------------------------------------
num_docs        int, or {split: int}; documents per split (default train 10000, dev/test 500)
seed            int (default 0); each split draws from its own stream (seed, split)
segment_tokens  int >= 2, = T - 2, the window size of the segmenter (default 6, i.e. T = 8)
min_segments    int >= 1 (default 2)        max_segments   int >= min_segments (default 4)
filler_vocab    int in [1, 24], number of distinct filler ids (default 16)
key_count       int >= 1, copies of each key (default 4); must fit the first / last window
last_min_fill   float in (0, 1], shortest last window as a share of segment_tokens (default 1.0)
special_ids     {pad, cls, sep}: their ids (default {pad: 0, cls: 1, sep: 2})
first_id        int >= 0 (default 4): the keys are first_id .. first_id+3, the filler follows

`special_ids`/`first_id` let a model pretrained with a tokenizer read the task with its own
[PAD]/[CLS]/[SEP] (e.g. the SentencePiece tokenizers trained here: {pad: 0, cls: 2, sep: 3},
first_id 8), so fine-tuning it from a checkpoint does not start from mismatched specials.

`data_dir` is ignored. Pure python/numpy: no paddle.
"""
import numpy as np

from ernie_doc.data.document import Document
from ernie_doc.errors import DataError

PAD, CLS, SEP = 0, 1, 2    # default special ids
UNK = 3
FIRST_ID = 4               # default: keys 4, 5 (key1) and 6, 7 (key2), filler from 8
MAX_FILLER = 24
VOCAB_SIZE = FIRST_ID + 4 + MAX_FILLER  # 32 with the defaults

SPLITS = ("train", "dev", "test")
_SPLIT_STREAM = {"train": 0, "dev": 1, "test": 2}
DEFAULTS = dict(num_docs=None, seed=0, segment_tokens=6, min_segments=2, max_segments=4,
                filler_vocab=16, last_min_fill=1.0, key_count=4,
                special_ids={"pad": PAD, "cls": CLS, "sep": SEP}, first_id=FIRST_ID)
_DEFAULT_NUM_DOCS = {"train": 10000, "dev": 500, "test": 500}


# the documents are generated, not read: `--format task` needs no data directory
SYNTHETIC = True


def labels(data_dir=None, options=None):
    return ["0", "1"]


def _int(options, name, minimum):
    v = options[name]
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum:
        raise DataError(f"longdep option {name!r} must be an integer >= {minimum}, got {v!r}")
    return int(v)


def _options(options):
    options = dict(options or {})
    for key in options:
        if key not in DEFAULTS:
            raise DataError(f"longdep: unknown option {key!r}; known options: "
                            f"{', '.join(sorted(DEFAULTS))}")
    opts = {**DEFAULTS, **options}
    out = {name: _int(opts, name, m) for name, m in
           (("seed", 0), ("segment_tokens", 2), ("min_segments", 1), ("max_segments", 1),
            ("filler_vocab", 1), ("key_count", 1), ("first_id", 0))}
    if out["max_segments"] < out["min_segments"]:
        raise DataError(f"longdep option 'max_segments' ({out['max_segments']}) must be >= "
                        f"min_segments ({out['min_segments']})")
    if out["filler_vocab"] > MAX_FILLER:
        raise DataError(f"longdep option 'filler_vocab' must be <= {MAX_FILLER}, "
                        f"got {out['filler_vocab']}")
    fill = opts["last_min_fill"]
    if isinstance(fill, bool) or not isinstance(fill, (int, float)) or not 0.0 < fill <= 1.0:
        raise DataError(f"longdep option 'last_min_fill' must be in (0, 1], got {fill!r}")
    out["last_min_fill"] = float(fill)
    c, s = out["key_count"], out["segment_tokens"]
    shortest_last = max(1, int(np.ceil(out["last_min_fill"] * s)))
    if out["min_segments"] == 1 and 2 * c > shortest_last:
        raise DataError(f"longdep option 'key_count' ({c}): a 1-segment document needs 2 x "
                        f"key_count <= {shortest_last} token positions (raise min_segments, "
                        f"last_min_fill or segment_tokens)")
    if c > shortest_last:
        raise DataError(f"longdep option 'key_count' ({c}) must be <= the shortest last window "
                        f"({shortest_last} tokens = ceil(last_min_fill x segment_tokens))")
    special = opts["special_ids"]
    if not isinstance(special, dict) or set(special) != {"pad", "cls", "sep"} or any(
            isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in special.values()):
        raise DataError(f"longdep option 'special_ids' must map pad, cls and sep to ids >= 0, "
                        f"got {special!r}")
    used = range(out["first_id"], out["first_id"] + 4 + MAX_FILLER)
    if len(set(special.values())) != 3 or any(v in used for v in special.values()):
        raise DataError(f"longdep option 'special_ids' {special!r}: the ids must differ and lie "
                        f"outside the keys and filler ({used.start}..{used.stop - 1})")
    out["special_ids"] = dict(special)
    out["num_docs"] = opts["num_docs"]
    return out


def id_vocabulary(options=None):
    """→ ({cls, sep, pad} ids, vocabulary size) of the documents `read` gives (pre-tokenized:
    the trainer builds a model of this vocabulary when it starts from scratch)."""
    opts = _options(options)
    return (dict(opts["special_ids"]),
            max(max(opts["special_ids"].values()) + 1, opts["first_id"] + 4 + MAX_FILLER))


def _num_docs(value, split):
    if value is None:
        return _DEFAULT_NUM_DOCS[split]
    if isinstance(value, dict):
        for key in value:
            if key not in SPLITS:
                raise DataError(f"longdep option 'num_docs': unknown split {key!r}")
        if split not in value:
            return _DEFAULT_NUM_DOCS[split]
        value = value[split]
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise DataError(f"longdep option 'num_docs' must be a positive integer, got {value!r}")
    return int(value)


def make_document(rng, opts):
    """(ids, label, n_segments) of one document drawn from rng."""
    s = opts["segment_tokens"]
    n = int(rng.integers(opts["min_segments"], opts["max_segments"] + 1))
    last_len = int(rng.integers(max(1, int(np.ceil(opts["last_min_fill"] * s))), s + 1))
    length = (n - 1) * s + last_len
    first = opts["first_id"]
    ids = (first + 4 + rng.integers(0, opts["filler_vocab"], size=length)).tolist()
    k1 = int(rng.integers(0, 2))
    k2 = int(rng.integers(0, 2))
    c = opts["key_count"]
    if n > 1:
        p1 = rng.choice(s, size=c, replace=False)
        p2 = (n - 1) * s + rng.choice(last_len, size=c, replace=False)
    else:  # both keys in the one segment, at distinct positions
        both = rng.choice(last_len, size=2 * c, replace=False)
        p1, p2 = both[:c], both[c:]
    for p in p1:
        ids[int(p)] = first + k1           # key1: first_id or first_id + 1
    for p in p2:
        ids[int(p)] = first + 2 + k2       # key2: first_id + 2 or first_id + 3
    label = "1" if (k1 == 0) != (k2 == 0) else "0"
    return ids, label, n


def read(data_dir, split, options=None):
    """The documents of `split` ("train", "dev" or "test"); deterministic from options."""
    if split not in SPLITS:
        raise DataError(f"longdep: unknown split {split!r}; splits: {', '.join(SPLITS)}")
    opts = _options(options)
    count = _num_docs(opts["num_docs"], split)
    rng = np.random.default_rng([opts["seed"], _SPLIT_STREAM[split], 7919])
    docs = []
    for i in range(count):
        ids, label, n = make_document(rng, opts)
        docs.append(Document(doc_id=f"{split}-{i}", ids=ids, label=label,
                             fields={"num_segments": n}))
    return docs
