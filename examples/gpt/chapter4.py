#!/usr/bin/python3
"""Writes the book's GPT with each attention mechanism of the book's chapter 4, seeded and
untrained, with Python's greedy generation from it, for the C++ example to match (examples/gpt
main.cpp): one folder per mechanism in OUT_DIR, as train.py writes models/gpt/.

    examples/gpt/chapter4.py OUT_DIR [MECHANISM...]      # default: all of gpt.ATTENTIONS but mha

Untrained weights make text of no meaning, but every step's logits and token still depend on every
weight; the generation runs without a cache (the book's generate_text_simple), so the C++ side's
decoding through its caches and states answers to the whole forward of the book's classes.
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
# The trained model's sizes and vocabulary, and each mechanism's own sizes: small enough that
# DSA's top-k leaves out keys and KV sharing has more than one producing layer.
SIZES = {
    "gated": {},
    "mla": {"latent_dim": 16},
    "deltanet": {},
    "dsa": {"index_n_heads": 2, "index_head_dim": 16, "topk": 8},
    "kv_sharing": {"n_layers": 4, "n_kv_producing_layers": 2},
}
SEED = 4900


def write(out, mechanism, seed):
    with open(os.path.join(ROOT, "models", "gpt", "config.json")) as f:
        trained = json.load(f)
    cfg = dict(trained, attention=mechanism, **SIZES[mechanism])
    torch.manual_seed(seed)
    model = gpt.GPTModel(cfg)
    model.eval()
    os.makedirs(out, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(out, "model.pth"))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
        f.write("\n")
    prompt = torch.tensor([[cfg["vocab"].index(c) for c in cfg["prompt"]]])
    tokens, logits = gpt.generate_simple_with_logits(model, prompt, cfg["new_tokens"],
                                                     cfg["context_length"])
    torch.save({"prompt": prompt, "tokens": tokens, "logits": logits},
               os.path.join(out, "generation.pt"))
    print(f"{mechanism}: {''.join(cfg['vocab'][i] for i in tokens[0].tolist())!r}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("mechanisms", nargs="*", default=list(SIZES),
                        help=f"any of {', '.join(SIZES)}")
    args = parser.parse_args()
    unknown = set(args.mechanisms) - set(SIZES)
    if unknown:
        parser.error(f"unknown mechanism(s) {', '.join(sorted(unknown))}; "
                     f"expected any of {', '.join(SIZES)}")
    for i, mechanism in enumerate(SIZES):
        if mechanism in args.mechanisms:
            write(os.path.join(args.out, mechanism), mechanism, SEED + i)


if __name__ == "__main__":
    main()
