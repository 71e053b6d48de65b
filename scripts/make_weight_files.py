#!/usr/bin/python3
"""Writes the weight files that the loading tests read: models/weights/.

Each file is written the way Python users write weights, by the layouts they come in:
torch.save(model.state_dict()) of the book's MultiHeadAttention, a training checkpoint with an
optimizer, a model of several blocks (for LoadOptions().prefix()), bfloat16/float16/float64
copies (for .cast()), torch.nn.MultiheadAttention, a Hugging Face Llama-style attention with
grouped-query shapes, GPT-2's attention with its fused, transposed Conv1D (for .layout()), the
pre-1.6 format, pickle protocol 4, a dict of nn.Parameter, and a checkpoint holding an
argparse.Namespace (a global the loader must refuse), and the book's chapter 3 CausalAttention
and MultiHeadAttentionWrapper. <name>.expected.pt holds, as a plain dict
of tensors, an input ("input") and the output the Python module gives for it ("output").

    scripts/make_weight_files.py            # rewrite models/weights/
    scripts/make_weight_files.py --out DIR  # write elsewhere
"""

import argparse
import math
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def book_mha(seed=123, **kwargs):
    args = dict(d_in=8, d_out=8, context_length=6, dropout=0.0, num_heads=2, qkv_bias=True)
    args.update(kwargs)
    torch.manual_seed(seed)
    return reference.MultiHeadAttention(**args).eval()


def causal_mask(t):
    return torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)


class Block(nn.Module):
    """A transformer block as the book names its attention: `att`, next to a feed-forward."""

    def __init__(self, seed):
        super().__init__()
        self.att = book_mha(seed)
        self.ff = nn.Linear(8, 8)


class Blocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.trf_blocks = nn.Sequential(*[Block(seed) for seed in (1, 2, 3)])
        self.final_norm = nn.LayerNorm(8)


class BookCausalAttention(nn.Module):
    """The book's CausalAttention (chapter 3): Linear projections, attention-weight dropout, the
    causal mask as a buffer, no output projection."""

    def __init__(self, d_in, d_out, context_length, dropout, qkv_bias=False):
        super().__init__()
        self.d_out = d_out
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length),
                                                diagonal=1))

    def forward(self, x):
        t = x.shape[1]
        keys, queries, values = self.W_key(x), self.W_query(x), self.W_value(x)
        scores = queries @ keys.transpose(1, 2)
        scores.masked_fill_(self.mask.bool()[:t, :t], -torch.inf)
        weights = self.dropout(torch.softmax(scores / keys.shape[-1] ** 0.5, dim=-1))
        return weights @ values


class BookMultiHeadAttentionWrapper(nn.Module):
    """The book's wrapper: CausalAttention heads side by side, outputs concatenated."""

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        self.heads = nn.ModuleList([BookCausalAttention(d_in, d_out, context_length, dropout,
                                                        qkv_bias) for _ in range(num_heads)])

    def forward(self, x):
        return torch.cat([head(x) for head in self.heads], dim=-1)


class LlamaAttention(nn.Module):
    """Hugging Face Llama's attention projections (no bias, grouped-query heads), causal,
    without rotary embeddings."""

    def __init__(self, d=16, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, d // heads
        self.q_proj = nn.Linear(d, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, d, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        group = self.heads // self.kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        scores = q @ k.transpose(2, 3) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(causal_mask(t), float("-inf"))
        context = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, t, -1)
        return self.o_proj(context)


class Conv1D(nn.Module):
    """GPT-2's Conv1D: a linear layer whose weight is stored (in, out)."""

    def __init__(self, nf, nx):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.2)
        self.bias = nn.Parameter(torch.randn(nf) * 0.2)

    def forward(self, x):
        return x @ self.weight + self.bias


class GPT2Attention(nn.Module):
    def __init__(self, d=8, heads=2, n_positions=6):
        super().__init__()
        self.heads = heads
        self.c_attn = Conv1D(3 * d, d)
        self.c_proj = Conv1D(d, d)
        self.register_buffer("bias", torch.tril(torch.ones(n_positions, n_positions,
                                                           dtype=torch.bool)).view(1, 1, n_positions, n_positions))
        self.register_buffer("masked_bias", torch.tensor(-1e4))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in (q, k, v))
        scores = q @ k.transpose(2, 3) / math.sqrt(d // self.heads)
        scores = scores.masked_fill(~self.bias[:, :, :t, :t], float("-inf"))
        context = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, t, d)
        return self.c_proj(context)


