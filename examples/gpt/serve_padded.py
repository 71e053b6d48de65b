#!/usr/bin/python3
"""Serves the requests of gpt-serve the way a Python program does today without continuous
batching: the prompts of a batch left-padded to the longest, a padding mask and per-row positions,
the whole batch generating greedily with a key/value cache until its longest request is done
(static batching). Checks every request's tokens against the same request generated alone
(gpt.generate_cached), and reports tokens per second, one thread, against one request at a time.

    gpt-serve models/gpt --save-requests requests.json
    examples/gpt/serve_padded.py requests.json [MODEL_DIR] [--batch-sizes 16,4]
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt  # noqa: E402
from train import best_seconds, load_model  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def generate_padded(model, prompts, new_tokens, context_length):
    """Greedy generation for a batch of prompts of different lengths, left-padded: each row's
    padding is masked out of every query's keys and its positions start at its first real token.
    Every row runs until the longest request is done (a row whose request is done runs on at the
    last position of the context); returns each request's own tokens."""
    b, longest, steps = len(prompts), max(len(p) for p in prompts), max(new_tokens)
    pads = torch.tensor([longest - len(p) for p in prompts])
    idx = torch.zeros(b, longest, dtype=torch.long)
    for i, p in enumerate(prompts):
        idx[i, pads[i]:] = torch.tensor(p)
    columns = torch.arange(longest + steps)
    real = columns[None, :] >= pads[:, None]  # (B, columns): which columns hold a row's tokens
    caches = [[] for _ in model.trf_blocks]
    generated = []
    with torch.no_grad():
        causal = torch.ones(longest, longest, dtype=torch.bool).tril()
        # A padding query sees itself alone, so that no row of scores is -inf throughout.
        visible = (causal & real[:, None, :longest]) | torch.eye(longest, dtype=torch.bool)
        positions = (columns[:longest][None, :] - pads[:, None]).clamp(min=0)
        logits = model(idx, caches, positions=positions, visible=visible[:, None])[:, -1]
        for step in range(steps):
            token = logits.argmax(-1, keepdim=True)
            generated.append(token)
            if step + 1 < steps:  # the last token needs no logits of its own
                column = longest + step
                positions = (column - pads[:, None]).clamp(max=context_length - 1)
                logits = model(token, caches, positions=positions,
                               visible=real[:, None, None, :column + 1])[:, -1]
    tokens = torch.cat(generated, dim=1)
    return [tokens[i, :n].tolist() for i, n in enumerate(new_tokens)]


def serve_padded(model, requests, batch_size, context_length):
    """The requests in order of arrival, batch_size at a time."""
    out = []
    for start in range(0, len(requests), batch_size):
        batch = requests[start:start + batch_size]
        out += generate_padded(model, [r["prompt"] for r in batch],
                               [r["new_tokens"] for r in batch], context_length)
    return out


def one_at_a_time(model, requests):
    out = []
    for r in requests:
        tokens, _ = gpt.generate_cached(model, torch.tensor([r["prompt"]]), r["new_tokens"])
        out.append(tokens[0, len(r["prompt"]):].tolist())
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("requests", help="the JSON that gpt-serve --save-requests writes")
    parser.add_argument("model", nargs="?", default=os.path.join(ROOT, "models", "gpt"))
    parser.add_argument("--batch-sizes", default="16,4")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as gpt-serve measures
    cfg, model = load_model(args.model)
    with open(args.requests) as f:
        requests = json.load(f)["requests"]

    alone = one_at_a_time(model, requests)
    same_as_cpp = sum(a == r["tokens"] for a, r in zip(alone, requests))
    print(f"torch {torch.__version__}: alone, {same_as_cpp} of {len(requests)} requests get "
          "gpt-serve's tokens")
    failed = False
    runs = [("python.cached.one_at_a_time", lambda: one_at_a_time(model, requests))]
    for size in (int(s) for s in args.batch_sizes.split(",")):
        tokens = serve_padded(model, requests, size, cfg["context_length"])
        same = sum(t == a for t, a in zip(tokens, alone))
        print(f"padded batches of {size}: {same} of {len(requests)} requests get the tokens they "
              "get alone")
        failed |= same != len(requests)
        runs.append((f"python.padded.batch{size}",
                     lambda size=size: serve_padded(model, requests, size, cfg["context_length"])))
    n = sum(r["new_tokens"] for r in requests)
    for name, run in runs:
        seconds = best_seconds(run)
        print(json.dumps({"generation": name, "torch": torch.__version__,
                          "threads": torch.get_num_threads(), "requests": len(requests),
                          "tokens": n, "seconds": round(seconds, 4),
                          "tokens_per_s": round(n / seconds, 1)}))
    if failed:
        sys.exit("serve_padded.py: padded generation differs from generation alone")


if __name__ == "__main__":
    main()
