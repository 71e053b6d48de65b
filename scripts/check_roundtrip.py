#!/usr/bin/python3
"""Reads the weight files (state dict and safetensors) that tests/roundtrip_writer.cpp wrote into DIR, loads each into the
Python reference module, and compares with the same module seeded and shifted here. Exit 1 on
any difference."""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The parity kit's package holds the safetensors reader and writer.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
import reference  # noqa: E402
from attention_parity import safetensors_io  # noqa: E402

# The seeds and constructor arguments of tests/roundtrip_writer.cpp.
MODULES = {
    "SelfAttention": (1, dict(d_in=5, d_out_kq=3, d_out_v=4)),
    "MultiHeadAttentionWrapper": (2, dict(d_in=4, d_out_kq=2, d_out_v=3, num_heads=3)),
    "CausalSelfAttention": (3, dict(d_in=6, d_out_kq=4, d_out_v=2)),
    "CrossAttention": (4, dict(d_in=3, d_out_kq=2, d_out_v=5, d_in_kv=7)),
}


def main(directory):
    failures = 0
    for name, (seed, args) in MODULES.items():
        expected = reference.build(name, args, seed, torch.float32)
        with torch.no_grad():
            for p in expected.parameters():
                p.add_(0.5)
        # save_weights writes what torch.save(module.state_dict()) writes: torch.load's
        # weights_only mode (the default from PyTorch 2.6) reads it.
        for file, read in ((f"{name}.pt", lambda p: torch.load(p, weights_only=True)),
                           (f"{name}.safetensors", safetensors_io.load)):
            loaded = reference.MODULES[name](**args)
            loaded.load_state_dict(read(os.path.join(directory, file)))
            for (key, a), (_, b) in zip(expected.state_dict().items(), loaded.state_dict().items()):
                if not torch.equal(a, b):
                    print(f"round trip {file}: {key} differs")
                    failures += 1
            print(f"round trip {file}: {len(loaded.state_dict())} tensors read back")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