class GPT2MLP(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.c_fc = Conv1D(4 * d, d)
        self.c_proj = Conv1D(d, 4 * d)


class GPT2Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = GPT2Attention()
        self.mlp = GPT2MLP()


class GPT2(nn.Module):
    def __init__(self):
        super().__init__()
        self.h = nn.ModuleList([GPT2Block(), GPT2Block()])


def expected(out, name, module_forward, x):
    with torch.no_grad():
        torch.save({"input": x, "output": module_forward(x)}, os.path.join(out, name + ".expected.pt"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "models", "weights"))
    out = parser.parse_args().out
    os.makedirs(out, exist_ok=True)
    path = lambda name: os.path.join(out, name)  # noqa: E731
    torch.manual_seed(7)
    x = torch.randn(2, 6, 8)

    # What the article's and the book's readers write.
    mha = book_mha()
    torch.save(mha.state_dict(), path("book_mha.pth"))
    expected(out, "book_mha", mha, x)
    torch.save(mha.state_dict(), path("book_mha.protocol4.pth"), pickle_protocol=4)
    torch.save(mha.state_dict(), path("book_mha.legacy.pth"), _use_new_zipfile_serialization=False)
    torch.save(dict(mha.named_parameters()), path("book_mha.parameters.pth"))

    # The book's chapter 3 classes, with dropout (off in eval) and their mask buffers.
    torch.manual_seed(21)
    causal = BookCausalAttention(8, 4, 6, 0.5, qkv_bias=True).eval()
    torch.save(causal.state_dict(), path("book_causal_attention.pth"))
    expected(out, "book_causal_attention", causal, x)
    torch.manual_seed(22)
    wrapper = BookMultiHeadAttentionWrapper(8, 3, 6, 0.5, num_heads=3).eval()
    torch.save(wrapper.state_dict(), path("book_wrapper.pth"))
    expected(out, "book_wrapper", wrapper, x)

    # A training checkpoint: the model, Adam's state after two steps, and bookkeeping.
    trained = book_mha()
    optimizer = torch.optim.Adam(trained.parameters(), lr=1e-3)
    for _ in range(2):
        optimizer.zero_grad()
        trained(x).square().mean().backward()
        optimizer.step()
    trained.eval()
    checkpoint = {"model_state_dict": trained.state_dict(),
                  "optimizer_state_dict": optimizer.state_dict(),
                  "epoch": 3, "loss": 0.25, "note": b"\x00\xffbytes", "best": None}
    torch.save(checkpoint, path("checkpoint.pth"))
    expected(out, "checkpoint", trained, x)
    checkpoint["args"] = argparse.Namespace(lr=1e-3)
    torch.save(checkpoint, path("checkpoint_with_namespace.pth"))

    # A whole model: its second block's attention, by prefix.
    blocks = Blocks().eval()
    torch.save(blocks.state_dict(), path("blocks.pth"))
    expected(out, "blocks", blocks.trf_blocks[1].att, x)

    # Other dtypes of the book's weights (the expected output is the float32 module's on the
    # rounded weights).
    for dtype in (torch.bfloat16, torch.float16, torch.float64):
        name = "book_mha." + str(dtype).replace("torch.", "")
        rounded = book_mha().to(dtype)
        torch.save(rounded.state_dict(), path(name + ".pth"))
        expected(out, name, rounded.float(), x)

    # torch.nn.MultiheadAttention, causal through a bool mask (True = hidden).
    torch.manual_seed(11)
    torch_mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    torch.save(torch_mha.state_dict(), path("torch_mha.pth"))
    expected(out, "torch_mha", lambda v: torch_mha(v, v, v, attn_mask=causal_mask(v.shape[1]),
                                                  need_weights=False)[0], x)

    # Hugging Face Llama-style attention with grouped-query heads, under its usual path.
    torch.manual_seed(12)
    llama = LlamaAttention().eval()
    torch.save({"model.layers.0.self_attn." + k: v for k, v in llama.state_dict().items()},
               path("llama_gqa.pth"))
    x16 = torch.randn(2, 5, 16)
    expected(out, "llama_gqa", llama, x16)

    # GPT-2: the attention of block 1, whose MLP also has a c_proj.
    torch.manual_seed(13)
    gpt2 = GPT2().eval()
    torch.save(gpt2.state_dict(), path("gpt2.pth"))
    expected(out, "gpt2", gpt2.h[1].attn, x)


if __name__ == "__main__":
    main()
