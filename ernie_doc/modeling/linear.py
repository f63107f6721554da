"""The model's dense layer: `paddle.nn.Linear` with the same parameters, state_dict names and
outputs, and a training path shaped for the CPU's faster backward kernels; `add_broadcast`, the
broadcast add whose gradient is one product with a row of ones.

With gradients, inputs are multiplied as one 2-D matrix and the bias added through
`add_broadcast` (much faster CPU gradients); evaluation and export keep the plain form. Why and
timings: docs/design-notes.md, "Model: the dense layer"."""
import math
from typing import List, Tuple

import paddle
import paddle.nn as nn
import paddle.nn.functional as F
from paddle.autograd import PyLayer

SMALL = 1 << 16   # output elements below which the plain form is faster


class _BroadcastAdd(PyLayer):
    """x [A, T, R] (as a view) + y [A, 1, R] → [A, T, R]; y's gradient is ones [1, T] times
    the output's gradient, batched over A."""

    @staticmethod
    def forward(ctx, x, y, split):
        ctx.split, ctx.y_shape = split, y.shape
        return x + y

    @staticmethod
    def backward(ctx, grad):
        a, t, r = ctx.split
        ones = paddle.ones([1, t], dtype=grad.dtype)
        dy = paddle.matmul(ones, grad.reshape([t, r]) if a == 1 else grad.reshape([a, t, r]))
        return grad, dy.reshape(ctx.y_shape)


def _split(x_shape: List[int], y_shape: List[int]) -> Tuple[int, int, int]:
    """(A, T, R) with x = [A, T, R] and y = [A, 1, R] when y broadcasts over one run of x's
    axes (leading axes missing count as broadcast), else (0, 0, 0)."""
    if len(y_shape) > len(x_shape):   # y would add axes: not a broadcast onto x
        return 0, 0, 0
    y_shape = [1] * (len(x_shape) - len(y_shape)) + list(y_shape)
    bcast = [i for i, (a, b) in enumerate(zip(x_shape, y_shape)) if a != b]
    if not bcast or any(y_shape[i] != 1 for i in bcast) or bcast[-1] - bcast[0] + 1 != len(bcast):
        return 0, 0, 0
    first, last = bcast[0], bcast[-1] + 1
    return (math.prod(x_shape[:first]), math.prod(x_shape[first:last]),
            math.prod(x_shape[last:]))


def _fast_gradient(x: paddle.Tensor, y: paddle.Tensor) -> bool:
    """Whether x + y records both gradients in dygraph, both fp32 (_BroadcastAdd's case: a
    PyLayer must not return a gradient for an input that takes none)."""
    return paddle.in_dynamic_mode() and paddle.is_grad_enabled() and not y.stop_gradient \
        and not x.stop_gradient and x.dtype == paddle.float32 and y.dtype == paddle.float32


def add_broadcast(x: paddle.Tensor, y: paddle.Tensor) -> paddle.Tensor:
    """x + y, y broadcast over one run of x's axes (a bias [H] over [..., H], a per-key bias
    [B, n, 1, K] over [B, n, T, K]). In dygraph with y's gradient (fp32), that gradient is a
    matmul with ones: paddle's CPU sum over broadcast axes is many times slower."""
    split = _split(list(x.shape), list(y.shape)) if _fast_gradient(x, y) else (0, 0, 0)
    if not split[1]:
        return x + y
    return _BroadcastAdd.apply(x, y, split)


class Linear(nn.Linear):
    """x [..., in_features] → [..., out_features]; weight [in, out], bias [out] or None."""

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        lead = list(x.shape[:-1])
        if not self.training or (paddle.in_dynamic_mode() and not paddle.is_grad_enabled()) \
                or math.prod(lead) * self.weight.shape[1] < SMALL:
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape([-1, x.shape[-1]]) if len(lead) != 1 else x
        out = paddle.matmul(flat, self.weight)
        if self.bias is not None:
            out = add_broadcast(out, self.bias) if _fast_gradient(out, self.bias) \
                else out + self.bias.expand(out.shape)
        return out.reshape(lead + [self.weight.shape[1]]) if len(lead) != 1 else out
