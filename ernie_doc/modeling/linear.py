"""The model's dense layer: `paddle.nn.Linear` with the same parameters, state_dict names and
outputs, and a training path shaped for the CPU's faster backward kernels.

With gradients, inputs are multiplied as one 2-D matrix and the bias added through an expand
(much faster CPU gradients); evaluation and export keep the plain form. Why and timings:
docs/design-notes.md, "Model: the dense layer"."""
import math

import paddle
import paddle.nn as nn
import paddle.nn.functional as F

SMALL = 1 << 16   # output elements below which the plain form is faster


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
            out = out + self.bias.expand(out.shape)
        return out.reshape(lead + [self.weight.shape[1]]) if len(lead) != 1 else out
