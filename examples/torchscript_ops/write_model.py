"""A model written in Python on the library's operators, scripted and saved for a C++ program:
a pre-norm attention block (the book's MultiHeadAttention of attention_ops, grouped-query,
causal) whose queries and keys are rotated by attention_ops.apply_rotary. Writes into OUT_DIR:

    model.pt      the scripted model (torch.jit.save): it calls torch.ops.attention.*
    tensors.pt    a scripted holder of the input, Python's output and Python's gradient of
                  sum(output^2) with respect to the input

    ATTENTION_OPS_LIBRARY=build/libattention_ops.so PYTHONPATH=python \\
        /usr/bin/python3 examples/torchscript_ops/write_model.py OUT_DIR
"""

import os
import sys

import torch
from torch import nn

import attention_ops


class RotaryAttentionBlock(nn.Module):
    """x + out_proj(attention(rotary(W_query x), rotary(W_key x), W_value x)) on LayerNorm(x)."""

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int, context_length: int):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.att = attention_ops.MultiHeadAttention(d_model, d_model, context_length, 0.0,
                                                    num_heads, num_kv_heads=num_kv_heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        att = self.att
        h = self.norm(x)
        b, t, _ = h.shape
        queries = att.W_query(h).view(b, t, att.num_heads, att.head_dim).transpose(1, 2)
        keys = att.W_key(h).view(b, t, att.num_kv_heads, att.head_dim).transpose(1, 2)
        values = att.W_value(h).view(b, t, att.num_kv_heads, att.head_dim).transpose(1, 2)
        positions = torch.arange(t)
        queries = attention_ops.apply_rotary(queries, positions, theta=10000.0)
        keys = attention_ops.apply_rotary(keys, positions, theta=10000.0)
        context = attention_ops.scaled_dot_product_attention(queries, keys, values,
                                                             is_causal=True)
        return x + att.out_proj(context.transpose(1, 2).reshape(b, t, att.d_out))


class Tensors(nn.Module):
    """Holds the reference tensors as attributes a C++ program reads with attr()."""

    def __init__(self, tensors):
        super().__init__()
        for name, tensor in tensors.items():
            self.register_buffer(name, tensor)


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(123)
    model = RotaryAttentionBlock(d_model=128, num_heads=8, num_kv_heads=2, context_length=512)
    x = torch.randn(2, 300, 128, requires_grad=True)
    y = model(x)
    (grad,) = torch.autograd.grad(y.square().sum(), x)
    torch.jit.script(model).save(os.path.join(out_dir, "model.pt"))
    holder = Tensors({"input": x.detach(), "output": y.detach(), "input_grad": grad})
    torch.jit.script(holder).save(os.path.join(out_dir, "tensors.pt"))
    print(f"write_model.py: torch {torch.__version__}, output {tuple(y.shape)} in {out_dir}")


if __name__ == "__main__":
    main(sys.argv[1])
