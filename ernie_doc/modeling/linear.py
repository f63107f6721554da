"""The model's dense layer: `paddle.nn.Linear` with the same parameters, state_dict names and
outputs, and a training path shaped for the CPU's faster backward kernels.

When gradients are recorded, an input [..., in] is multiplied as one 2-D matrix [N, in] and
the bias is added at the output's full shape (an expand), not broadcast:
- the oneDNN bfloat16 matmul gradient (the CPU kernel of `amp: bf16`, see precision.py)
  takes a slow path for a 3-D input against a 2-D weight: 42 against 230 GFLOP/s for the
  base-en [2, 512, 768] × [768, 768] product on this project's CPU, and 7.4 s of a 13.6 s
  bf16 training step;
- the CPU gradient of a broadcast add walks the elements one by one: 1.4 s of a 9.4 s fp32
  compiled base-en step. Through an expand, the add's gradient is a plain copy and the
  bias's gradient one reduce_sum: 0.9 s.

Below SMALL output elements the two extra operators cost more than they save (6 % of the
README demo's compiled step), so small layers keep the plain form.

The arithmetic is the same products and sums in the same order, so outputs equal the plain
layer's. Evaluation and exported programs keep the plain form, which Paddle Inference fuses
into one fc operator.
"""
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
