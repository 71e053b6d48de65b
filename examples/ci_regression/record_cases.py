#!/usr/bin/env python3
"""The project's model in Python (as it was trained) and the parity cases its C++ port must meet.

    PYTHONPATH=<attention's share/attention/python> python3 record_cases.py OUT_DIR
"""

import os
import sys

import torch
from torch import nn

import attention_parity


class MultiHeadAttention(nn.Module):
    """Causal multi-head attention with the parameter names of attention::MultiHeadAttention."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads, self.head_dim = heads, d // heads
        self.W_query = nn.Linear(d, d, bias=False)
        self.W_key = nn.Linear(d, d, bias=False)
        self.W_value = nn.Linear(d, d, bias=False)
        self.out_proj = nn.Linear(d, d)

    def forward(self, x, key_padding_mask=None):
        b, t, d = x.shape
        split = lambda y: y.view(b, t, self.heads, self.head_dim).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.W_query(x)), split(self.W_key(x)), split(self.W_value(x))
        scores = q @ k.transpose(2, 3) / self.head_dim ** 0.5
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        if key_padding_mask is not None:
            scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
        context = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, t, d)
        return self.out_proj(context)


class Block(nn.Module):
    """The project's block: pre-norm attention with a residual connection."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.att = MultiHeadAttention(d, heads)

    def forward(self, x, key_padding_mask=None):
        return x + self.att(self.norm(x), key_padding_mask)


def main():
    out = sys.argv[1]
    # float64: the check's tolerance (1e-10) then sees a change of one float32 ulp in a weight.
    torch.manual_seed(2024)
    block = Block().double()
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    attention_parity.record(block, {"x": x}, os.path.join(out, "block_causal"), seed=2024)

    padding = torch.zeros(2, 9, dtype=torch.bool)
    padding[1, 6:] = True  # the second sequence is 6 tokens long
    attention_parity.record(block, {"x": x, "key_padding_mask": padding},
                            os.path.join(out, "block_padded"), seed=2024)

    # The deliberate regression: the same case, then one weight moved by one float32 ulp.
    nudged = os.path.join(out, "block_nudged")
    attention_parity.record(block, {"x": x}, nudged, seed=2024)
    weights = attention_parity.safetensors_io.load(os.path.join(nudged, "weights.safetensors"))
    weights["att.W_value.weight"] *= 1 + 2.0 ** -23
    attention_parity.safetensors_io.save(weights, os.path.join(nudged, "weights.safetensors"))


if __name__ == "__main__":
    main()
