"""The Python reference modules: the article's code, batched, with the C++ modules' names.

Each class keeps the article's parameter names and initialization order (torch.rand for W_query,
W_key, W_value in that order), so that `torch.manual_seed(s)` gives the same weights here and in
C++. Every class is scriptable with torch.jit.script, except ZooAttention (book_zoo.py's own
classes, the chapter-5 zoo's attention layers), which make_golden.py traces.
"""

import math
import os
import sys
import types
from typing import List, Optional, Tuple

import torch
import torch.nn as nn


def t5_relative_bucket(relative_position: torch.Tensor, num_buckets: int, max_distance: int,
                       bidirectional: bool) -> torch.Tensor:
    """T5's relative position bucket of each key - query position (Raffel et al.; the function
    `_relative_position_bucket` of T5's and Hugging Face's code)."""
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets = num_buckets // 2
        buckets = buckets + (relative_position > 0).to(torch.long) * num_buckets
        relative_position = torch.abs(relative_position)
    else:
        relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    if_large = max_exact + (
        torch.log(relative_position.float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).to(torch.long)
    if_large = torch.min(if_large, torch.full_like(if_large, num_buckets - 1))
    return buckets + torch.where(is_small, relative_position, if_large)


def alibi_slopes(num_heads: int) -> List[float]:
    """ALiBi's head slopes (Press et al., "Train Short, Test Long", 2022): for n heads, n a power
    of two, the geometric sequence starting at 2^(-8/n) with that ratio; otherwise the slopes of
    the closest power of two below, then every other slope of twice that many heads."""
    def power_of_two(n):
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start ** i for i in range(n)]

    if math.log2(num_heads).is_integer():
        return power_of_two(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    return power_of_two(closest) + power_of_two(2 * closest)[0::2][: num_heads - closest]


def rope_frequencies(rotary_dim: int, theta: float, llama3_scaling: List[float]) -> List[float]:
    """RoPE's frequencies theta^(-2i/d) (Su et al., "RoFormer", 2021), i < d/2, optionally with
    Llama 3.1's scaling [factor, low_freq_factor, high_freq_factor, original_context_length]:
    wavelengths beyond original / low_freq_factor are stretched by factor, those below
    original / high_freq_factor kept, and those between blended linearly."""
    freqs = [theta ** (-i / rotary_dim) for i in range(0, rotary_dim, 2)]
    if not llama3_scaling:
        return freqs
    factor, low, high, original = llama3_scaling
    scaled = []
    for f in freqs:
        wavelength = 2 * math.pi / f
        if wavelength < original / high:
            scaled.append(f)
        elif wavelength > original / low:
            scaled.append(f / factor)
        else:
            smooth = (original / wavelength - low) / (high - low)
            scaled.append((1 - smooth) * f / factor + smooth * f)
    return scaled


def apply_rope(x, freqs: List[float], interleaved: bool):
    """Rotates the first 2 * len(freqs) features of x (..., T, d) by position (0, 1, ...) x
    frequency: pairs (i, i + r/2) as Llama's rotate_half, or (2i, 2i + 1) as GPT-J."""
    half = len(freqs)
    positions = torch.arange(x.shape[-2], device=x.device).to(torch.float64)
    angles = positions[:, None] * torch.tensor(freqs, dtype=torch.float64, device=x.device)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    part, rest = x[..., : 2 * half], x[..., 2 * half:]
    if interleaved:
        x1, x2 = part[..., 0::2], part[..., 1::2]
        out = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
    else:
        x1, x2 = part[..., :half], part[..., half:]
        out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return torch.cat([out, rest], dim=-1)


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
    grouped-query formulation (the C++ kernel folds the group instead of copying).

    The variants of later models, written out on whole score matrices: `sliding_window` W (each
    query sees the W keys ending at its position; 0 = none), `softcap` (Gemma 2's
    cap * tanh(scores / cap) on the scaled scores; 0 = none), `alibi` (-m_h * |i - j| added to
    head h's scaled scores) and `top_left` (query i at position i; by default the queries are
    the last of the keys' positions, bottom-right). Rotary embeddings: `rope_theta` > 0 rotates
    the first `rotary_dim` features (0 = all) of every query and key head, pairs half-split or
    `rope_interleaved`, frequencies scaled by `llama3_scaling` when given. Without any of them,
    the book's code runs."""

    alibi_slopes: List[float]
    rope_freqs: List[float]

    def __init__(self, d_in: int, d_out: int, context_length: int, dropout: float, num_heads: int,
                 qkv_bias: bool = False, num_kv_heads: int = -1, causal: bool = True,
                 d_in_kv: int = -1, sliding_window: int = 0, softcap: float = 0.0,
                 alibi: bool = False, top_left: bool = False, rope_theta: float = 0.0,
                 rotary_dim: int = 0, rope_interleaved: bool = False,
                 llama3_scaling: Optional[List[float]] = None, sinks: bool = False,
                 relative_bias: Optional[List[int]] = None):
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
        self.sliding_window = sliding_window
        self.softcap = softcap
        self.alibi_slopes = alibi_slopes(num_heads) if alibi else []
        self.top_left = top_left
        self.rope_freqs = []
        if rope_theta > 0:
            self.rope_freqs = rope_frequencies(rotary_dim or d_out // num_heads, rope_theta,
                                               llama3_scaling or [])
        self.rope_interleaved = rope_interleaved
        # T5's relative position buckets: [num_buckets, max_distance, bidirectional].
        self.relative_buckets: List[int] = relative_bias if relative_bias is not None else []
        self.variants = (sliding_window > 0 or softcap > 0 or alibi or top_left or sinks
                         or relative_bias is not None)
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in_kv, num_kv_heads * self.head_dim, bias=qkv_bias)
        self.W_value = nn.Linear(d_in_kv, num_kv_heads * self.head_dim, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        # gpt-oss's sinks: a logit per head in every softmax normalizer, drawn after out_proj.
        if sinks:
            self.sinks = nn.Parameter(torch.randn(num_heads) * 0.02)
        else:
            self.register_parameter("sinks", None)
        # T5's relative attention bias, (num_buckets, num_heads), drawn after the sinks.
        if relative_bias is not None:
            self.relative_attention_bias = nn.Parameter(
                torch.randn(relative_bias[0], num_heads) * 0.02)
        else:
            self.register_parameter("relative_attention_bias", None)
        # A score modification by name (make_golden.py sets it per case): "" none, or "wavy".
        self.score_mod: str = ""
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
        if len(self.rope_freqs) > 0:
            queries = apply_rope(queries, self.rope_freqs, self.rope_interleaved)
            keys = apply_rope(keys.transpose(1, 2), self.rope_freqs,
                              self.rope_interleaved).transpose(1, 2)
        keys = keys.transpose(1, 2).repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)
        values = values.transpose(1, 2).repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)

        attn_scores = queries @ keys.transpose(2, 3)
        if self.variants or self.score_mod != "":
            attn_weights = self.variant_weights(attn_scores, keys.shape[-1], key_padding_mask,
                                                attn_mask)
            return self.dropout(attn_weights), values
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

    def variant_weights(self, attn_scores, head_dim: int,
                        key_padding_mask: Optional[torch.Tensor],
                        attn_mask: Optional[torch.Tensor]):
        """softmax of the scaled scores, capped, with ALiBi and every mask; query i sits at
        position i + Tk - Tq (bottom-right) or i (top-left)."""
        num_tokens, num_keys = attn_scores.shape[-2], attn_scores.shape[-1]
        scores = attn_scores / head_dim ** 0.5
        if self.softcap > 0:
            scores = self.softcap * torch.tanh(scores / self.softcap)
        offset = 0 if self.top_left else num_keys - num_tokens
        position = torch.arange(num_tokens, device=scores.device)[:, None] + offset
        key = torch.arange(num_keys, device=scores.device)[None, :]
        if len(self.alibi_slopes) > 0:
            slopes = torch.tensor(self.alibi_slopes, dtype=torch.float64, device=scores.device)
            distance = (position - key).abs().to(torch.float64)
            scores = scores + (-slopes[:, None, None] * distance).to(scores.dtype)
        if self.score_mod == "wavy":
            # s (1 + 0.1 head + 0.2 batch) + 0.5 sin(s) cos(0.05 r), r = j - pos(i); autograd
            # differentiates it.
            wave = torch.cos((key - position).to(scores.dtype) * 0.05)
            head = torch.arange(scores.shape[1], dtype=torch.float64,
                                device=scores.device)[:, None, None]
            batch = torch.arange(scores.shape[0], dtype=torch.float64,
                                 device=scores.device)[:, None, None, None]
            slope = (1 + 0.1 * head + 0.2 * batch).to(scores.dtype)
            scores = scores * slope + torch.sin(scores) * wave * 0.5
        table = self.relative_attention_bias
        if table is not None:
            r = self.relative_buckets
            buckets = t5_relative_bucket(key - position, r[0], r[1], r[2] != 0)
            scores = scores + table[buckets].permute(2, 0, 1)
        hidden = torch.zeros(num_tokens, num_keys, dtype=torch.bool, device=scores.device)
        if self.causal:
            hidden = hidden | (key > position)
        if self.sliding_window > 0:
            hidden = hidden | (key <= position - self.sliding_window)
            if not self.causal:
                hidden = hidden | (key >= position + self.sliding_window)
        if key_padding_mask is not None:
            scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
        if attn_mask is not None:
            scores = scores.masked_fill(attn_mask, float("-inf"))
        scores = scores.masked_fill(hidden, float("-inf"))
        sinks = self.sinks
        if sinks is not None:
            # One more column per head, the sink's logit, dropped after the softmax.
            column = sinks.view(1, -1, 1, 1).expand(scores.shape[0], -1, num_tokens, 1)
            return torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :num_keys]
        return torch.softmax(scores, dim=-1)

    def forward(self, x, context: Optional[torch.Tensor] = None,
                key_padding_mask: Optional[torch.Tensor] = None,
                attn_mask: Optional[torch.Tensor] = None):
        b, num_tokens, _ = x.shape
        attn_weights, values = self.attention_weights(x, context, key_padding_mask, attn_mask)
        context_vec = (attn_weights @ values).transpose(1, 2)
        context_vec = context_vec.contiguous().view(b, num_tokens, self.d_out)
        return self.out_proj(context_vec)


