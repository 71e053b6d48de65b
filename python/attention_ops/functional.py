"""The operators as Python functions: the same arguments as torch.ops.attention.*, documented
in Python's terms. Each is a plain call of its operator, so TorchScript scripts it and
torch.compile traces it."""

from typing import Optional

import torch


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: Optional[torch.Tensor] = None,
                                 is_causal: bool = False,
                                 causal_alignment: str = "bottom_right",
                                 window_left: Optional[int] = None,
                                 window_right: Optional[int] = None,
                                 alibi_slopes: Optional[torch.Tensor] = None,
                                 softcap: Optional[float] = None,
                                 sinks: Optional[torch.Tensor] = None,
                                 scale: Optional[float] = None, dropout_p: float = 0.0,
                                 backend: str = "auto", block_size: int = 256) -> torch.Tensor:
    """softmax(Q K^T * scale + mask) V: torch.ops.attention.scaled_dot_product_attention.

    query (..., H, Tq, d), key (..., Hkv, Tk, d), value (..., Hkv, Tk, dv): H a multiple of Hkv
    (grouped-query attention). Returns (..., H, Tq, dv).

    attn_mask: bool, True = masked out (the opposite of torch.nn.functional's), or a float mask
    added to the scaled scores; broadcastable to (..., H, Tq, Tk).
    is_causal with causal_alignment "bottom_right" (query i at position i + Tk - Tq) or
    "top_left" (query i at position i, torch.nn.functional's). window_left / window_right:
    a sliding window of keys pos(i) - window_left .. pos(i) + window_right. alibi_slopes (H,),
    softcap (Gemma 2), sinks (H,) logits joining each softmax normalizer (gpt-oss), scale
    (default 1/sqrt(d)), dropout_p on the attention weights (the math backend's).
    backend: "auto", "math", "chunked" (the fused CPU kernels) or "native" (LibTorch's).

    Gradients: on the CPU in float, double or bfloat16 (backend "auto" or "chunked", no dropout)
    the backward is the fused CPU backward; otherwise LibTorch's ops differentiate the math.
    Bad arguments raise ValueError or TypeError naming the operator.
    """
    return torch.ops.attention.scaled_dot_product_attention(
        query, key, value, attn_mask, is_causal, causal_alignment=causal_alignment,
        window_left=window_left, window_right=window_right, alibi_slopes=alibi_slopes,
        softcap=softcap, sinks=sinks, scale=scale, dropout_p=dropout_p, backend=backend,
        block_size=block_size)


def varlen_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                     is_causal: bool = False, causal_alignment: str = "bottom_right",
                     window_left: Optional[int] = None, window_right: Optional[int] = None,
                     alibi_slopes: Optional[torch.Tensor] = None,
                     softcap: Optional[float] = None, sinks: Optional[torch.Tensor] = None,
                     scale: Optional[float] = None, dropout_p: float = 0.0,
                     backend: str = "auto", block_size: int = 256) -> torch.Tensor:
    """Sequences of different lengths packed without padding (flash_attn_varlen_func's layout):
    query (total_q, H, d), key (total_k, Hkv, d), value (total_k, Hkv, dv); sequence s holds the
    rows cu_seqlens_q[s]:cu_seqlens_q[s + 1] of the queries and cu_seqlens_k[s]:cu_seqlens_k[s + 1]
    of the keys (int32 or int64 offsets, S + 1 of them, from 0). Returns (total_q, H, dv), each
    sequence's rows what scaled_dot_product_attention gives for it alone. The options hold per
    sequence; there is no attn_mask."""
    return torch.ops.attention.varlen_attention(
        query, key, value, cu_seqlens_q, cu_seqlens_k, is_causal,
        causal_alignment=causal_alignment, window_left=window_left, window_right=window_right,
        alibi_slopes=alibi_slopes, softcap=softcap, sinks=sinks, scale=scale,
        dropout_p=dropout_p, backend=backend, block_size=block_size)


def apply_rotary(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0,
                 rotary_dim: int = 0, layout: str = "half_split") -> torch.Tensor:
    """Rotary position embeddings: x (..., T, d) rotated by its tokens' integer positions (T,);
    the first rotary_dim features (0: all) in pairs "half_split" (Llama, Hugging Face's
    rotate_half) or "interleaved" (GPT-J)."""
    return torch.ops.attention.apply_rotary(x, positions, theta=theta, rotary_dim=rotary_dim,
                                            layout=layout)
