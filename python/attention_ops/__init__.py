"""The attention-cpp kernels as PyTorch operators, for Python, TorchScript and torch.compile.

Loading this package loads libattention_ops (the library's operators, registered as
torch.ops.attention.*) into the process. It looks, in order, at the path in the environment
variable ATTENTION_OPS_LIBRARY, in the package's own folder (where `pip install` puts it),
beside the CMake-installed package (PREFIX/lib*/ or PREFIX/lib/*/, the package being in
PREFIX/share/attention/python/), and in the source tree's build/ folder.

    import torch, attention_ops
    q = torch.randn(2, 12, 1024, 64, requires_grad=True)
    k = torch.randn(2, 4, 1024, 64, requires_grad=True)    # 4 key/value heads (GQA)
    v = torch.randn(2, 4, 1024, 64, requires_grad=True)
    out = attention_ops.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.sum().backward()     # the fused CPU backward

Conventions are the C++ library's, not torch.nn.functional's: in a bool attn_mask True means
masked out (hidden), and with is_causal and fewer queries than keys the queries are the last of
the keys' positions (causal_alignment="bottom_right", as when new tokens attend to a cache).
"""

import glob
import os

import torch

LIBRARY_VARIABLE = "ATTENTION_OPS_LIBRARY"
LIBRARY_NAME = "libattention_ops.so"


def _candidates():
    here = os.path.dirname(os.path.abspath(__file__))
    given = os.environ.get(LIBRARY_VARIABLE)
    if given:
        return [given]
    own = os.path.join(here, LIBRARY_NAME)
    prefix = os.path.normpath(os.path.join(here, "..", "..", "..", ".."))
    installed = sorted(glob.glob(os.path.join(prefix, "lib*", LIBRARY_NAME)) +
                       glob.glob(os.path.join(prefix, "lib", "*", LIBRARY_NAME)))
    source_tree = os.path.join(here, "..", "..", "build", LIBRARY_NAME)
    return [own] + installed + [source_tree]


def library_path():
    """The libattention_ops this package loads (the first candidate that exists)."""
    candidates = _candidates()
    for path in candidates:
        if os.path.isfile(path):
            return os.path.abspath(path)
    raise ImportError(
        "attention_ops: libattention_ops.so not found; looked at " + ", ".join(candidates) +
        " (set " + LIBRARY_VARIABLE + " to its path)")


torch.ops.load_library(library_path())

from .functional import apply_rotary, scaled_dot_product_attention, varlen_attention  # noqa: E402
from .modules import MultiHeadAttention  # noqa: E402

__all__ = ["scaled_dot_product_attention", "varlen_attention", "apply_rotary",
           "MultiHeadAttention", "library_path"]
