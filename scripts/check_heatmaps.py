#!/usr/bin/python3
"""Checks the heatmaps of `attention-demo --heatmap DIR`: each SVG is well-formed XML, has one cell
per attention weight, and every cell's data-value equals the weight that the Python reference
modules compute for the article (same seeds, computed here independently). Exit 1 otherwise."""

import os
import sys
import xml.etree.ElementTree as ET

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_golden  # noqa: E402  (the article's embedding)
import reference  # noqa: E402

SVG = "{http://www.w3.org/2000/svg}"


def weights(x_q, x_kv, m, causal=False):
    scores = (x_q @ m.W_query) @ (x_kv @ m.W_key).T / m.W_query.shape[1] ** 0.5
    if causal:
        t = scores.shape[0]
        scores = scores.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), -torch.inf)
    return torch.softmax(scores, dim=-1)


def expected():
    x = make_golden.article_embedding()
    out = {}
    with torch.no_grad():
        torch.manual_seed(123)
        out["self_attention.svg"] = weights(x, x, reference.SelfAttention(3, 2, 4))
        torch.manual_seed(123)
        wrapper = reference.MultiHeadAttentionWrapper(3, 2, 1, 4)
        for h, head in enumerate(wrapper.heads):
            out[f"wrapper_head_{h}.svg"] = weights(x, x, head)
        torch.manual_seed(123)
        out["causal_attention.svg"] = weights(x, x, reference.CausalSelfAttention(3, 2, 4), True)
        torch.manual_seed(123)
        cross = reference.CrossAttention(3, 2, 4)
        out["cross_attention.svg"] = weights(x, torch.rand(8, 3), cross)
    return out


def main(directory):
    failures = 0
    for name, w in expected().items():
        root = ET.parse(os.path.join(directory, name)).getroot()  # raises if not well-formed
        cells = [r for r in root.iter(f"{SVG}rect") if "data-value" in r.attrib]
        got = torch.zeros_like(w, dtype=torch.float64)
        for r in cells:
            got[int(r.attrib["data-row"]), int(r.attrib["data-column"])] = float(r.attrib["data-value"])
        diff = (got - w.double()).abs().max().item()
        ok = len(cells) == w.numel() and diff < 1e-5
        failures += not ok
        print(f"heatmap {name}: {len(cells)} cells, max |diff| {diff:.2e}: {'ok' if ok else 'WRONG'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
