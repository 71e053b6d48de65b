#!/usr/bin/python3
"""The Python side of scripts/bench_load.sh.

    bench_load.py write DIR D     # model.pth (torch.save(model.state_dict())) and model.safetensors
    bench_load.py load FILE D     # three loads, one JSON line each: time and peak memory
"""

import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The parity kit's package holds the safetensors reader and writer.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
import reference  # noqa: E402
from attention_parity import safetensors_io  # noqa: E402


def model(d):
    torch.manual_seed(0)
    return reference.MultiHeadAttention(d, d, 0, 0.0, 32, qkv_bias=True)


def status_mib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return -1.0


def main():
    command, target, d = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if command == "write":
        m = model(d)
        torch.save(m.state_dict(), os.path.join(target, "model.pth"))
        safetensors_io.save(dict(m.state_dict()), os.path.join(target, "model.safetensors"))
        return
    m = model(d)
    read = safetensors_io.load if target.endswith(".safetensors") else (
        lambda p: torch.load(p, weights_only=True))
    for _ in range(3):
        before = status_mib("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        start = time.perf_counter()
        m.load_state_dict(read(target))
        ms = (time.perf_counter() - start) * 1e3
        print(json.dumps({"side": "python", "file": os.path.basename(target), "load_ms": round(ms, 1),
                          "rss_before_mib": round(before, 1),
                          "peak_rss_mib": round(status_mib("VmHWM"), 1)}))


if __name__ == "__main__":
    main()
