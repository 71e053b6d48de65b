"""The Python reference modules: the article's code, batched, with the C++ modules' names.

Each class keeps the article's parameter names and initialization order (torch.rand for W_query,
W_key, W_value in that order), so that `torch.manual_seed(s)` gives the same weights here and in
C++. Every class is scriptable with torch.jit.script.
"""

from typing import Optional

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


class MultiHeadAttention(nn.Module):
    """The book's MultiHeadAttention (chapter 3), with the options the C++ module adds:
    qkv_bias, grouped-query attention (num_kv_heads), causal on or off, cross-attention (d_in_kv,
    context) and a key padding mask (True = padding, masked out).

    Keys and values of a shared head are repeated for each query head of its group, the usual
    grouped-query formulation (the C++ kernel folds the group instead of copying)."""

    def __init__(self, d_in: int, d_out: int, context_length: int, dropout: float, num_heads: int,
                 qkv_bias: bool = False, num_kv_heads: int = -1, causal: bool = True,
                 d_in_kv: int = -1):
        super().__init__()
        assert d_out % num_heads == 0, "d_out must be divisible by num_heads"
        if num_kv_heads < 0:
            num_kv_heads = num_heads
        if d_in_kv < 0:
            d_in_kv = d_in
        self.d_out = d_out
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = d_out // num_heads
        self.causal = causal
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in_kv, num_kv_heads * self.head_dim, bias=qkv_bias)
        self.W_value = nn.Linear(d_in_kv, num_kv_heads * self.head_dim, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer(
            "mask", torch.triu(torch.ones(context_length, context_length), diagonal=1)
        )

    def attention_weights(self, x, context: Optional[torch.Tensor] = None,
                          key_padding_mask: Optional[torch.Tensor] = None,
                          attn_mask: Optional[torch.Tensor] = None):
        """Per-head attention weights (b, num_heads, num_tokens, num_keys) and the values."""
        source = x if context is None else context
        b, num_tokens, _ = x.shape
        num_keys = source.shape[1]

        queries = self.W_query(x).view(b, num_tokens, self.num_heads, self.head_dim)
        keys = self.W_key(source).view(b, num_keys, self.num_kv_heads, self.head_dim)
        values = self.W_value(source).view(b, num_keys, self.num_kv_heads, self.head_dim)
        queries = queries.transpose(1, 2)
        keys = keys.transpose(1, 2).repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)
        values = values.transpose(1, 2).repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)

        attn_scores = queries @ keys.transpose(2, 3)
        if self.causal:
            mask_bool = self.mask.to(torch.bool)[:num_tokens, :num_keys]
            attn_scores.masked_fill_(mask_bool, float("-inf"))
        if key_padding_mask is not None:
            attn_scores.masked_fill_(key_padding_mask[:, None, None, :], float("-inf"))
        if attn_mask is not None:
            attn_scores.masked_fill_(attn_mask, float("-inf"))
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        attn_weights = self.dropout(attn_weights)
        return attn_weights, values

    def forward(self, x, context: Optional[torch.Tensor] = None,
                key_padding_mask: Optional[torch.Tensor] = None,
                attn_mask: Optional[torch.Tensor] = None):
        b, num_tokens, _ = x.shape
        attn_weights, values = self.attention_weights(x, context, key_padding_mask, attn_mask)
        context_vec = (attn_weights @ values).transpose(1, 2)
        context_vec = context_vec.contiguous().view(b, num_tokens, self.d_out)
        return self.out_proj(context_vec)


MODULES = {
    "SelfAttention": SelfAttention,
    "MultiHeadAttentionWrapper": MultiHeadAttentionWrapper,
    "CausalSelfAttention": CausalSelfAttention,
    "CrossAttention": CrossAttention,
    "MultiHeadAttention": MultiHeadAttention,
}


def build(module: str, args: dict, seed: int, dtype: torch.dtype) -> nn.Module:
    """The module as a golden case makes it: seeded right before construction, then cast."""
    torch.manual_seed(seed)
    return MODULES[module](**args).to(dtype)
