#!/usr/bin/python3
"""Records the parity cases of the test suite with the parity kit (python/attention_parity):
models/parity/<case>/. tests/test_parity.cpp checks the C++ modules against them.

    scripts/make_parity_cases.py            # rewrite models/parity/
    scripts/make_parity_cases.py --out DIR  # write elsewhere
"""

import argparse
import os
import sys

import torch
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.join(ROOT, "python"))
import attention_parity  # noqa: E402
import reference  # noqa: E402


class Block(nn.Module):
    """A pre-norm attention block as a downstream project writes one: LayerNorm, then the
    book's MultiHeadAttention, with a residual connection."""

    def __init__(self, d, heads, context_length):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.att = reference.MultiHeadAttention(d, d, context_length, 0.0, heads)

    def forward(self, x):
        return x + self.att(self.norm(x))


class Holder(nn.Module):
    """A model that holds the attention under `att`, for loading with a prefix."""

    def __init__(self, att):
        super().__init__()
        self.att = att

    def forward(self, x):
        return self.att(x)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(ROOT, "models", "parity"))
    out = parser.parse_args().out

    torch.manual_seed(7)
    block = Block(16, 4, 7).double()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    attention_parity.record(block, {"x": x}, os.path.join(out, "block_float64"), seed=7)

    torch.manual_seed(11)
    gqa = Holder(reference.MultiHeadAttention(16, 16, 5, 0.0, 4, qkv_bias=True, num_kv_heads=2))
    x = torch.randn(3, 5, 16)
    attention_parity.record(gqa, {"x": x}, os.path.join(out, "gqa_float32"), seed=11)


if __name__ == "__main__":
    main()
