#!/usr/bin/python3
"""The Python half of the example: trains nothing, but saves a MultiHeadAttentionWrapper's
weights as users save them: torch.save(model.state_dict()) and TorchScript. usage: save_weights.py OUT_DIR"""

import os
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "scripts"))
import reference  # noqa: E402

out = sys.argv[1]
torch.manual_seed(7)
mha = reference.MultiHeadAttentionWrapper(d_in=8, d_out_kq=4, d_out_v=3, num_heads=3)
torch.jit.save(torch.jit.script(mha), os.path.join(out, "mha.pt"))
torch.save(mha.state_dict(), os.path.join(out, "mha_state_dict.pt"))
print(f"saved {len(mha.state_dict())} tensors to {out}")
