#!/usr/bin/python3
"""Trains a small version of the book's GPT on the repository's own documentation (characters as
tokens) and saves what the C++ example reads, into OUT_DIR (default models/gpt/):

    model.pth        torch.save(model.state_dict()), the book's parameter names
    config.json      the model's sizes and its vocabulary
    generation.pt    a prompt, the tokens Python's greedy generation makes from it, and the logits
                     of every step (a plain dict of tensors)

    examples/gpt/train.py [--steps N] [OUT_DIR]      # about a minute on two cores
    examples/gpt/train.py --bench [OUT_DIR]         # Python's tokens per second on the saved model
"""

import argparse
import glob
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
CONFIG = {"context_length": 64, "emb_dim": 64, "n_heads": 4, "n_layers": 2, "drop_rate": 0.1,
          "qkv_bias": False}
PROMPT = "Every forward is "
NEW_TOKENS = 40


def corpus():
    files = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    return "\n".join(open(f, encoding="utf-8").read() for f in files)


def train(out, steps):
    text = corpus()
    vocab = "".join(sorted(set(text)))
    cfg = dict(CONFIG, vocab_size=len(vocab))
    data = torch.tensor([vocab.index(c) for c in text])
    torch.manual_seed(123)
    model = gpt.GPTModel(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    n, batch = cfg["context_length"], 16
    start = time.perf_counter()
    for step in range(steps):
        rows = torch.randint(0, len(data) - n - 1, (batch,))
        x = torch.stack([data[r:r + n] for r in rows])
        y = torch.stack([data[r + 1:r + n + 1] for r in rows])
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"step {step}: loss {loss.item():.3f} ({time.perf_counter() - start:.0f} s)")
    model.eval()
    torch.save(model.state_dict(), os.path.join(out, "model.pth"))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(dict(cfg, vocab=vocab, prompt=PROMPT, new_tokens=NEW_TOKENS), f, indent=1)
        f.write("\n")
    prompt = torch.tensor([[vocab.index(c) for c in PROMPT]])
    simple = gpt.generate_text_simple(model, prompt, NEW_TOKENS, cfg["context_length"])
    cached, logits = gpt.generate_cached(model, prompt, NEW_TOKENS)
    assert torch.equal(simple, cached), "cached and uncached generation differ"
    torch.save({"prompt": prompt, "tokens": simple, "logits": logits},
               os.path.join(out, "generation.pt"))
    print("generated:", repr("".join(vocab[i] for i in simple[0].tolist())))


def load_model(out):
    """The config and the trained model saved in `out`, in evaluation mode."""
    with open(os.path.join(out, "config.json")) as f:
        cfg = json.load(f)
    model = gpt.GPTModel(cfg)
    model.load_state_dict(torch.load(os.path.join(out, "model.pth"), weights_only=True))
    model.eval()
    return cfg, model


def best_seconds(run):
    """The fastest of five runs after one to warm up."""
    run()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def bench(out):
    torch.set_num_threads(1)  # as the C++ example measures
    cfg, model = load_model(out)
    prompt = torch.tensor([[cfg["vocab"].index(c) for c in cfg["prompt"]]])
    n = cfg["context_length"] - prompt.shape[1]
    for name, run in (("python.simple", lambda: gpt.generate_text_simple(model, prompt, n,
                                                                          cfg["context_length"])),
                      ("python.cached", lambda: gpt.generate_cached(model, prompt, n))):
        best = best_seconds(run)
        print(json.dumps({"generation": name, "threads": torch.get_num_threads(), "tokens": n,
                          "tokens_per_s": round(n / best, 1)}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=os.path.join(ROOT, "models", "gpt"))
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--bench", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    bench(args.out) if args.bench else train(args.out, args.steps)


if __name__ == "__main__":
    main()
