"""The book's GPT (chapter 4) in Python: the model the C++ example mirrors, its text generation
without a cache (the book's generate_text_simple) and with a key/value cache. cfg["attention"]
(default "mha") gives its blocks one of the attention mechanisms of the book's chapter 4 instead of
MultiHeadAttention, as the book's bonus sections do (see ATTENTIONS)."""

import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts"))
from reference import (  # noqa: E402  the book's classes
    GatedDeltaNet, GatedMultiHeadAttention, MultiHeadAttention, MultiHeadAttentionWithDSA,
    MultiHeadAttentionWithKVSharing, MultiHeadLatentAttention)


class LayerNorm(nn.Module):
    def __init__(self, emb_dim):
        super().__init__()
        self.eps = 1e-5
        self.scale = nn.Parameter(torch.ones(emb_dim))
        self.shift = nn.Parameter(torch.zeros(emb_dim))

    def forward(self, x):
        mean = x.mean(dim=-1, keepdim=True)
        var = x.var(dim=-1, keepdim=True, unbiased=False)
        return self.scale * (x - mean) / torch.sqrt(var + self.eps) + self.shift


class GELU(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1 + torch.tanh(torch.sqrt(torch.tensor(2.0 / torch.pi)) *
                                         (x + 0.044715 * torch.pow(x, 3))))


