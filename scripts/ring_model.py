"""The scaling model of ring attention, fed with the per-step compute time that
scripts/bench_ring.sh measured (docs/bench/ring.jsonl).

Per ring step a rank computes its T/W queries against one block of T/W keys (half of the pairs
visible under the balanced causal split) and meanwhile sends one key/value block of
B x Hkv x T/W x (d + dv) values. The transfer hides behind the compute when the link carries
bytes / t_compute; then a forward takes W steps of t_compute. t_compute grows as (T/W)^2, so it
is scaled from the measured step by the ratio of work (B x H x (T/W)^2 x d).

    /usr/bin/python3 scripts/ring_model.py [docs/bench/ring.jsonl]
"""

import json
import sys

# The configurations of the model: the article's (Raschka's GPT-2 size) and a long context.
CONFIGS = [
    ("Raschka: B=8, T=1024, H=12, d=64", dict(b=8, t=1024, h=12, hkv=12, d=64)),
    ("long context: B=1, T=131072, H=8, d=64", dict(b=1, t=131072, h=8, hkv=8, d=64)),
]
RANKS = [8, 64, 512]
BYTES = 4  # float32


def measured_rate(path):
    """Seconds per unit of work (B x H x Tl^2 x d) of one step, from the largest measured run."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    forward = [r for r in rows if not r["backward"]]
    best = max(forward, key=lambda r: r["length"] // r["ranks"])
    local = best["length"] // best["ranks"]
    work = 1 * 2 * local * local * 64  # the benchmark's B=1, H=2, d=64
    return best["step_compute_s"] / work, best


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "docs/bench/ring.jsonl"
    per_work, source = measured_rate(path)
    print(f"measured: {source['step_compute_s'] * 1e3:.1f} ms per step at T={source['length']}, "
          f"W={source['ranks']} (B=1, H=2, d=64, one thread): "
          f"{per_work * 1e12:.2f} ps per unit of B*H*Tl^2*d work")
    print()
    print("| configuration | W | T/W | compute per step | block sent per step | "
          "link needed to hide it | forward (W steps) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, c in CONFIGS:
        for w in RANKS:
            local = c["t"] / w
            compute = per_work * c["b"] * c["h"] * local * local * c["d"]
            sent = c["b"] * c["hkv"] * local * 2 * c["d"] * BYTES
            need = sent / compute
            print(f"| {name} | {w} | {local:g} | {compute * 1e3:.3g} ms | {sent / 2**20:.3g} MiB | "
                  f"{need / 1e9:.3g} GB/s | {w * compute * 1e3:.3g} ms |")


if __name__ == "__main__":
    main()