def head_size(d_out: int, num_heads: int) -> int:
    """The book's head_dim, with its check that the heads divide d_out."""
    assert d_out % num_heads == 0, "d_out must be divisible by num_heads"
    return d_out // num_heads


def split_heads(x, num_heads: int):
    """(b, T, d_out) -> (b, num_heads, T, head_dim), as the book's classes reshape."""
    b, t, d = x.shape
    return x.view(b, t, num_heads, d // num_heads).transpose(1, 2)


class GatedMultiHeadAttention(nn.Module):
    """The book's GatedMultiHeadAttention (chapter 4, 08_deltanet; Qwen3-Next's gated attention):
    the book's causal MultiHeadAttention with a gate projection W_gate, made right after W_query,
    and the heads' joined outputs times sigmoid(W_gate x) before out_proj. Its causal mask is a
    non-persistent buffer, so state dicts hold the five projections only."""

    def __init__(self, d_in: int, d_out: int, context_length: int, dropout: float, num_heads: int,
                 qkv_bias: bool = False):
        super().__init__()
        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = head_size(d_out, num_heads)
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_gate = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer(
            "mask", torch.triu(torch.ones(context_length, context_length), diagonal=1),
            persistent=False)

    def forward(self, x):
        b, t, _ = x.shape
        queries = split_heads(self.W_query(x), self.num_heads)
        gate = self.W_gate(x)
        keys = split_heads(self.W_key(x), self.num_heads)
        values = split_heads(self.W_value(x), self.num_heads)
        scores = queries @ keys.transpose(-2, -1)
        # The book fills with the dtype's lowest value; every query sees its own token, so -inf
        # gives the same weights (and TorchScript scripts it).
        scores = scores.masked_fill(self.mask[:t, :t] != 0, -torch.inf)
        weights = self.dropout(torch.softmax(scores / self.head_dim ** 0.5, dim=-1))
        context = (weights @ values).transpose(1, 2).reshape(b, t, self.d_out)
        return self.out_proj(context * torch.sigmoid(gate))


class MultiHeadLatentAttention(nn.Module):
    """The book's MultiHeadLatentAttention (chapter 4, 05_mla) without its cache: every token's
    input goes down to a latent of `latent_dim` features (W_DKV), each head's keys and values come
    up from it (W_UK, W_UV), then causal attention per head and out_proj. Constructor arguments,
    parameter names and their order are the book's (latent_dim None: max(16, d_out // 8)).

    The arguments after the book's add DeepSeek-V2's parts, written to its paper's equations (the
    book's class has none of them; 0 or False leaves the book's module): `rope_dim`, the decoupled
    rotary part (W_QR: each head's rotary queries, W_KR: one rotary key per token, both rotated
    by position, half-split pairs, base rope_theta; scores over head_dim + rope_dim features);
    `q_latent_dim`, compressed queries (W_DQ down, W_UQ up, in W_query's place); `latent_norm`,
    an RMSNorm (eps 1e-6) on each latent before its up-projections (kv_norm, q_norm)."""
    rope_freqs: List[float]

    def __init__(self, d_in: int, d_out: int, dropout: float, num_heads: int,
                 qkv_bias: bool = False, latent_dim: Optional[int] = None, rope_dim: int = 0,
                 rope_theta: float = 10000.0, q_latent_dim: int = 0, latent_norm: bool = False):
        super().__init__()
        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = head_size(d_out, num_heads)
        self.latent_dim = latent_dim if latent_dim is not None else max(16, d_out // 8)
        self.rope_dim = rope_dim
        self.q_latent_dim = q_latent_dim
        self.rope_freqs = rope_frequencies(rope_dim, rope_theta, []) if rope_dim > 0 else []
        # Parts a configuration leaves out are identities: no parameters, and TorchScript still
        # sees one type per attribute.
        self.W_query = nn.Identity()
        self.W_DQ = nn.Identity()
        self.q_norm = nn.Identity()
        self.W_UQ = nn.Identity()
        self.W_QR = nn.Identity()
        self.kv_norm = nn.Identity()
        self.W_KR = nn.Identity()
        query_source = d_in
        if q_latent_dim > 0:
            self.W_DQ = nn.Linear(d_in, q_latent_dim, bias=qkv_bias)
            if latent_norm:
                self.q_norm = RMSNorm(q_latent_dim, eps=1e-6)
            self.W_UQ = nn.Linear(q_latent_dim, d_out, bias=qkv_bias)
            query_source = q_latent_dim
        else:
            self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        if rope_dim > 0:
            self.W_QR = nn.Linear(query_source, num_heads * rope_dim, bias=qkv_bias)
        self.W_DKV = nn.Linear(d_in, self.latent_dim, bias=qkv_bias)
        if latent_norm:
            self.kv_norm = RMSNorm(self.latent_dim, eps=1e-6)
        if rope_dim > 0:
            self.W_KR = nn.Linear(d_in, rope_dim, bias=qkv_bias)
        self.W_UK = nn.Linear(self.latent_dim, d_out, bias=qkv_bias)
        self.W_UV = nn.Linear(self.latent_dim, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        b, t, _ = x.shape
        if self.q_latent_dim > 0:
            query_source = self.q_norm(self.W_DQ(x))
            queries = split_heads(self.W_UQ(query_source), self.num_heads)
        else:
            query_source = x
            queries = split_heads(self.W_query(x), self.num_heads)
        latent = self.kv_norm(self.W_DKV(x))
        keys = split_heads(self.W_UK(latent), self.num_heads)
        values = split_heads(self.W_UV(latent), self.num_heads)
        if self.rope_dim > 0:
            rotary_queries = self.W_QR(query_source).view(b, t, self.num_heads, self.rope_dim)
            rotary_queries = apply_rope(rotary_queries.transpose(1, 2), self.rope_freqs, False)
            rotary_key = apply_rope(self.W_KR(x), self.rope_freqs, False)
            queries = torch.cat([queries, rotary_queries], dim=-1)
            keys = torch.cat([keys, rotary_key.unsqueeze(1).expand(
                b, self.num_heads, t, self.rope_dim)], dim=-1)
        scores = queries @ keys.transpose(-2, -1)
        future = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
        scores = scores.masked_fill(future, -torch.inf)
        scale = (self.head_dim + self.rope_dim) ** 0.5
        weights = self.dropout(torch.softmax(scores / scale, dim=-1))
        context = (weights @ values).transpose(1, 2).contiguous().view(b, t, self.d_out)
        return self.out_proj(context)


class MultiHeadAttentionWithKVSharing(nn.Module):
    """The book's MultiHeadAttentionWithKVSharing (chapter 4, 10_kv-sharing) without its cache:
    causal multi-head attention that returns the keys and values it attended to, or attends to
    those an earlier layer returned (`shared_kv`) with its own queries. Its W_key and W_value stay
    (the book's state dicts hold them) and are unused in a reading layer."""

    def __init__(self, d_in: int, d_out: int, dropout: float, num_heads: int,
                 qkv_bias: bool = False):
        super().__init__()
        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = head_size(d_out, num_heads)
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, shared_kv: Optional[Tuple[torch.Tensor, torch.Tensor]] = None):
        b, t, _ = x.shape
        queries = split_heads(self.W_query(x), self.num_heads)
        if shared_kv is None:
            keys = split_heads(self.W_key(x), self.num_heads)
            values = split_heads(self.W_value(x), self.num_heads)
        else:
            keys, values = shared_kv
        scores = queries @ keys.transpose(-2, -1)
        t_k = keys.shape[-2]
        future = torch.triu(torch.ones(t, t_k, dtype=torch.bool, device=x.device),
                            diagonal=t_k - t + 1)
        scores = scores.masked_fill(future, -torch.inf)
        weights = self.dropout(torch.softmax(scores / self.head_dim ** 0.5, dim=-1))
        context = (weights @ values).transpose(1, 2).contiguous().view(b, t, self.d_out)
        return self.out_proj(context), (keys, values)


class KVSharingStack(nn.Module):
    """Layers of MultiHeadAttentionWithKVSharing with residual connections, run as the book's GPT
    runs them: the first n_kv_producing_layers make their own keys and values, every later layer
    attends to the last producer's."""

    def __init__(self, d_in: int, num_heads: int, n_layers: int, n_kv_producing_layers: int,
                 qkv_bias: bool = False):
        super().__init__()
        self.n_kv_producing_layers = n_kv_producing_layers
        self.layers = nn.ModuleList([
            MultiHeadAttentionWithKVSharing(d_in, d_in, 0.0, num_heads, qkv_bias)
            for _ in range(n_layers)])

    def forward(self, x):
        shared: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
        i = 0
        for layer in self.layers:
            if i < self.n_kv_producing_layers:
                out, shared = layer(x, None)
            else:
                out, _ = layer(x, shared)
            x = x + out
            i += 1
        return x


class RMSNorm(nn.Module):
    """nn.RMSNorm of PyTorch 2.4 and later over the last dimension (parameter `weight`, ones),
    written out for the PyTorch generations that lack it."""

    def __init__(self, normalized_shape: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(normalized_shape))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def l2norm(x, eps: float = 1e-6):
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


class GatedDeltaNet(nn.Module):
    """The book's GatedDeltaNet (chapter 4, 08_deltanet): unit queries (scaled) and keys, an
    update gate beta per value feature, a decay per head from A_log, W_alpha and dt_bias, the
    gated delta rule token by token over a d x d state per head, then RMSNorm and a SiLU gate.
    Constructor arguments, parameter names and their order are the book's."""

    def __init__(self, d_in: int, d_out: int, dropout: float, num_heads: int,
                 qkv_bias: bool = False):
        super().__init__()
        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = head_size(d_out, num_heads)
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_gate = nn.Linear(d_in, d_out, bias=False)
        self.W_beta = nn.Linear(d_in, d_out, bias=False)
        self.W_alpha = nn.Linear(d_in, num_heads, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(num_heads))
        self.A_log = nn.Parameter(torch.log(torch.empty(num_heads).uniform_(0, 16)))
        self.norm = RMSNorm(self.head_dim, eps=1e-6)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        b, t, _ = x.shape
        queries = l2norm(split_heads(self.W_query(x), self.num_heads)) / (self.head_dim ** 0.5)
        keys = l2norm(split_heads(self.W_key(x), self.num_heads))
        values = split_heads(self.W_value(x), self.num_heads)
        beta = split_heads(torch.sigmoid(self.W_beta(x)), self.num_heads)
        alpha = -self.A_log.exp().view(1, 1, -1) * nn.functional.softplus(
            self.W_alpha(x) + self.dt_bias)
        gate = self.W_gate(x).view(b, t, self.num_heads, self.head_dim)
        state = x.new_zeros(b, self.num_heads, self.head_dim, self.head_dim)
        outs: List[torch.Tensor] = []
        for i in range(t):
            k_t = keys[:, :, i]
            state = state * alpha[:, i].exp().unsqueeze(-1).unsqueeze(-1)
            kv_mem = (state * k_t.unsqueeze(-1)).sum(dim=-2)
            delta = (values[:, :, i] - kv_mem) * beta[:, :, i]
            state = state + k_t.unsqueeze(-1) * delta.unsqueeze(-2)
            outs.append((state * queries[:, :, i].unsqueeze(-1)).sum(dim=-2))
        if t > 0:
            context = torch.stack(outs, dim=2).transpose(1, 2)
        else:
            context = x.new_zeros(b, 0, self.num_heads, self.head_dim)
        context = self.norm(context) * nn.functional.silu(gate)
        context = self.dropout(context.reshape(b, t, self.d_out))
        return self.out_proj(context)


class LightningIndexer(nn.Module):
    """The book's LightningIndexer (chapter 4, 09_dsa): I[t, s] = sum_j w[t, j] ReLU(q[t, j] . k[s]
    / sqrt(index_head_dim)), w the softmax over the index heads of W_weights x. The one change:
    the top-k are chosen deterministically (highest score first, the earlier token first among
    equal ones) where the book calls torch.topk, whose order among ties is unspecified."""

    def __init__(self, d_model: int, index_n_heads: int, index_head_dim: int):
        super().__init__()
        self.index_n_heads = index_n_heads
        self.index_head_dim = index_head_dim
        self.W_q_index = nn.Linear(d_model, index_n_heads * index_head_dim, bias=False)
        self.W_k_index = nn.Linear(d_model, index_head_dim, bias=False)
        self.W_weights = nn.Linear(d_model, index_n_heads, bias=False)
        self.scale = index_head_dim ** -0.5

    def forward(self, x, x_ctx, topk: int, causal_mask: torch.Tensor):
        b, t, _ = x.shape
        s = x_ctx.shape[1]
        q = self.W_q_index(x).view(b, t, self.index_n_heads, self.index_head_dim)
        k = self.W_k_index(x_ctx)
        raw = torch.relu(torch.einsum("bthd,bsd->bths", q, k) * self.scale)
        w = self.W_weights(x).softmax(dim=-1)
        scores = torch.einsum("bth,bths->bts", w, raw) + causal_mask
        order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
        return order[..., :min(topk, s)]


class MultiHeadAttentionWithDSA(nn.Module):
    """The book's MultiHeadAttentionWithDSA (chapter 4, 09_dsa) without its cache: causal
    multi-head attention whose queries each see only the top-k tokens the indexer picks among
    themselves and those before them. Constructor arguments, parameter names and their order are
    the book's."""

    def __init__(self, d_in: int, d_out: int, dropout: float, num_heads: int,
                 qkv_bias: bool = False, index_n_heads: int = 4, index_head_dim: int = 64,
                 topk: int = 64):
        super().__init__()
        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = head_size(d_out, num_heads)
        self.topk = topk
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        self.indexer = LightningIndexer(d_in, index_n_heads, index_head_dim)

    def forward(self, x):
        b, t, _ = x.shape
        queries = split_heads(self.W_query(x), self.num_heads)
        keys = split_heads(self.W_key(x), self.num_heads)
        values = split_heads(self.W_value(x), self.num_heads)
        scores = queries @ keys.transpose(2, 3)
        future = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
        causal = torch.zeros(t, t, dtype=scores.dtype, device=x.device)
        causal = causal.masked_fill(future, -torch.inf)
        chosen = self.indexer(x, x, self.topk, causal)
        sparse = torch.full((b, t, t), -torch.inf, dtype=scores.dtype, device=x.device)
        sparse = sparse.scatter(-1, chosen, 0.0)
        scores = scores + (causal.unsqueeze(0) + sparse).unsqueeze(1)
        weights = self.dropout(torch.softmax(scores / self.head_dim ** 0.5, dim=-1))
        context = (weights @ values).transpose(1, 2).contiguous().view(b, t, self.d_out)
        return self.out_proj(context)


# ------------------------------------------------------------------------------------------------
# The attention layer of each family of the book's chapter-5 zoo, made by the stand-ins of the
# book's classes in examples/zoo/book_zoo.py (imported from there, not copied).

ZOO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "zoo")
# The case's args that are not the book's config keys.
ZOO_CASE_KEYS = ("family", "layer", "perturb_norms")


def book_zoo():
    """examples/zoo/book_zoo.py, imported by path."""
    if ZOO not in sys.path:
        sys.path.insert(0, ZOO)
    import book_zoo as module
    return module


class _Recorded(Exception):
    """Raised by the stand-in of book_zoo.Attention that records the arguments make_block
    passes, before make_block goes on to draw the block's other modules."""

    def __init__(self, args, kwargs):
        super().__init__()
        self.args, self.kwargs = args, kwargs


def _zoo_model(bz, family, cfg):
    """The family's model class, and an object holding `cfg` and the model's head_dim on which
    the class's make_block, rope_buffers and mixer_args run as on a model (the model itself
    would draw the embeddings, feed-forwards and head too)."""
    cls = bz.FAMILIES[family][0]
    model = types.SimpleNamespace(cfg=cfg)
    if family != "gemma4":
        model.head_dim = cls.head_dim.fget(model)
    return cls, model


def _attention_arguments(bz, family, cfg, kind):
    """The arguments the family's make_block gives book_zoo.Attention for a layer of `kind`."""
    cls, model = _zoo_model(bz, family, cfg)
    real = bz.Attention

    def record(*args, **kwargs):
        raise _Recorded(args, kwargs)
    bz.Attention = record
    try:
        cls.make_block(model, 0, kind)
    except _Recorded as recorded:
        return recorded.args, recorded.kwargs
    finally:
        bz.Attention = real
    raise ValueError(f"{family}'s make_block made no Attention for a {kind} layer")


def _zoo_tables(bz, family, cfg, kind):
    """A function of (t, dtype) giving the (mask, cos, sin) the family's model hands a layer of
    `kind` over t tokens: its own rope_buffers and mixer_args, masks_for as its forward calls it;
    Gemma 4's tables and choice as Gemma4Model.__init__ and forward make them."""
    if family == "gemma4":
        ctx = cfg["context_length"]
        if kind == "sliding_attention":
            cos, sin = bz.rope_tables(bz.rope_inv_freq(cfg["head_dim"], cfg["rope_local_base"]),
                                      ctx)
        else:
            if cfg["rope_global_type"] == "proportional":
                inv = bz.rope_inv_freq_proportional(cfg["global_head_dim"],
                                                    cfg["rope_global_base"],
                                                    cfg["rope_global_partial_rotary_factor"])
            else:
                inv = bz.rope_inv_freq(cfg["global_head_dim"], cfg["rope_global_base"])
            cos, sin = bz.rope_tables(inv, ctx)

        def gemma4(t, dtype):
            return bz.masks_for(t, cfg["sliding_window"])[kind], cos, sin
        return gemma4
    cls, model = _zoo_model(bz, family, cfg)
    for name, table in cls.rope_buffers(model).items():
        setattr(model, name, table)

    def tables(t, dtype):
        return cls.mixer_args(model, kind, bz.masks_for(t, cfg.get("sliding_window")), t, dtype)
    return tables


def zoo_attention(args: dict, seed: int, dtype: torch.dtype) -> nn.Module:
    """The attention layer of args["family"]'s model for a layer of kind args["layer"]
    ("sliding_attention" or "full_attention"), the other args being the book's config keys: the
    book_zoo class itself (Attention with the arguments the family's make_block gives it, or
    Gemma4Attention), created in float32 right after torch.manual_seed(seed), then cast to
    `dtype`. Its forward takes x alone: the mask and rotary tables are made from the config as
    the family's model makes them for that layer. With args["perturb_norms"], every norm weight
    then gets N(0, 0.5^2) noise from a generator of its own (seed + 5), so that the weights'
    values matter (seeded, they are ones or zeros)."""
    bz = book_zoo()
    family, kind = args["family"], args["layer"]
    cfg = {k: v for k, v in args.items() if k not in ZOO_CASE_KEYS}
    cfg.update(dtype=torch.float32, n_layers=1, layer_types=[kind])
    if family == "gemma4":
        cfg["num_kv_shared_layers"] = 0
        base, call = bz.Gemma4Attention, ((cfg, 0), {})
    else:
        base, call = bz.Attention, _attention_arguments(bz, family, cfg, kind)
    tables = _zoo_tables(bz, family, cfg, kind)

    class ZooAttention(base):
        def forward(self, x):
            out = super().forward(x, *tables(x.shape[1], x.dtype))
            return out[0] if isinstance(out, tuple) else out

    torch.manual_seed(seed)
    layer = ZooAttention(*call[0], **call[1])
    if args.get("perturb_norms"):
        generator = torch.Generator().manual_seed(seed + 5)
        with torch.no_grad():
            for name, p in layer.named_parameters():
                if "norm" in name:
                    p.add_(torch.randn(p.shape, generator=generator, dtype=torch.float64)
                           .to(p.dtype) * 0.5)
    return layer.to(dtype)


MODULES = {
    "SelfAttention": SelfAttention,
    "MultiHeadAttentionWrapper": MultiHeadAttentionWrapper,
    "CausalSelfAttention": CausalSelfAttention,
    "CrossAttention": CrossAttention,
    "MultiHeadAttention": MultiHeadAttention,
    "MultiHeadLatentAttention": MultiHeadLatentAttention,
    "GatedMultiHeadAttention": GatedMultiHeadAttention,
    "KVSharingStack": KVSharingStack,
    "GatedDeltaNet": GatedDeltaNet,
    "MultiHeadAttentionWithDSA": MultiHeadAttentionWithDSA,
}


def build(module: str, args: dict, seed: int, dtype: torch.dtype) -> nn.Module:
    """The module as a golden case makes it: seeded right before construction, then cast."""
    if module == "ZooAttention":
        return zoo_attention(args, seed, dtype)
    torch.manual_seed(seed)
    return MODULES[module](**args).to(dtype)
