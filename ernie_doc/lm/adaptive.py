"""Adaptive input embedding and projected adaptive log-softmax (Transformer-XL's WT103 setup).

Frequency-sorted ids are cut into clusters; cluster i gets dimension d_i = d_embed // div_val**i
and a projection to d_model. Embedding and softmax share one orientation (weights[i] [n_i, d_i],
projs[i] [d_i, d_model]), so tying shares Parameter objects. Details: docs/design-notes.md,
"Language model: adaptive input and softmax"."""
import operator
from typing import List, Sequence, Tuple, Union

import paddle
import paddle.nn as nn
import paddle.nn.functional as F

from ernie_doc.errors import ConfigError, ModelInputError

__all__ = ["AdaptiveEmbedding", "ProjectedAdaptiveLogSoftmax", "cluster_layout"]


def _positive_int(value, name):
    try:
        value = operator.index(value)
    except TypeError:
        raise ConfigError(f"{name} must be an integer, got {value!r}") from None
    if value < 1:
        raise ConfigError(f"{name} must be >= 1, got {value}")
    return value


def cluster_layout(vocab_size: int, d_embed: int, d_model: int, cutoffs: Sequence[int],
                   div_val: int) -> Tuple[int, int, int, List[int], int, List[int], List[int]]:
    """Validate the shared arguments → (vocab_size, d_embed, d_model, cutoffs, div_val,
    cutoff_ends = [0, *cutoffs, V], dims[i] = d_embed // div_val**i); ValueError otherwise."""
    vocab_size = _positive_int(vocab_size, "vocab_size")
    d_embed = _positive_int(d_embed, "d_embed")
    d_model = _positive_int(d_model, "d_model")
    div_val = _positive_int(div_val, "div_val")
    try:
        cutoffs = [operator.index(c) for c in cutoffs]
    except TypeError:
        raise ConfigError(f"cutoffs must be a sequence of integers, got {cutoffs!r}") from None
    for c in cutoffs:
        # vocab_size itself is implicit (the end of the last cluster): a cutoff equal to it
        # would make an empty cluster, and an empty softmax is undefined.
        if not 0 < c < vocab_size:
            raise ConfigError(f"cutoffs must lie strictly between 0 and vocab_size={vocab_size}, "
                              f"got {cutoffs}")
    if any(b <= a for a, b in zip(cutoffs, cutoffs[1:])):
        raise ConfigError(f"cutoffs must be strictly increasing, got {cutoffs}")
    if div_val > 1 and cutoffs and d_embed % div_val ** len(cutoffs):
        # Transformer-XL floors d_embed / div_val**i; demanding exact division keeps every
        # cluster dimension what the config says, and never zero.
        raise ConfigError(f"d_embed={d_embed} must be divisible by div_val**len(cutoffs)="
                          f"{div_val ** len(cutoffs)} when div_val > 1")
    cutoff_ends = [0] + cutoffs + [vocab_size]
    dims = [d_embed // div_val ** i for i in range(len(cutoffs) + 1)]
    return vocab_size, d_embed, d_model, cutoffs, div_val, cutoff_ends, dims


def _normal(std):
    return paddle.ParamAttr(initializer=nn.initializer.Normal(mean=0.0, std=std))


def _zeros():
    return paddle.ParamAttr(initializer=nn.initializer.Constant(0.0))


def _share(plist, i, param):
    """Make entry i of `plist` the very object `param`: paddle 3.x's
    ParameterList.__setitem__ copies values (silently untied); setattr works on 2.6 and 3.x."""
    setattr(plist, str(i), param)
    if plist[i] is not param:
        raise RuntimeError("paddle did not share the parameter (ParameterList semantics changed)")


def log_softmax(x: paddle.Tensor) -> paddle.Tensor:
    """log_softmax over the last axis as x − logsumexp(x): paddle's CPU log_softmax kernel is
    quadratic in the axis size."""
    return x - paddle.logsumexp(x, axis=-1, keepdim=True)


class _Adaptive(nn.Layer):
    """The cluster geometry common to both layers."""

    def __init__(self, vocab_size, d_embed, d_model, cutoffs, div_val):
        super().__init__()
        (self.vocab_size, self.d_embed, self.d_model, self.cutoffs, self.div_val,
         self.cutoff_ends, self.dims) = cluster_layout(vocab_size, d_embed, d_model, cutoffs,
                                                       div_val)

    @property
    def n_clusters(self) -> int:
        """Head (shortlist) + tail clusters."""
        return len(self.cutoffs) + 1

    def table_shapes(self) -> List[List[int]]:
        """Shapes of the word tables: one [V, d_embed] if div_val == 1, else [n_i, d_i] per
        cluster (the embedding's and the softmax's are the same, so they can be tied)."""
        if self.div_val == 1:
            return [[self.vocab_size, self.d_embed]]
        ends = self.cutoff_ends
        return [[ends[i + 1] - ends[i], self.dims[i]] for i in range(self.n_clusters)]

    def _cluster_weight(self, weights, i):
        """The [n_i, d_i] table of cluster i (a row slice of the single table if div_val == 1)."""
        if self.div_val == 1:
            return weights[0][self.cutoff_ends[i]:self.cutoff_ends[i + 1]]
        return weights[i]

    def extra_repr(self) -> str:
        return (f"vocab_size={self.vocab_size}, d_embed={self.d_embed}, d_model={self.d_model}, "
                f"cutoffs={self.cutoffs}, div_val={self.div_val}")


class AdaptiveEmbedding(_Adaptive):
    """Adaptive input (Baevski & Auli): ids [...] int64 → [..., d_model] × sqrt(d_model);
    cluster i: a [n_i, d_embed // div_val**i] table projected to d_model."""

    def __init__(self, vocab_size: int, d_embed: int, d_model: int, cutoffs: Sequence[int],
                 div_val: int = 1, init_std: float = 0.02, proj_init_std: float = 0.01):
        super().__init__(vocab_size, d_embed, d_model, cutoffs, div_val)
        self.emb_scale = self.d_model ** 0.5
        shapes = self.table_shapes()
        self.emb_weights = nn.ParameterList([
            self.create_parameter(s, attr=_normal(init_std)) for s in shapes])
        # div_val > 1: every cluster is projected, even cluster 0 whose dim may equal d_model
        # (Transformer-XL does so, and tie_projs refers to these per-cluster projections).
        n_projs = len(shapes) if (self.div_val > 1 or self.d_embed != self.d_model) else 0
        self.emb_projs = nn.ParameterList([
            self.create_parameter([self.dims[i], self.d_model], attr=_normal(proj_init_std))
            for i in range(n_projs)])

    def forward(self, ids: paddle.Tensor) -> paddle.Tensor:
        if self.div_val == 1:
            # One table: the clusters only matter to the softmax.
            out = F.embedding(ids, self.emb_weights[0])
            if len(self.emb_projs):
                out = paddle.matmul(out, self.emb_projs[0])
            return out * self.emb_scale

        flat = ids.reshape([-1])
        pieces, positions = [], []
        for i in range(self.n_clusters):
            lo, hi = self.cutoff_ends[i], self.cutoff_ends[i + 1]
            rows = paddle.nonzero((flat >= lo) & (flat < hi)).reshape([-1])
            if rows.shape[0] == 0:
                continue  # an empty gather/matmul is legal but pointless (and fragile on 2.6)
            local = paddle.gather(flat, rows) - lo
            pieces.append(paddle.matmul(F.embedding(local, self.emb_weights[i]),
                                        self.emb_projs[i]))
            positions.append(rows)
        # Pieces come out grouped by cluster: restore token order with the inverse permutation
        # (a gather). An id outside [0, V) makes the reshape below fail loudly.
        order = paddle.concat(positions) if len(positions) > 1 else positions[0]
        out = paddle.concat(pieces) if len(pieces) > 1 else pieces[0]
        out = paddle.gather(out, paddle.argsort(order))
        return out.reshape(list(ids.shape) + [self.d_model]) * self.emb_scale


class ProjectedAdaptiveLogSoftmax(_Adaptive):
    """Transformer-XL's adaptive softmax: log_prob(hidden [..., d_model]) → [..., V];
    forward(hidden, target [...] int64) → nll [...]. Tie with `tie_to`."""

    def __init__(self, vocab_size: int, d_embed: int, d_model: int, cutoffs: Sequence[int],
                 div_val: int = 1, init_std: float = 0.02, proj_init_std: float = 0.01):
        super().__init__(vocab_size, d_embed, d_model, cutoffs, div_val)
        self.shortlist_size = self.cutoff_ends[1]
        self.n_tail = len(self.cutoffs)
        self.head_size = self.shortlist_size + self.n_tail
        shapes = self.table_shapes()
        self.out_weights = nn.ParameterList([
            self.create_parameter(s, attr=_normal(init_std)) for s in shapes])
        self.out_biases = nn.ParameterList([
            self.create_parameter([s[0]], attr=_zeros(), is_bias=True) for s in shapes])
        # One projection per cluster even when div_val == 1 (all [d_embed, d_model] then):
        # tie_projs is per cluster, and WT103 ties all but the head's (tie_projs[0] False).
        n_projs = self.n_clusters if (self.div_val > 1 or self.d_embed != self.d_model) else 0
        self.out_projs = nn.ParameterList([
            self.create_parameter([self.dims[i], self.d_model], attr=_normal(proj_init_std))
            for i in range(n_projs)])
        if self.n_tail:
            # The head works in cluster 0's space (dims[0] == d_embed).
            self.cluster_weight = self.create_parameter([self.n_tail, self.d_embed],
                                                        attr=_normal(init_std))
            self.cluster_bias = self.create_parameter([self.n_tail], attr=_zeros(),
                                                      is_bias=True)

    # ---------------------------------------------------------------------------- tying
    def tie_to(self, embedding: AdaptiveEmbedding, tie_weight: bool = True,
               tie_projs: Union[None, bool, Sequence[bool]] = None
               ) -> "ProjectedAdaptiveLogSoftmax":
        """Share parameters with `embedding` (an AdaptiveEmbedding of the same geometry) →
        self. tie_weight: output tables; tie_projs: None, one bool, or one per cluster.
        Replaced parameters are dropped, so each shared tensor is in parameters() once."""
        if not isinstance(embedding, AdaptiveEmbedding):
            raise TypeError(f"embedding must be an AdaptiveEmbedding, got {type(embedding)}")
        mine = (self.vocab_size, self.d_embed, self.d_model, self.cutoffs, self.div_val)
        theirs = (embedding.vocab_size, embedding.d_embed, embedding.d_model, embedding.cutoffs,
                  embedding.div_val)
        if mine != theirs:
            raise ValueError("embedding must have the same (vocab_size, d_embed, d_model, "
                             f"cutoffs, div_val): {theirs} != {mine}")
        if tie_projs is None:
            tie_projs = [False] * self.n_clusters
        elif isinstance(tie_projs, bool):
            tie_projs = [tie_projs] * self.n_clusters
        tie_projs = list(tie_projs)
        if len(tie_projs) != self.n_clusters or not all(isinstance(t, bool) for t in tie_projs):
            raise ConfigError(f"tie_projs must be {self.n_clusters} booleans (one per cluster), "
                              f"got {tie_projs}")
        if tie_weight:
            for i in range(len(self.out_weights)):
                _share(self.out_weights, i, embedding.emb_weights[i])
        if len(self.out_projs):
            for i, tie in enumerate(tie_projs):
                if tie:
                    _share(self.out_projs, i, embedding.emb_projs[0 if self.div_val == 1 else i])
        return self

    # ------------------------------------------------------------------------- compute
    def _logits(self, hidden, i):
        """Logits of cluster i's own words for hidden [N, d_model] → [N, n_i] (no head extras)."""
        weight = self._cluster_weight(self.out_weights, i)
        bias = self._cluster_weight(self.out_biases, i)
        if i == 0 and self.n_tail:
            weight = paddle.concat([weight, self.cluster_weight])
            bias = paddle.concat([bias, self.cluster_bias])
        if len(self.out_projs):
            # h @ P^T brings d_model down to the cluster's d_i (the transpose of the embedding's).
            hidden = paddle.matmul(hidden, self.out_projs[i], transpose_y=True)
        return paddle.matmul(hidden, weight, transpose_y=True) + bias

    def _flatten(self, hidden):
        if hidden.shape[-1] != self.d_model:
            raise ModelInputError(f"hidden must end with d_model={self.d_model}, got "
                                  f"{hidden.shape}")
        return hidden.reshape([-1, self.d_model])

    def log_prob(self, hidden: paddle.Tensor) -> paddle.Tensor:
        """hidden [..., d_model] → log-probabilities [..., V] (each row sums to 1 in prob)."""
        lead = list(hidden.shape[:-1])
        flat = self._flatten(hidden)
        head = log_softmax(self._logits(flat, 0))      # [N, c1 + n_tail]
        parts = [head[:, :self.shortlist_size]]
        for i in range(1, self.n_clusters):
            col = self.head_size - i
            parts.append(head[:, col:col + 1] + log_softmax(self._logits(flat, i)))
        out = paddle.concat(parts, axis=-1) if len(parts) > 1 else parts[0]
        return out.reshape(lead + [self.vocab_size])

    def forward(self, hidden: paddle.Tensor, target: paddle.Tensor) -> paddle.Tensor:
        """hidden [..., d_model], target [...] → nll [...] = -log p(target | hidden), in order."""
        lead = list(hidden.shape[:-1])
        if list(target.shape) != lead:
            raise ModelInputError(f"target must have shape {lead} (hidden without its last axis), "
                                  f"got {list(target.shape)}")
        flat = self._flatten(hidden)
        tgt = target.reshape([-1]).astype("int64")
        head = log_softmax(self._logits(flat, 0))
        # The head column each row needs: the word itself in the shortlist, else its cluster's
        # logit (column head_size - i for tail cluster i).
        cluster = paddle.zeros_like(tgt)
        for c in self.cutoffs:
            cluster = cluster + (tgt >= c).astype("int64")
        head_col = paddle.where(cluster == 0, tgt, self.head_size - cluster)
        nll = -paddle.take_along_axis(head, head_col.unsqueeze(-1), axis=-1).squeeze(-1)
        rows_all, tail_all = [], []
        for i in range(1, self.n_clusters):
            rows = paddle.nonzero(cluster == i).reshape([-1])
            if rows.shape[0] == 0:
                continue  # no target in this cluster: its softmax is never computed
            local = (paddle.gather(tgt, rows) - self.cutoff_ends[i]).unsqueeze(-1)
            tail = log_softmax(self._logits(paddle.gather(flat, rows), i))
            rows_all.append(rows)
            tail_all.append(-paddle.take_along_axis(tail, local, axis=-1).squeeze(-1))
        if rows_all:
            # Rows are distinct across clusters: a scatter into zeros keeps token order
            # (Transformer-XL returns the nll grouped by cluster).
            rows = paddle.concat(rows_all) if len(rows_all) > 1 else rows_all[0]
            vals = paddle.concat(tail_all) if len(tail_all) > 1 else tail_all[0]
            nll = nll + paddle.scatter(paddle.zeros_like(nll), rows, vals, overwrite=True)
        return nll.reshape(lead)
