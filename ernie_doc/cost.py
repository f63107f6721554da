"""What one forward of a model costs in matrix-multiply FLOPs (2 per multiply-add), counted
from its config, product by product as the code runs them (tests/test_cost.py checks it): the
ERNIE-Doc encoder and the Transformer-XL language model. Elementwise work, softmax and layer
norm are left out. `ernie-doc plan` turns these counts into GPU-hours (ernie_doc/plan.py)."""
from typing import Any

from ernie_doc.config import QUERY_BLOCK


def forward_matmul_flops(config: Any, batch: int, seq_len: int) -> float:
    """The matmul work one forward of ErnieDocModel over a [batch, seq_len] segment needs
    (memory: config.memory_len, none when recurrence is "none"), in FLOPs: per layer and row,
    the q and output projections over T tokens, k and v over the K = M + T keys, the
    feed-forward, the content scores and the weighted sum (T x K each) and the position
    scores, which each query block of s rows takes against K + s − 1 position rows
    (config.QUERY_BLOCK); and per layer once, the projection of the 2T + M position rows.
    The pooler and heads are left out (plan.head_flops counts heads that read every token)."""
    t, h = seq_len, config.hidden_size
    m = 0 if config.recurrence == "none" else config.memory_len
    k, inner = m + t, config.intermediate_size
    blocks = [min(QUERY_BLOCK, t - start) for start in range(0, t, QUERY_BLOCK)]
    per_row = (2 * t * h * h * 2            # q and output projections
               + 2 * k * h * h * 2          # k and v
               + 2 * t * h * inner * 2      # feed-forward
               + 2 * t * k * h * 2          # content scores and the weighted sum of values
               + sum(2 * s * (k + s - 1) * h for s in blocks))   # position scores
    positions = 2 * (2 * t + m) * h * h
    return float(config.num_hidden_layers * (batch * per_row + positions))


def lm_forward_matmul_flops(config: Any, batch: int, seq_len: int) -> float:
    """The matmul work one forward of TransformerXLLM over [batch, seq_len] tokens that all
    predict a target needs, memory full (config.mem_len unless recurrence "none"), in FLOPs.
    Per layer: q, k, v over the K = M + T rows (Transformer-XL projects the memory's queries
    too), the content and position scores and the weighted sum (T x K' each, K' the position
    rows: K, or Segatron's three tables of min(K, clamp_len + 1) rows), the projection of the
    position rows, the output projection and the feed-forward. Adaptive input and softmax:
    the input projection and the head cluster (shortlist + one logit per tail cluster) for
    every token; the tail clusters' own softmax, computed only for the rarer words that fall
    in them (how many is the data's), is left out."""
    c, t = config, seq_len
    m = c.mem_len if c.recurrence != "none" else 0
    k, d, inner = m + t, c.d_model, c.n_head * c.d_head
    if c.segment_positions and c.sega_relative == "exact":
        size = k if c.clamp_len <= 0 else min(k, c.clamp_len + 1)
        position = 2 * size * d * inner + 3 * 2 * batch * t * size * inner
    elif c.segment_positions:   # "segatron": one row per key and batch row
        position = 2 * batch * k * d * inner + 2 * batch * t * k * inner
    else:   # one shared table of the K distances
        position = 2 * k * d * inner + 2 * batch * t * k * inner
    layer = (2 * batch * k * d * 3 * inner      # q, k, v
             + 2 * batch * t * k * inner * 2    # content scores, weighted sum
             + position
             + 2 * batch * t * inner * d        # output projection
             + 2 * batch * t * d * c.d_inner * 2)   # feed-forward
    embed = c.embed_dim
    shortlist = (c.cutoffs[0] if c.cutoffs else c.vocab_size) + len(c.cutoffs)
    projected = c.div_val > 1 or embed != d
    per_token = 2 * embed * shortlist + (2 * 2 * embed * d if projected else 0)
    return float(c.n_layer * layer + batch * t * per_token)