class FeedForward(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["emb_dim"]
        self.layers = nn.Sequential(nn.Linear(d, 4 * d), GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        return self.layers(x)


def make_attention(cfg):
    """The attention of a block: the book's class that cfg["attention"] names (ATTENTIONS), with
    the sizes of cfg, the way the book's GPT of each bonus section makes it."""
    d, heads, drop, bias = cfg["emb_dim"], cfg["n_heads"], cfg["drop_rate"], cfg["qkv_bias"]
    kind = cfg.get("attention", "mha")
    if kind == "mha":
        return MultiHeadAttention(d, d, cfg["context_length"], drop, heads, qkv_bias=bias)
    if kind == "gated":
        return GatedMultiHeadAttention(d, d, cfg["context_length"], drop, heads, qkv_bias=bias)
    if kind == "mla":
        return MultiHeadLatentAttention(d, d, drop, heads, qkv_bias=bias,
                                        latent_dim=cfg["latent_dim"])
    if kind == "deltanet":
        return GatedDeltaNet(d, d, drop, heads, qkv_bias=bias)
    if kind == "dsa":
        return MultiHeadAttentionWithDSA(d, d, drop, heads, qkv_bias=bias,
                                         index_n_heads=cfg["index_n_heads"],
                                         index_head_dim=cfg["index_head_dim"], topk=cfg["topk"])
    if kind == "kv_sharing":
        return MultiHeadAttentionWithKVSharing(d, d, drop, heads, qkv_bias=bias)
    raise ValueError(f"unknown attention {kind!r}; expected one of {', '.join(ATTENTIONS)}")


ATTENTIONS = ("mha", "gated", "mla", "deltanet", "dsa", "kv_sharing")


class TransformerBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.att = make_attention(cfg)
        self.ff = FeedForward(cfg)
        self.norm1 = LayerNorm(cfg["emb_dim"])
        self.norm2 = LayerNorm(cfg["emb_dim"])
        self.drop_shortcut = nn.Dropout(cfg["drop_rate"])

    def forward(self, x, cache=None, visible=None):
        shortcut = x
        x = self.norm1(x)
        x = self.att(x) if cache is None else cached_attention(self.att, x, cache, visible)
        x = self.drop_shortcut(x) + shortcut
        shortcut = x
        return self.drop_shortcut(self.ff(self.norm2(x))) + shortcut

    def forward_sharing(self, x, shared_kv):
        """The block with cross-layer KV sharing: attends to `shared_kv` (an earlier layer's keys
        and values) when given, else to its own; returns the output and the keys and values."""
        shortcut = x
        out, kv = self.att(self.norm1(x), shared_kv)
        x = self.drop_shortcut(out) + shortcut
        return self.drop_shortcut(self.ff(self.norm2(x))) + x, kv


class GPTModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.tok_emb = nn.Embedding(cfg["vocab_size"], cfg["emb_dim"])
        self.pos_emb = nn.Embedding(cfg["context_length"], cfg["emb_dim"])
        self.drop_emb = nn.Dropout(cfg["drop_rate"])
        self.trf_blocks = nn.Sequential(*[TransformerBlock(cfg) for _ in range(cfg["n_layers"])])
        self.final_norm = LayerNorm(cfg["emb_dim"])
        self.out_head = nn.Linear(cfg["emb_dim"], cfg["vocab_size"], bias=False)
        # With KV sharing the first n_kv_producing_layers blocks make keys and values and every
        # later block attends to the last producer's (reference.KVSharingStack's rule).
        self.n_kv_producing_layers = (cfg["n_kv_producing_layers"]
                                      if cfg.get("attention") == "kv_sharing" else None)

    def forward(self, idx, caches=None, start=0, positions=None, visible=None):
        """With caches, `positions` (B, T) and `visible` (B, 1, T, keys) may give each row its own
        positions and the keys each query sees (a batch of padded prompts)."""
        if positions is None:
            positions = torch.arange(start, start + idx.shape[1])
        x = self.drop_emb(self.tok_emb(idx) + self.pos_emb(positions))
        if self.n_kv_producing_layers is not None:
            shared = None
            for i, block in enumerate(self.trf_blocks):
                producing = i < self.n_kv_producing_layers
                x, kv = block.forward_sharing(x, None if producing else shared)
                shared = kv if producing else shared
            return self.out_head(self.final_norm(x))
        for i, block in enumerate(self.trf_blocks):
            x = block(x, None if caches is None else caches[i], visible)
        return self.out_head(self.final_norm(x))


def cached_attention(att, x, cache, visible=None):
    """The book's MultiHeadAttention on new tokens, attending to the cached ones as well: causally,
    or to the keys `visible` (broadcast to (B, heads, new tokens, keys)) marks."""
    b, t, _ = x.shape
    split = lambda y: y.view(b, t, att.num_heads, att.head_dim).transpose(1, 2)  # noqa: E731
    q, k, v = split(att.W_query(x)), split(att.W_key(x)), split(att.W_value(x))
    if cache:
        k = torch.cat([cache[0], k], dim=2)
        v = torch.cat([cache[1], v], dim=2)
    cache[:] = [k, v]
    total = k.shape[2]
    scores = q @ k.transpose(2, 3)
    if visible is None:
        hidden = torch.ones(t, total, dtype=torch.bool).triu(total - t + 1)
    else:
        hidden = ~visible
    weights = torch.softmax(scores.masked_fill(hidden, -torch.inf) / att.head_dim ** 0.5, dim=-1)
    return att.out_proj((weights @ v).transpose(1, 2).reshape(b, t, att.d_out))


def generate_text_simple(model, idx, max_new_tokens, context_size):
    """The book's greedy generation: the whole (cropped) sequence through the model each step."""
    for _ in range(max_new_tokens):
        with torch.no_grad():
            logits = model(idx[:, -context_size:])[:, -1, :]
        idx = torch.cat([idx, torch.argmax(logits, dim=-1, keepdim=True)], dim=1)
    return idx


def generate_simple_with_logits(model, idx, max_new_tokens, context_size):
    """generate_text_simple, returning the logits of every step as well, (B, new tokens, vocab):
    the reference for a model whose attention has no cache here."""
    steps = []
    for _ in range(max_new_tokens):
        with torch.no_grad():
            logits = model(idx[:, -context_size:])[:, -1, :]
        steps.append(logits)
        idx = torch.cat([idx, torch.argmax(logits, dim=-1, keepdim=True)], dim=1)
    return idx, torch.stack(steps, dim=1)


def generate_cached(model, idx, max_new_tokens):
    """Greedy generation with a key/value cache: the prompt once, then one token per step.
    Returns the tokens and the logits of every step."""
    caches = [[] for _ in model.trf_blocks]
    steps = []
    with torch.no_grad():
        logits = model(idx, caches, 0)[:, -1, :]
        for _ in range(max_new_tokens):
            steps.append(logits)
            token = torch.argmax(logits, dim=-1, keepdim=True)
            idx = torch.cat([idx, token], dim=1)
            if len(steps) < max_new_tokens:  # the last token needs no logits of its own
                logits = model(token, caches, idx.shape[1] - 1)[:, -1, :]
    return idx, torch.stack(steps, dim=1)
