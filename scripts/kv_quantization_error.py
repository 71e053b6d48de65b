"""How far 8-bit keys and values move attention, on the book's GPT that examples/gpt/train.py
trained (models/gpt): the keys and values of every layer over the 16 serving prompts' text, each
quantized as the 8-bit cache keeps them (a scale per token and head, max|x| / 127) and, for the
keys, per channel (a scale per feature over the whole sequence: KIVI's choice, at its best, since
an append-only cache would have to fix the scales before the later tokens arrive). Prints the
attention output's largest error against the float keys and values, relative to the largest
output, for each choice.

    /usr/bin/python3 scripts/kv_quantization_error.py [MODEL_DIR]
"""

import os
import sys

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "examples", "gpt"))
import train  # noqa: E402


def per_row(x):
    """Codes times scales, a scale per row (the last dim): the 8-bit cache's format."""
    scale = x.abs().amax(-1, keepdim=True) / 127.0
    return torch.where(scale > 0, torch.round(x / scale).clamp(-127, 127) * scale,
                       torch.zeros_like(x))


def per_channel(x):
    """A scale per feature over the tokens (dim -2)."""
    return per_row(x.transpose(-1, -2)).transpose(-1, -2)


def attention(q, k, v):
    t = q.shape[-2]
    hidden = torch.ones(t, t, dtype=torch.bool).triu(1)
    scores = (q @ k.transpose(-1, -2)).masked_fill(hidden, -torch.inf) / q.shape[-1] ** 0.5
    return torch.softmax(scores, dim=-1) @ v


def main():
    cfg, model = train.load_model(sys.argv[1] if len(sys.argv) > 1 else
                                  os.path.join(ROOT, "models", "gpt"))
    torch.manual_seed(41)
    text = torch.randint(0, cfg["vocab_size"], (16, cfg["context_length"]))
    captured = []
    for block in model.trf_blocks:
        block.norm1.register_forward_hook(lambda _m, _i, out: captured.append(out))
    with torch.no_grad():
        model(text)
        for layer, (block, x) in enumerate(zip(model.trf_blocks, captured)):
            att = block.att
            b, t, _ = x.shape
            split = lambda y: y.view(b, t, att.num_heads, att.head_dim).transpose(1, 2)  # noqa
            q, k, v = (split(w(x)).double() for w in (att.W_query, att.W_key, att.W_value))
            compare(f"layer {layer}", q, k, v)
    # Keys with two channels 8 times larger than the rest, as large trained models' keys have.
    q, k, v = torch.randn(3, 16, 4, 64, 16, dtype=torch.double)
    k[..., :2] *= 8.0
    compare("random keys with large channels", q, k, v)


def compare(what, q, k, v):
    exact = attention(q, k, v)
    largest = exact.abs().max().item()
    for name, keys in (("per token", per_row(k)), ("per channel", per_channel(k))):
        for values_name, values in (("values per token", per_row(v)), ("values exact", v)):
            error = (attention(q, keys, values) - exact).abs().max().item()
            print(f"{what}: keys {name}, {values_name}: largest error {error / largest:.5f} of "
                  f"the largest output")


if __name__ == "__main__":
    main()
