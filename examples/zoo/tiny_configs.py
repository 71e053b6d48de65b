"""One small config per family of book_zoo.py, the prompt, and the seeded model the C++ example
decoder loads (write_models.py writes it; check_against_book.py compares it with the book).

The sizes follow the book's own tiny test configs (ch05/*/tests: vocabulary 100, emb_dim 32,
4 heads, hidden_dim 64, context 64) with the values changed where that exercises what a family
has that the others do not:
  - grouped-query attention everywhere (2 key/value heads for 4 query heads);
  - head_dim 12 != emb_dim / n_heads = 8 where the family has a head_dim (Qwen3.5: 16; Gemma 4:
    12 on sliding layers, 16 on full ones). 12^-0.5 is not a power of two, so whether the
    attention scale multiplies the queries or the scores, or divides, shows in the bits;
  - Gemma 3: query_pre_attn_scalar 20 != head_dim (as in Gemma 3 27B: 168 for 128);
  - sliding and full layers both present, with a window of 4 < prompt + generated tokens (16);
  - Llama 3 frequency scaling with all three bands in use (hd 8, base 5e5, factor 8, 8192);
  - OLMo 3 YaRN with factor 8 over 8192 positions: its correction range [1, 4] splits the 6
    frequencies into original, blended and interpolated ones; cos/sin times the real 1.2079;
  - Qwen3.5: partial rotary 0.25 of head_dim 16 (r = 4), gated attention, three Gated DeltaNet
    layers with 2 key heads for 4 value heads (repeated) and dk 8 != dv 16, conv kernel 4;
  - Gemma 4: per-layer inputs (P = 8), two KV-shared layers (a sliding one reading layer 0, a
    full one reading layer 1) with double-wide feed-forwards, proportional rotary on full
    layers (2 of 8 frequency pairs rotate), softcap 30, tied head;
  - Tiny Aya: tied head (as the real config), interleaved rotary on sliding layers only,
    logit_scale 0.5 (1.0 in the real config, which would not show a missing multiply).
Token-id keys (bos, eos, pad) are left out, except Gemma 4's pad_token_id, which the model uses
(embedding padding_idx): generation here never stops early.
"""

import torch

import book_zoo

# The seed of each family's model: 123, except where that gives a tie between the two largest
# logits in a bfloat16 greedy step (Gemma 3) or a sequence of few distinct tokens (Tiny Aya).
SEEDS = {"gemma3": 0, "tiny_aya": 17}
DEFAULT_SEED = 123
PROMPT = [5, 17, 42, 8, 91, 33]
NEW_TOKENS = 10

S, F, L = "sliding_attention", "full_attention", "linear_attention"
_BASE = {"vocab_size": 100, "context_length": 64, "emb_dim": 32, "n_heads": 4, "hidden_dim": 64}

CONFIGS = {
    "llama32": {**_BASE, "n_layers": 2, "n_kv_groups": 2, "rope_base": 500_000.0,
                "rope_freq": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_context_length": 8192}},
    "qwen3": {**_BASE, "n_layers": 2, "head_dim": 12, "qk_norm": True, "n_kv_groups": 2,
              "rope_base": 1_000_000.0},
    "gemma3": {**_BASE, "n_layers": 3, "head_dim": 12, "qk_norm": True, "n_kv_groups": 2,
               "rope_local_base": 10_000.0, "rope_base": 1_000_000.0, "sliding_window": 4,
               "layer_types": [S, S, F], "query_pre_attn_scalar": 20},
    "olmo3": {**_BASE, "n_layers": 3, "head_dim": 12, "n_kv_heads": 2, "attention_bias": False,
              "attention_dropout": 0.0, "sliding_window": 4, "layer_types": [S, S, F],
              "rope_base": 500_000.0, "rope_attention_factor": 1.2079441541679836,
              "rope_type": "yarn", "rope_factor": 8.0, "rope_orig_max": 8192, "beta_fast": 32.0,
              "beta_slow": 1.0, "rms_norm_eps": 1e-6},
    "tiny_aya": {**_BASE, "n_layers": 3, "head_dim": 12, "n_kv_heads": 2, "attention_bias": False,
                 "attention_dropout": 0.0, "sliding_window": 4, "layer_types": [S, S, F],
                 "rope_base": 50_000.0, "layer_norm_eps": 1e-5, "logit_scale": 0.5,
                 "tie_word_embeddings": True},
    "qwen3_5": {**_BASE, "n_layers": 4, "head_dim": 16, "qk_norm": True, "n_kv_groups": 2,
                "rope_base": 10_000_000.0, "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-6,
                "linear_conv_kernel_dim": 4, "linear_key_head_dim": 8,
                "linear_value_head_dim": 16, "linear_num_key_heads": 2,
                "linear_num_value_heads": 4, "layer_types": [L, L, L, F]},
    "gemma4": {**_BASE, "vocab_size_per_layer_input": 100, "n_layers": 4, "head_dim": 12,
               "n_kv_heads": 2, "num_global_kv_heads": None, "global_head_dim": 16,
               "sliding_window": 4, "layer_types": [S, F, S, F], "hidden_size_per_layer_input": 8,
               "num_kv_shared_layers": 2, "use_double_wide_mlp": True, "attention_k_eq_v": False,
               "rope_local_base": 10_000.0, "rope_local_type": "default",
               "rope_global_base": 1_000_000.0, "rope_global_type": "proportional",
               "rope_global_partial_rotary_factor": 0.25, "layer_norm_eps": 1e-6,
               "final_logit_softcap": 30.0, "tie_word_embeddings": True, "pad_token_id": 0},
}

# A tied head with the book's init (embeddings N(0, 1)) makes greedy decoding repeat the last
# prompt token: the residual stream stays close to that token's embedding, whose dot product
# with itself wins. Scaling the embedding down after construction (by a power of two, exact in
# bfloat16 too) lets the layers decide. Tiny Aya still tends to emit a token twice in a row.
EMBEDDING_SCALE = {"tiny_aya": 1 / 32, "gemma4": 1 / 16}


def config(family, dtype=torch.float32):
    """The family's tiny config with cfg["dtype"] set (a fresh copy)."""
    cfg = {k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v)
           for k, v in CONFIGS[family].items()}
    cfg["dtype"] = dtype
    return cfg


def adjust(family, model):
    """What is done to a freshly seeded model before it is used (see EMBEDDING_SCALE)."""
    if family in EMBEDDING_SCALE:
        with torch.no_grad():
            model.tok_emb.weight.mul_(EMBEDDING_SCALE[family])
    return model


def seed(family):
    return SEEDS.get(family, DEFAULT_SEED)


def seeded_model(family, dtype=torch.float32, seed_=None):
    """torch.manual_seed(the family's seed), the stand-in built in `dtype` (so a bfloat16 model
    draws its init in bfloat16, as the book's does), then adjust()."""
    torch.manual_seed(seed(family) if seed_ is None else seed_)
    return adjust(family, book_zoo.build(family, config(family, dtype))).eval()


def prompt():
    return torch.tensor([PROMPT], dtype=torch.long)
