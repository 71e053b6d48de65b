"""The Python reference modules: the article's code, batched, with the C++ modules' names.

Each class keeps the article's parameter names and initialization order (torch.rand for W_query,
W_key, W_value in that order), so that `torch.manual_seed(s)` gives the same weights here and in
C++. Every class is scriptable with torch.jit.script.
"""

import torch
import torch.nn as nn


class SelfAttention(nn.Module):
    def __init__(self, d_in: int, d_out_kq: int, d_out_v: int):
        super().__init__()
        self.d_out_kq = d_out_kq
        self.W_query = nn.Parameter(torch.rand(d_in, d_out_kq))
        self.W_key = nn.Parameter(torch.rand(d_in, d_out_kq))
        self.W_value = nn.Parameter(torch.rand(d_in, d_out_v))

    def forward(self, x):
        keys = x @ self.W_key
        queries = x @ self.W_query
        values = x @ self.W_value

        attn_scores = queries @ keys.transpose(-2, -1)
        attn_weights = torch.softmax(attn_scores / self.d_out_kq**0.5, dim=-1)
        return attn_weights @ values


class MultiHeadAttentionWrapper(nn.Module):
    def __init__(self, d_in: int, d_out_kq: int, d_out_v: int, num_heads: int):
        super().__init__()
        self.heads = nn.ModuleList(
            [SelfAttention(d_in, d_out_kq, d_out_v) for _ in range(num_heads)]
        )

    def forward(self, x):
        return torch.cat([head(x) for head in self.heads], dim=-1)


class CausalSelfAttention(nn.Module):
    """SelfAttention with the article's efficient causal masking: -inf above the diagonal."""

    def __init__(self, d_in: int, d_out_kq: int, d_out_v: int, dropout: float = 0.0):
        super().__init__()
        self.d_out_kq = d_out_kq
        self.W_query = nn.Parameter(torch.rand(d_in, d_out_kq))
        self.W_key = nn.Parameter(torch.rand(d_in, d_out_kq))
        self.W_value = nn.Parameter(torch.rand(d_in, d_out_v))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        keys = x @ self.W_key
        queries = x @ self.W_query
        values = x @ self.W_value

        attn_scores = queries @ keys.transpose(-2, -1)
        block_size = attn_scores.shape[-1]
        mask = torch.triu(
            torch.ones(block_size, block_size, dtype=torch.bool, device=x.device), diagonal=1
        )
        masked = attn_scores.masked_fill(mask, -torch.inf)
        attn_weights = torch.softmax(masked / self.d_out_kq**0.5, dim=-1)
        attn_weights = self.dropout(attn_weights)
        return attn_weights @ values


class CrossAttention(nn.Module):
    """Queries from x_1, keys and values from x_2 (of width d_in_kv, default d_in)."""

    def __init__(self, d_in: int, d_out_kq: int, d_out_v: int, d_in_kv: int = -1):
        super().__init__()
        if d_in_kv < 0:
            d_in_kv = d_in
        self.d_out_kq = d_out_kq
        self.W_query = nn.Parameter(torch.rand(d_in, d_out_kq))
        self.W_key = nn.Parameter(torch.rand(d_in_kv, d_out_kq))
        self.W_value = nn.Parameter(torch.rand(d_in_kv, d_out_v))

    def forward(self, x_1, x_2):
        queries_1 = x_1 @ self.W_query
        keys_2 = x_2 @ self.W_key
        values_2 = x_2 @ self.W_value

        attn_scores = queries_1 @ keys_2.transpose(-2, -1)
        attn_weights = torch.softmax(attn_scores / self.d_out_kq**0.5, dim=-1)
        return attn_weights @ values_2


MODULES = {
    "SelfAttention": SelfAttention,
    "MultiHeadAttentionWrapper": MultiHeadAttentionWrapper,
    "CausalSelfAttention": CausalSelfAttention,
    "CrossAttention": CrossAttention,
}


def build(module: str, args: dict, seed: int, dtype: torch.dtype) -> nn.Module:
    """The module as a golden case makes it: seeded right before construction, then cast."""
    torch.manual_seed(seed)
    return MODULES[module](**args).to(dtype)
