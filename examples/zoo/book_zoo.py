"""Stand-ins for the model zoo of Raschka's LLMs-from-scratch (chapter 5 bonus folders, commit
28c65cd): Llama 3.2, Qwen3 (dense), Gemma 3, OLMo 3, Tiny Aya, Qwen3.5 and Gemma 4 (dense E2B
style). They are written for this repository, not copied from the book, and reproduce what the
C++ port has to match:

  - the state_dict: the same names, shapes, dtypes and order;
  - the init: the modules that draw random numbers are created in the book's order, in the book's
    dtype, so torch.manual_seed(s) before build() gives the book's weights bit for bit;
  - the forward: the same operations in the same order, with the same float32 casts (norms and
    rotary in float32, softmax in the model dtype unless a family says otherwise).

Shared building blocks: Norm (each family's RMSNorm or LayerNorm), the rotary tables (rope_*) and
rotate(), FeedForward (SwiGLU or GeGLU), Attention (grouped-query attention with per-family
options) and Block (the four norm placements). The families differ in how these are wired; each
model's docstring names the notebook it mirrors and what differs from it.

    model = build("qwen3", cfg)                      # cfg: the book's config dict for that family
    tokens, logits = generate(model, prompt_ids, 10)  # greedy, no cache, as the book's notebooks
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

# ------------------------------------------------------------------------------------------------
# Norms


class Norm(nn.Module):
    """The norm of one family, by `kind` (the family's name). All normalise over the last dim.

    kind      parameter      init  formula (u = x in float32, cast back to x's dtype at the end)
    llama32   weight (dtype) 1     torch.nn.RMSNorm: u * rsqrt(mean(u^2) + eps) * w, where only
                                   half types are upcast and w keeps the model dtype
    qwen3     scale          1     u * rsqrt(mean(u^2) + eps) * w
    gemma3    scale          0     u * rsqrt(mean(u^2) + eps) * (1 + w)
    olmo3     weight         1     w * (u * rsqrt(mean(u^2) + eps))
    tiny_aya  weight         1     LayerNorm without bias, c = u - mean(u):
                                   w * (c * rsqrt(mean(c^2) + eps))
    qwen3_5   weight         0     u * rsqrt(mean(u^2) + eps) * (1 + w)
    gemma4    weight         1     u * pow(mean(u^2) + eps, -0.5) * w
    gemma4_v  (none)               u * pow(mean(u^2) + eps, -0.5)     (Gemma 4's value norm)

    Every parameter but llama32's is float32 whatever the model dtype: the book creates them
    without a dtype. torch.nn.RMSNorm needs PyTorch 2.4; llama32 computes it as PyTorch 2.5+ does
    (the weight product before the cast back; 2.4 cast first, which is the same whenever w is
    all ones, as in a seeded model, or the dtype is float32)."""

    KINDS = {"llama32": ("weight", 1.0, False), "qwen3": ("scale", 1.0, False),
             "gemma3": ("scale", 0.0, True), "olmo3": ("weight", 1.0, False),
             "tiny_aya": ("weight", 1.0, False), "qwen3_5": ("weight", 0.0, True),
             "gemma4": ("weight", 1.0, False), "gemma4_v": (None, None, False)}

    def __init__(self, dim, kind, eps, dtype=None):
        super().__init__()
        self.kind, self.eps = kind, eps
        self.param_name, init, self.plus_one = self.KINDS[kind]
        if self.param_name:
            w = torch.full((dim,), init, dtype=dtype if kind == "llama32" else torch.float32)
            self.register_parameter(self.param_name, nn.Parameter(w))

    def forward(self, x):
        if self.kind == "llama32":
            u = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
            return (u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
                    ).type_as(x)
        u = x.float()
        if self.kind == "tiny_aya":
            u = u - u.mean(-1, keepdim=True)
        ms = u.pow(2).mean(-1, keepdim=True) + self.eps
        u = u * (torch.pow(ms, -0.5) if self.kind.startswith("gemma4") else torch.rsqrt(ms))
        if self.param_name:
            w = getattr(self, self.param_name).float()
            u = u * ((1.0 + w) if self.plus_one else w)
        return u.to(x.dtype)


class GatedRMSNorm(nn.Module):
    """Qwen3.5's output norm of the linear-attention layers, gated by z. Its weight follows the
    module's dtype, and it multiplies after the cast back (so in the model dtype):
    (w * (u * rsqrt(mean(u^2) + eps)).to(dtype) * silu(z in float32)).to(dtype)."""

    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x, gate):
        u = x.float()
        u = u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + self.eps)
        u = self.weight * u.to(x.dtype)
        return (u * F.silu(gate.float())).to(x.dtype)


# ------------------------------------------------------------------------------------------------
# Rotary position embedding. Inverse frequencies and tables are float32, computed with the same
# expressions as the book (a float base raised to a float32 tensor): the last bit depends on it.


def rope_inv_freq(n, base):
    """Plain RoPE over n rotated features: base^(-2i/n)."""
    return 1.0 / (base ** (torch.arange(0, n, 2, dtype=torch.float32)[: n // 2].float() / n))


def rope_inv_freq_llama3(head_dim, base, freq):
    """Llama 3's scaling: long wavelengths divided by `factor`, short ones kept, a smooth blend
    between original_context_length / low_freq_factor and / high_freq_factor."""
    inv = rope_inv_freq(head_dim, base)
    ctx = freq["original_context_length"]
    low, high = freq["low_freq_factor"], freq["high_freq_factor"]
    wavelen = 2 * torch.pi / inv
    scaled = torch.where(wavelen > ctx / low, inv / freq["factor"], inv)
    smooth = (ctx / wavelen - low) / (high - low)
    blended = (1 - smooth) * (inv / freq["factor"]) + smooth * inv
    medium = (wavelen <= ctx / low) & (wavelen >= ctx / high)
    return torch.where(medium, blended, scaled)


def rope_inv_freq_yarn(head_dim, base, factor, orig_max, beta_fast=32.0, beta_slow=1.0):
    """YaRN (OLMo 3): interpolated frequencies (divided by factor) below the correction range,
    the original ones above it, a linear ramp in between. OLMo's notebook never passes its
    config's beta_fast/beta_slow, so the defaults apply (they equal the config's values)."""
    pos_freqs = base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)

    def correction_dim(rotations):  # the dimension that turns `rotations` times over orig_max
        return head_dim * math.log(orig_max / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), head_dim - 1)
    if low == high:
        high += 0.001
    ramp = (torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)
    ramp = torch.clamp(ramp, 0, 1)
    extrapolation = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation


def rope_inv_freq_proportional(head_dim, base, fraction):
    """Gemma 4's full layers: the first int(fraction * head_dim // 2) frequencies with exponents
    over the whole head_dim, then zero frequencies (cos 1, sin 0: those features pass through)."""
    n = int(fraction * head_dim // 2)
    inv = 1.0 / (base ** (torch.arange(0, 2 * n, 2, dtype=torch.float32) / head_dim))
    if head_dim // 2 > n:
        inv = torch.cat([inv, torch.zeros(head_dim // 2 - n, dtype=torch.float32)])
    return inv


def rope_tables(inv_freq, context_length, interleaved=False, attention_factor=None):
    """cos and sin, (context_length, 2 * len(inv_freq)) float32. Columns are [f0..fn, f0..fn]
    (rotate-half layout) or [f0, f0, f1, f1, ...] (interleaved, Tiny Aya). YaRN multiplies both
    by its attention factor."""
    angles = torch.arange(context_length, dtype=torch.float32).unsqueeze(1) * inv_freq.unsqueeze(0)
    if interleaved:
        angles = torch.repeat_interleave(angles, 2, dim=1)
    else:
        angles = torch.cat([angles, angles], dim=1)
    cos, sin = torch.cos(angles), torch.sin(angles)
    if attention_factor is not None:
        cos, sin = cos * attention_factor, sin * attention_factor
    return cos, sin


def rotate(x, cos, sin, interleaved=False):
    """Applies the tables' first T rows to x (B, H, T, head_dim), in float32 (x times a float32
    table promotes), rounded once to x's dtype. Rotate-half pairs feature i with i + r/2 over the
    first r = table width features and passes the rest through (Qwen3.5's partial rotary);
    interleaved pairs 2i with 2i + 1."""
    t = x.shape[2]
    cos, sin = cos[:t], sin[:t]
    if interleaved:
        xf = x.float()
        turned = torch.stack((-x[..., 1::2].float(), x[..., 0::2].float()), dim=-1).flatten(-2)
        return (xf * cos + turned * sin).to(x.dtype)
    r = cos.shape[-1]
    head, rest = x[..., :r], x[..., r:]
    turned = torch.cat((-head[..., r // 2:], head[..., : r // 2]), dim=-1)
    out = head * cos + turned * sin
    if rest.shape[-1]:
        out = torch.cat([out, rest], dim=-1)
    return out.to(x.dtype)


def masks_for(t, sliding_window=None, device=None):
    """Boolean masks, True = hidden: causal (key j > query i) and, given a window W, sliding
    (also hidden when i - j >= W, so a query sees W keys, itself included)."""
    ones = torch.ones(t, t, dtype=torch.bool, device=device)
    causal = torch.triu(ones, diagonal=1)
    masks = {"full_attention": causal}
    if sliding_window is not None:
        masks["sliding_attention"] = causal | torch.triu(ones, diagonal=sliding_window).T
    return masks


# ------------------------------------------------------------------------------------------------
# Feed-forward, attention, block


class FeedForward(nn.Module):
    """down(act(gate(x)) * up(x)): SwiGLU (silu) or GeGLU (gelu, tanh approximation). The book
    names the three fc1 (gate), fc2 (up), fc3 (down); Gemma 4 uses the Hugging Face names."""

    def __init__(self, d, hidden, dtype, act="silu", names=("fc1", "fc2", "fc3")):
        super().__init__()
        self.names, self.act = names, act
        for name, (i, o) in zip(names, ((d, hidden), (d, hidden), (hidden, d))):
            setattr(self, name, nn.Linear(i, o, bias=False, dtype=dtype))

    def forward(self, x):
        gate, up, down = (getattr(self, n) for n in self.names)
        g = F.silu(gate(x)) if self.act == "silu" else F.gelu(gate(x), approximate="tanh")
        return down(g * up(x))


class Attention(nn.Module):
    """Grouped-query attention as the book's GroupedQueryAttention classes: W_query, W_key,
    W_value, out_proj (d_in -> heads * head_dim -> d_in), then the optional q_norm and k_norm.
    Query head h reads key/value head h // (heads / kv_heads) (repeat_interleave).

    kv_first     W_key and W_value are created before W_query (Llama 3.2; the init draws follow)
    gated        W_query also yields, per head, an output gate: context * sigmoid(gate) (Qwen3.5)
    qk_norm      the norm kind of q_norm and k_norm, applied per head after the split; with
                 qk_norm_flat, to the whole projection before it (OLMo 3: sizes H*hd and Hkv*hd)
    scale        ("div", s): softmax(scores / s); ("mul", s): softmax(scores * s), both after
                 masking; ("queries", s): q * s before the product, softmax(scores)
    softmax_f32  softmax in float32, cast back to q's dtype (Qwen3.5); else in the model dtype
    rope         None (no position encoding: Tiny Aya's full layers), "neox" or "interleaved";
                 applied after the QK norm to q and k
    bias         bias on all four projections (the attention_bias of OLMo 3 and Tiny Aya)"""

    def __init__(self, d_in, heads, kv_heads, head_dim, dtype, *, kv_first=False, gated=False,
                 qk_norm=None, qk_norm_flat=False, scale=None, softmax_f32=False, rope="neox",
                 bias=False):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.gated, self.qk_norm_flat, self.rope = gated, qk_norm_flat, rope
        self.scale = scale or ("div", head_dim ** 0.5)
        self.softmax_f32 = softmax_f32
        q_out, kv_out = heads * head_dim * (2 if gated else 1), kv_heads * head_dim
        order = ("W_key", "W_value", "W_query") if kv_first else ("W_query", "W_key", "W_value")
        for name in order:
            setattr(self, name, nn.Linear(d_in, q_out if name == "W_query" else kv_out, bias=bias,
                                          dtype=dtype))
        self.out_proj = nn.Linear(heads * head_dim, d_in, bias=bias, dtype=dtype)
        if qk_norm:
            self.q_norm = Norm(heads * head_dim if qk_norm_flat else head_dim, qk_norm, 1e-6)
            self.k_norm = Norm(kv_out if qk_norm_flat else head_dim, qk_norm, 1e-6)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x, mask, cos, sin):
        b, t, _ = x.shape
        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
        if self.gated:  # per head: hd query features, then hd gate features
            q, gate = q.view(b, t, self.heads, 2 * self.head_dim).chunk(2, dim=-1)
            gate = gate.reshape(b, t, self.heads * self.head_dim)
        if self.q_norm is not None and self.qk_norm_flat:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q.view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.q_norm is not None and not self.qk_norm_flat:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope:
            interleaved = self.rope == "interleaved"
            q, k = rotate(q, cos, sin, interleaved), rotate(k, cos, sin, interleaved)
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        how, s = self.scale
        if how == "queries":
            q = q * s
        scores = (q @ k.transpose(2, 3)).masked_fill(mask, -torch.inf)
        if how == "div":
            scores = scores / s
        elif how == "mul":
            scores = scores * s
        if self.softmax_f32:
            weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        else:
            weights = torch.softmax(scores, dim=-1)
        context = (weights @ v).transpose(1, 2).reshape(b, t, self.heads * self.head_dim)
        if self.gated:
            context = context * torch.sigmoid(gate)
        return self.out_proj(context)


class Block(nn.Module):
    """One decoder layer: the token mixer (`mixer_name`), the feed-forward `ff`, then the norms
    of `style`, created in that order. `kind` is the layer type (full, sliding or linear
    attention), which the model uses to pick the mask and rotary tables.

    pre       x = x + att(norm1(x));  x = x + ff(norm2(x))              Llama 3.2, Qwen3, Qwen3.5
    sandwich  x = x + post_attention_layernorm(att(input_layernorm(x)))
              x = x + post_feedforward_layernorm(ff(pre_feedforward_layernorm(x)))      Gemma 3
    post      x = x + post_attention_layernorm(att(x));  x = x + post_feedforward_layernorm(ff(x))
                                                                                         OLMo 3
    parallel  h = input_layernorm(x);  x = (x + att(h)) + ff(h)                        Tiny Aya"""

    NORMS = {"pre": ("norm1", "norm2"),
             "sandwich": ("input_layernorm", "post_attention_layernorm",
                          "pre_feedforward_layernorm", "post_feedforward_layernorm"),
             "post": ("post_attention_layernorm", "post_feedforward_layernorm"),
             "parallel": ("input_layernorm",)}

    def __init__(self, style, kind, mixer, ff, make_norm, mixer_name="att"):
        super().__init__()
        self.style, self.kind, self.mixer_name = style, kind, mixer_name
        setattr(self, mixer_name, mixer)
        self.ff = ff
        for name in self.NORMS[style]:
            setattr(self, name, make_norm())

    def forward(self, x, *mixer_args):
        def mix(h):
            return getattr(self, self.mixer_name)(h, *mixer_args)

        if self.style == "pre":
            x = x + mix(self.norm1(x))
            return x + self.ff(self.norm2(x))
        if self.style == "sandwich":
            x = x + self.post_attention_layernorm(mix(self.input_layernorm(x)))
            return x + self.post_feedforward_layernorm(self.ff(self.pre_feedforward_layernorm(x)))
        if self.style == "post":
            x = x + self.post_attention_layernorm(mix(x))
            return x + self.post_feedforward_layernorm(self.ff(x))
        h = self.input_layernorm(x)
        return x + mix(h) + self.ff(h)


# ------------------------------------------------------------------------------------------------
# The shared model skeleton


class DecoderModel(nn.Module):
    """tok_emb, the blocks (attribute `blocks_name`), final_norm and out_head, created in that
    order, then the rotary tables as non-persistent float32 buffers. Forward: embed, run each
    block with the mask and tables of its layer type, final_norm, out_head(x.to(cfg dtype)).
    Subclasses say how a block is made (make_block), what tables exist (rope_buffers) and what
    a layer of each type receives (mixer_args)."""

    blocks_name = "trf_blocks"
    norm_kind, eps_key, default_eps = None, None, 1e-6  # norms' eps: cfg[eps_key] or the default
    emb_scale = False  # Gemma 3 multiplies the embeddings by sqrt(emb_dim)

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.layer_types = list(cfg.get("layer_types") or ["full_attention"] * cfg["n_layers"])
        if len(self.layer_types) != cfg["n_layers"]:
            raise ValueError("layer_types must have n_layers entries")
        d, dtype = cfg["emb_dim"], cfg["dtype"]
        self.tok_emb = nn.Embedding(cfg["vocab_size"], d, dtype=dtype)
        setattr(self, self.blocks_name, nn.ModuleList(
            self.make_block(i, kind) for i, kind in enumerate(self.layer_types)))
        self.final_norm = self.norm(d)
        self.out_head = nn.Linear(d, cfg["vocab_size"], bias=False, dtype=dtype)
        for name, table in self.rope_buffers().items():
            self.register_buffer(name, table, persistent=False)

    def norm(self, dim):
        eps = self.cfg.get(self.eps_key, self.default_eps) if self.eps_key else self.default_eps
        return Norm(dim, self.norm_kind, eps, dtype=self.cfg["dtype"])

    def ff(self, act="silu"):
        return FeedForward(self.cfg["emb_dim"], self.cfg["hidden_dim"], self.cfg["dtype"], act)

    @property
    def head_dim(self):
        cfg = self.cfg
        return cfg.get("head_dim") or cfg["emb_dim"] // cfg["n_heads"]

    @property
    def layers(self):
        return getattr(self, self.blocks_name)

    def mixer_args(self, kind, masks, t, dtype):
        return masks[kind], self.cos, self.sin

    def forward(self, input_ids):
        x = self.tok_emb(input_ids)
        if self.emb_scale:
            x = x * (self.cfg["emb_dim"] ** 0.5)
        t = input_ids.shape[1]
        masks = masks_for(t, self.cfg.get("sliding_window"), x.device)
        for block in self.layers:
            x = block(x, *self.mixer_args(block.kind, masks, t, x.dtype))
        return self.out_head(self.final_norm(x).to(self.cfg["dtype"]))


# ------------------------------------------------------------------------------------------------
# The families


class Llama3Model(DecoderModel):
    """Llama 3.2 (ch05/07_gpt_to_llama/standalone-llama32.ipynb cells 6-10; the same classes as
    pkg/llms_from_scratch/llama3.py). head_dim = emb_dim / n_heads; W_key and W_value are created
    before W_query; torch.nn.RMSNorm (eps 1e-5, weights in the model dtype); Llama 3 frequency
    scaling (cfg["rope_freq"]); scores / sqrt(hd) after masking, softmax in the model dtype;
    pre-norm blocks; no embedding scale. Nothing is tied (the book's loader ties when a
    checkpoint has no lm_head)."""

    norm_kind, default_eps = "llama32", 1e-5

    @property
    def head_dim(self):  # always emb_dim / n_heads: a cfg["head_dim"] is ignored, as in the book
        return self.cfg["emb_dim"] // self.cfg["n_heads"]

    def make_block(self, i, kind):
        cfg = self.cfg
        att = Attention(cfg["emb_dim"], cfg["n_heads"], cfg["n_kv_groups"], self.head_dim,
                        cfg["dtype"], kv_first=True)
        return Block("pre", kind, att, self.ff(), lambda: self.norm(cfg["emb_dim"]))

    def rope_buffers(self):
        cfg = self.cfg
        inv = rope_inv_freq(self.head_dim, cfg["rope_base"])
        if cfg.get("rope_freq") is not None:
            inv = rope_inv_freq_llama3(self.head_dim, cfg["rope_base"], cfg["rope_freq"])
        cos, sin = rope_tables(inv, cfg["context_length"])
        return {"cos": cos, "sin": sin}


class Qwen3Model(DecoderModel):
    """Qwen3, dense (ch05/11_qwen3/standalone-qwen3.ipynb cells 8-13; pkg/llms_from_scratch/
    qwen3.py). Independent head_dim; optional per-head q_norm/k_norm; every RMSNorm has a float32
    `scale` (eps 1e-6); scores / sqrt(hd) after masking, softmax in the model dtype; pre-norm.
    Deviations: no mixture-of-experts feed-forward, no `shift` (bias) option of the book's
    RMSNorm (no Qwen3 config uses it)."""

    norm_kind = "qwen3"

    def make_block(self, i, kind):
        cfg = self.cfg
        att = Attention(cfg["emb_dim"], cfg["n_heads"], cfg["n_kv_groups"], self.head_dim,
                        cfg["dtype"], qk_norm="qwen3" if cfg["qk_norm"] else None)
        return Block("pre", kind, att, self.ff(), lambda: self.norm(cfg["emb_dim"]))

    def rope_buffers(self):
        cos, sin = rope_tables(rope_inv_freq(self.head_dim, self.cfg["rope_base"]),
                               self.cfg["context_length"])
        return {"cos": cos, "sin": sin}


class Gemma3Model(DecoderModel):
    """Gemma 3 (ch05/12_gemma3/standalone-gemma3.ipynb cells 8-13). Blocks are `blocks`; the
    zero-centred RMSNorm (float32 `scale`, used as 1 + scale) everywhere, sandwich placement;
    GeGLU; per-head q_norm/k_norm; queries times query_pre_attn_scalar^-0.5 before the product;
    sliding layers use the window mask and rope_local_base, full layers the causal mask and
    rope_base; embeddings times sqrt(emb_dim) (a Python float, in the model dtype). Left out:
    the norms' `shift` (bias) option, which no Gemma 3 config uses."""

    blocks_name, norm_kind, emb_scale = "blocks", "gemma3", True

    def make_block(self, i, kind):
        cfg = self.cfg
        qpas = cfg["query_pre_attn_scalar"]
        att = Attention(cfg["emb_dim"], cfg["n_heads"], cfg["n_kv_groups"], self.head_dim,
                        cfg["dtype"], qk_norm="gemma3" if cfg["qk_norm"] else None,
                        scale=("queries", (qpas if qpas is not None else self.head_dim) ** -0.5))
        return Block("sandwich", kind, att, self.ff("gelu"), lambda: self.norm(cfg["emb_dim"]))

    def rope_buffers(self):
        cfg, tables = self.cfg, {}
        for suffix, base in (("local", cfg["rope_local_base"]), ("global", cfg["rope_base"])):
            cos, sin = rope_tables(rope_inv_freq(self.head_dim, base), cfg["context_length"])
            tables.update({f"cos_{suffix}": cos, f"sin_{suffix}": sin})
        return tables

    def mixer_args(self, kind, masks, t, dtype):
        if kind == "sliding_attention":
            return masks[kind], self.cos_local, self.sin_local
        return masks[kind], self.cos_global, self.sin_global


class Olmo3Model(DecoderModel):
    """OLMo 3 (ch05/13_olmo3/standalone-olmo3.ipynb cells 9-14). Blocks are `blocks`; RMSNorm
    with a float32 `weight`; q_norm over all H*hd query features and k_norm over all Hkv*hd key
    features, before the heads are split (eps 1e-6); queries times hd^-0.5 before the product;
    post-norm blocks (no pre-norms); one rotary table for both layer types, YaRN when
    rope_type == "yarn" (cos and sin times rope_attention_factor in every case); sliding layers
    use the window mask."""

    blocks_name, norm_kind, eps_key = "blocks", "olmo3", "rms_norm_eps"

    def make_block(self, i, kind):
        cfg = self.cfg
        att = Attention(cfg["emb_dim"], cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"],
                        cfg["dtype"], qk_norm="olmo3", qk_norm_flat=True,
                        scale=("queries", cfg["head_dim"] ** -0.5), bias=cfg["attention_bias"])
        return Block("post", kind, att, self.ff(), lambda: self.norm(cfg["emb_dim"]))

    def rope_buffers(self):
        cfg, hd = self.cfg, self.cfg["head_dim"]
        if cfg["rope_type"] == "yarn":
            inv = rope_inv_freq_yarn(hd, cfg["rope_base"], cfg["rope_factor"], cfg["rope_orig_max"])
        else:
            inv = rope_inv_freq(hd, cfg["rope_base"])
        cos, sin = rope_tables(inv, cfg["context_length"],
                               attention_factor=cfg["rope_attention_factor"])
        return {"cos": cos, "sin": sin}


class TinyAyaModel(DecoderModel):
    """Tiny Aya, Cohere2 architecture (ch05/15_tiny-aya/standalone-tiny-aya.ipynb cells 9-14).
    Bias-free LayerNorm (float32 `weight`); parallel blocks with one input_layernorm; no QK norm;
    interleaved RoPE on sliding layers only (full layers have no position encoding), with the
    tables rounded to the activations' dtype first; scores / sqrt(hd) after masking, softmax in
    the model dtype; logits times logit_scale. With tie_word_embeddings the constructor ties
    out_head to tok_emb after out_head has drawn its init (so the state_dict lists both names).
    Deviation: forward takes no attention_mask (padding)."""

    norm_kind, eps_key = "tiny_aya", "layer_norm_eps"

    def __init__(self, cfg):
        super().__init__(cfg)
        self.logit_scale = cfg["logit_scale"]
        if cfg["tie_word_embeddings"]:
            self.out_head.weight = self.tok_emb.weight

    def make_block(self, i, kind):
        cfg = self.cfg
        att = Attention(cfg["emb_dim"], cfg["n_heads"], cfg["n_kv_heads"], self.head_dim,
                        cfg["dtype"], bias=cfg["attention_bias"],
                        rope="interleaved" if kind == "sliding_attention" else None)
        return Block("parallel", kind, att, self.ff(), lambda: self.norm(cfg["emb_dim"]))

    def rope_buffers(self):
        cos, sin = rope_tables(rope_inv_freq(self.head_dim, self.cfg["rope_base"]),
                               self.cfg["context_length"], interleaved=True)
        return {"cos": cos, "sin": sin}

    def mixer_args(self, kind, masks, t, dtype):
        return masks[kind], self.cos[:t].to(dtype), self.sin[:t].to(dtype)

    def forward(self, input_ids):
        return super().forward(input_ids) * self.logit_scale


class GatedDeltaNet(nn.Module):
    """Qwen3.5's linear-attention layer, Gated DeltaNet as ch05/16_qwen3.5/qwen3_5_transformers.py
    (Qwen3_5GatedDeltaNet) runs it without a cache. Created in float32, then cast to the model
    dtype as a whole (A_log, dt_bias and the norm weight included), in the book's order: conv1d
    (depthwise, causal, kernel K, no bias), dt_bias, A_log = log(U(0, 16)), norm, out_proj,
    in_proj_qkv, in_proj_z, in_proj_b, in_proj_a.

    Per head (Hv heads; q and k heads repeated Hv/Hk times): beta = sigmoid(b),
    g = -exp(A_log) * softplus(a + dt_bias) in float32, q and k L2-normalised (eps 1e-6, in the
    model dtype), then in float32 with q scaled by 1/sqrt(dk) and S (dk x dv) starting at zero:
    S = S * exp(g_t); S = S + k_t (x) ((v_t - S^T k_t) * beta_t); o_t = S^T q_t.
    Deviation: this is the recurrent form of the rule (the book's torch_recurrent_gated_delta_rule,
    which its cache runs for single tokens); without a cache the book, like Hugging Face, runs the
    chunked form (chunks of 64): the same sums in another order, so the two differ by float32
    rounding."""

    def __init__(self, cfg):
        super().__init__()
        d = cfg["emb_dim"]
        self.k_heads, self.v_heads = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
        self.dk, self.dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
        key_dim, value_dim = self.k_heads * self.dk, self.v_heads * self.dv
        self.splits = (key_dim, key_dim, value_dim)
        conv_dim, kernel = sum(self.splits), cfg["linear_conv_kernel_dim"]
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, kernel, groups=conv_dim, padding=kernel - 1,
                                bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.v_heads))
        self.A_log = nn.Parameter(torch.log(torch.empty(self.v_heads).uniform_(0, 16)))
        self.norm = GatedRMSNorm(self.dv, cfg.get("rms_norm_eps", 1e-6))
        self.out_proj = nn.Linear(value_dim, d, bias=False)
        self.in_proj_qkv = nn.Linear(d, conv_dim, bias=False)
        self.in_proj_z = nn.Linear(d, value_dim, bias=False)
        self.in_proj_b = nn.Linear(d, self.v_heads, bias=False)
        self.in_proj_a = nn.Linear(d, self.v_heads, bias=False)
        if cfg["dtype"] is not None:
            self.to(dtype=cfg["dtype"])

    def forward(self, x):
        b, t, _ = x.shape
        qkv = self.in_proj_qkv(x).transpose(1, 2)
        z = self.in_proj_z(x).reshape(b, t, -1, self.dv)
        beta = self.in_proj_b(x).sigmoid()
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias)
        qkv = F.silu(self.conv1d(qkv)[:, :, :t]).transpose(1, 2)  # causal: drop the tail
        q, k, v = torch.split(qkv, self.splits, dim=-1)
        q, k = q.reshape(b, t, -1, self.dk), k.reshape(b, t, -1, self.dk)
        v = v.reshape(b, t, -1, self.dv)
        if self.v_heads // self.k_heads > 1:
            q = q.repeat_interleave(self.v_heads // self.k_heads, dim=2)
            k = k.repeat_interleave(self.v_heads // self.k_heads, dim=2)
        out = self.delta_rule(q, k, v, g, beta)
        out = self.norm(out.reshape(-1, self.dv), z.reshape(-1, self.dv))
        return self.out_proj(out.reshape(b, t, -1))

    def delta_rule(self, q, k, v, g, beta):
        """(B, T, H, d) in, (B, T, H, dv) out in q's dtype; the recurrence in float32."""
        dtype = q.dtype
        q, k = l2norm(q), l2norm(k)
        q, k, v, beta, g = (y.transpose(1, 2).contiguous().float() for y in (q, k, v, beta, g))
        q = q * (1 / (q.shape[-1] ** 0.5))
        state = torch.zeros(*k.shape[:2], self.dk, self.dv, dtype=torch.float32, device=q.device)
        outs = []
        for i in range(q.shape[2]):
            state = state * g[:, :, i].exp()[..., None, None]
            recalled = (state * k[:, :, i, :, None]).sum(dim=-2)
            delta = (v[:, :, i] - recalled) * beta[:, :, i, None]
            state = state + k[:, :, i, :, None] * delta[:, :, None, :]
            outs.append((state * q[:, :, i, :, None]).sum(dim=-2))
        return torch.stack(outs, dim=2).transpose(1, 2).contiguous().to(dtype)


def l2norm(x, eps=1e-6):
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


class Qwen3_5Model(DecoderModel):
    """Qwen3.5, hybrid (ch05/16_qwen3.5/qwen3.5.ipynb cells 10-15 with qwen3_5_transformers.py).
    Linear-attention layers are GatedDeltaNet; full-attention layers are gated attention: W_query
    gives [query, gate] per head, context * sigmoid(gate) before out_proj. Zero-centred RMSNorm
    (float32 `weight`, 1 + w) for blocks, final norm and per-head q_norm/k_norm; partial rotary
    (the first r = max(2, even part of int(hd * partial_rotary_factor)) features of each head,
    exponents over r); softmax(scores * hd^-0.5) in float32; pre-norm; one causal mask. The block's
    mixer is `token_mixer`. Deviation: GatedDeltaNet's recurrent rule (see there)."""

    norm_kind, eps_key = "qwen3_5", "rms_norm_eps"

    def make_block(self, i, kind):
        cfg = self.cfg
        if kind == "full_attention":
            mixer = Attention(cfg["emb_dim"], cfg["n_heads"], cfg["n_kv_groups"], self.head_dim,
                              cfg["dtype"], gated=True,
                              qk_norm="qwen3_5" if cfg["qk_norm"] else None,
                              scale=("mul", self.head_dim ** -0.5), softmax_f32=True)
        elif kind == "linear_attention":
            mixer = GatedDeltaNet(cfg)
        else:
            raise ValueError(f"unsupported layer type {kind}")
        return Block("pre", kind, mixer, self.ff(), lambda: self.norm(cfg["emb_dim"]),
                     mixer_name="token_mixer")

    def rope_buffers(self):
        hd = self.head_dim
        r = int(hd * self.cfg.get("partial_rotary_factor", 1.0))
        r = max(2, r - r % 2)
        cos, sin = rope_tables(rope_inv_freq(r, self.cfg["rope_base"]), self.cfg["context_length"])
        return {"cos": cos, "sin": sin}

    def mixer_args(self, kind, masks, t, dtype):
        if kind == "linear_attention":
            return ()
        return masks["full_attention"], self.cos, self.sin


# ------------------------------------------------------------------------------------------------
# Gemma 4: its own attention (Hugging Face names, value norm, KV sharing) and block (per-layer
# inputs, layer_scalar).


def gemma4_kv_source(cfg, i):
    """For a KV-shared layer (index >= n_layers - num_kv_shared_layers, when that is > 0): the
    last earlier layer of the same type before the shared ones, whose keys and values it reads.
    None for the other layers."""
    first = cfg["n_layers"] - cfg["num_kv_shared_layers"]
    if not (i >= first > 0):
        return None
    earlier = cfg["layer_types"][:first]
    return len(earlier) - 1 - earlier[::-1].index(cfg["layer_types"][i])


class Gemma4Attention(nn.Module):
    """q_proj, k_proj, v_proj, o_proj, then q_norm, k_norm (Gemma 4 RMSNorm, float32 weight of
    ones) and v_norm (no weight). head_dim is cfg["head_dim"] on sliding layers and
    cfg["global_head_dim"] on full ones. q = rope(q_norm(q)); k = rope(k_norm(k)); v = v_norm(v);
    no score scaling; masked with finfo.min (not -inf); softmax in float32, cast back. With
    shared_kv, the layer uses those keys and values (already normed and rotated) instead of its
    own projections, which are still created and loaded."""

    def __init__(self, cfg, i):
        super().__init__()
        self.sliding = cfg["layer_types"][i] == "sliding_attention"
        self.head_dim = cfg["head_dim"] if self.sliding else cfg["global_head_dim"]
        self.heads, self.kv_heads = cfg["n_heads"], cfg["n_kv_heads"]
        d, hd, dtype, eps = cfg["emb_dim"], self.head_dim, cfg["dtype"], cfg["layer_norm_eps"]
        self.q_proj = nn.Linear(d, self.heads * hd, bias=False, dtype=dtype)
        self.k_proj = nn.Linear(d, self.kv_heads * hd, bias=False, dtype=dtype)
        self.v_proj = nn.Linear(d, self.kv_heads * hd, bias=False, dtype=dtype)
        self.o_proj = nn.Linear(self.heads * hd, d, bias=False, dtype=dtype)
        self.q_norm, self.k_norm = Norm(hd, "gemma4", eps), Norm(hd, "gemma4", eps)
        self.v_norm = Norm(hd, "gemma4_v", eps)
        self.kv_source = gemma4_kv_source(cfg, i)
        # A layer that others read from: the last one of its type before the shared layers.
        self.kv_provider = any(gemma4_kv_source(cfg, j) == i for j in range(cfg["n_layers"]))

    def split(self, y, heads):
        b, t, _ = y.shape
        return y.view(b, t, heads, self.head_dim).transpose(1, 2)

    def forward(self, x, mask, cos, sin, shared_kv=None):
        b, t, _ = x.shape
        q = rotate(self.q_norm(self.split(self.q_proj(x), self.heads)), cos, sin)
        if shared_kv is None:
            k = rotate(self.k_norm(self.split(self.k_proj(x), self.kv_heads)), cos, sin)
            v = self.v_norm(self.split(self.v_proj(x), self.kv_heads))
        else:
            k, v = shared_kv
        group = self.heads // self.kv_heads
        kk, vv = (k, v) if group == 1 else (k.repeat_interleave(group, 1),
                                             v.repeat_interleave(group, 1))
        scores = q @ kk.transpose(-1, -2)
        scores = scores.masked_fill(mask, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        context = (weights @ vv).transpose(1, 2).contiguous().view(b, t, self.heads * self.head_dim)
        return self.o_proj(context), (k, v)


class Gemma4Block(nn.Module):
    """att, mlp (GeGLU, Hugging Face names; twice as wide on KV-shared layers when
    use_double_wide_mlp), the four sandwich norms, the persistent buffer layer_scalar (ones(1),
    float32) and, with per-layer inputs of size P > 0, per_layer_input_gate (d -> P),
    per_layer_projection (P -> d), post_per_layer_input_norm. After the sandwich sublayers:
    x = x + post_per_layer_input_norm(per_layer_projection(gelu_tanh(gate(x)) * per_layer_input)),
    and the output is x * layer_scalar."""

    def __init__(self, cfg, i):
        super().__init__()
        self.kind = cfg["layer_types"][i]
        d, dtype, eps = cfg["emb_dim"], cfg["dtype"], cfg["layer_norm_eps"]
        p = cfg["hidden_size_per_layer_input"]
        self.att = Gemma4Attention(cfg, i)
        wide = 2 if cfg["use_double_wide_mlp"] and self.att.kv_source is not None else 1
        self.mlp = FeedForward(d, cfg["hidden_dim"] * wide, dtype, "gelu",
                               ("gate_proj", "up_proj", "down_proj"))
        for name in Block.NORMS["sandwich"]:
            setattr(self, name, Norm(d, "gemma4", eps))
        self.register_buffer("layer_scalar", torch.ones(1), persistent=True)
        self.per_layer = p
        if p:
            self.per_layer_input_gate = nn.Linear(d, p, bias=False, dtype=dtype)
            self.per_layer_projection = nn.Linear(p, d, bias=False, dtype=dtype)
            self.post_per_layer_input_norm = Norm(d, "gemma4", eps)

    def forward(self, x, per_layer_input, mask, cos, sin, shared_kv=None):
        h, kv = self.att(self.input_layernorm(x), mask, cos, sin, shared_kv)
        x = x + self.post_attention_layernorm(h)
        x = x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        if self.per_layer:
            h = F.gelu(self.per_layer_input_gate(x), approximate="tanh") * per_layer_input
            x = x + self.post_per_layer_input_norm(self.per_layer_projection(h))
        return x * self.layer_scalar.to(x.dtype), kv


class Gemma4Model(nn.Module):
    """Gemma 4, dense E2B/E4B text model (ch05/17_gemma4/standalone-gemma4.ipynb cells 9-13,
    Gemma4DenseModel). Created in order: tok_emb (padding_idx = pad_token_id, so that row is
    zero), blocks, final_norm, out_head (tied to tok_emb when tie_word_embeddings, after its own
    init draw), then, with per-layer inputs of size P, embed_tokens_per_layer (padding_idx too),
    per_layer_model_projection (d -> L*P) and per_layer_projection_norm (over P); the rotary
    tables last (sliding: rope_local_base over head_dim; full: proportional over global_head_dim).

    Forward: x = tok_emb(ids) * sqrt(d); per-layer inputs
    ((norm(projection(x) * d^-0.5) + embed_tokens_per_layer(ids) * sqrt(P)) * 2^-0.5), layer i
    getting slice i; the blocks; final_norm; out_head (no dtype cast); softcap c * tanh(z / c).
    KV-shared layers use the keys and values of their source layer (gemma4_kv_source).
    Deviation: the book's forward defaults to reuse_shared_kv=False (every layer uses its own
    projections); its generator passes True, and so does its KV-cache model in effect, so True
    is the default here."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        d, dtype, eps = cfg["emb_dim"], cfg["dtype"], cfg["layer_norm_eps"]
        pad = cfg.get("pad_token_id", 0)
        if len(cfg["layer_types"]) != cfg["n_layers"]:
            raise ValueError("layer_types must have n_layers entries")
        self.tok_emb = nn.Embedding(cfg["vocab_size"], d, padding_idx=pad, dtype=dtype)
        self.blocks = nn.ModuleList(Gemma4Block(cfg, i) for i in range(cfg["n_layers"]))
        self.final_norm = Norm(d, "gemma4", eps)
        self.out_head = nn.Linear(d, cfg["vocab_size"], bias=False, dtype=dtype)
        if cfg.get("tie_word_embeddings", False):
            self.out_head.weight = self.tok_emb.weight
        self.per_layer = p = cfg["hidden_size_per_layer_input"]
        if p:
            lp = cfg["n_layers"] * p
            self.embed_tokens_per_layer = nn.Embedding(cfg["vocab_size_per_layer_input"], lp,
                                                       padding_idx=pad, dtype=dtype)
            self.per_layer_model_projection = nn.Linear(d, lp, bias=False, dtype=dtype)
            self.per_layer_projection_norm = Norm(p, "gemma4", eps)
        ctx = cfg["context_length"]
        local = rope_tables(rope_inv_freq(cfg["head_dim"], cfg["rope_local_base"]), ctx)
        if cfg["rope_global_type"] == "proportional":
            inv = rope_inv_freq_proportional(cfg["global_head_dim"], cfg["rope_global_base"],
                                             cfg["rope_global_partial_rotary_factor"])
        else:
            inv = rope_inv_freq(cfg["global_head_dim"], cfg["rope_global_base"])
        for name, table in zip(("cos_local", "sin_local", "cos_global", "sin_global"),
                               local + rope_tables(inv, ctx)):
            self.register_buffer(name, table, persistent=False)

    def per_layer_inputs(self, input_ids, x):
        cfg, p = self.cfg, self.per_layer
        shape = (*input_ids.shape, cfg["n_layers"], p)
        from_tokens = (self.embed_tokens_per_layer(input_ids) * (p ** 0.5)).reshape(shape)
        projected = self.per_layer_model_projection(x) * (cfg["emb_dim"] ** -0.5)
        projected = self.per_layer_projection_norm(projected.reshape(shape))
        return (projected + from_tokens) * (2.0 ** -0.5)

    def forward(self, input_ids, reuse_shared_kv=True):
        cfg = self.cfg
        x = self.tok_emb(input_ids) * (cfg["emb_dim"] ** 0.5)
        per_layer = self.per_layer_inputs(input_ids, x) if self.per_layer else None
        masks = masks_for(input_ids.shape[1], cfg["sliding_window"], input_ids.device)
        provided = {}
        for i, block in enumerate(self.blocks):
            sliding = block.kind == "sliding_attention"
            cos, sin = ((self.cos_local, self.sin_local) if sliding
                        else (self.cos_global, self.sin_global))
            shared = provided.get(block.att.kv_source) if reuse_shared_kv else None
            x, kv = block(x, per_layer[:, :, i, :] if per_layer is not None else None,
                          masks[block.kind], cos, sin, shared)
            if reuse_shared_kv and block.att.kv_provider:
                provided[i] = kv
        logits = self.out_head(self.final_norm(x))
        cap = cfg.get("final_logit_softcap")
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits


# ------------------------------------------------------------------------------------------------
# Factory and generation

FAMILIES = {  # name: (class, the book's notebook it mirrors, its KV-cache counterpart)
    "llama32": (Llama3Model, "ch05/07_gpt_to_llama/standalone-llama32.ipynb",
                "pkg/llms_from_scratch/kv_cache/llama3.py"),
    "qwen3": (Qwen3Model, "ch05/11_qwen3/standalone-qwen3.ipynb",
              "ch05/11_qwen3/standalone-qwen3-plus-kvcache.ipynb"),
    "gemma3": (Gemma3Model, "ch05/12_gemma3/standalone-gemma3.ipynb",
               "ch05/12_gemma3/standalone-gemma3-plus-kvcache.ipynb"),
    "olmo3": (Olmo3Model, "ch05/13_olmo3/standalone-olmo3.ipynb",
              "ch05/13_olmo3/standalone-olmo3-plus-kv-cache.ipynb"),
    "tiny_aya": (TinyAyaModel, "ch05/15_tiny-aya/standalone-tiny-aya.ipynb",
                 "ch05/15_tiny-aya/standalone-tiny-aya-plus-kv-cache.ipynb"),
    "qwen3_5": (Qwen3_5Model, "ch05/16_qwen3.5/qwen3.5.ipynb",
                "ch05/16_qwen3.5/qwen3.5-plus-kv-cache.ipynb"),
    "gemma4": (Gemma4Model, "ch05/17_gemma4/standalone-gemma4.ipynb",
               "ch05/17_gemma4/standalone-gemma4-plus-kvcache.ipynb"),
}


def build(family, cfg):
    """The stand-in model of `family` for the book's config dict `cfg` (cfg["dtype"] a torch
    dtype). Seed first (torch.manual_seed) to get the book's init."""
    return FAMILIES[family][0](cfg)


@torch.no_grad()
def generate(model, prompt, max_new_tokens):
    """Greedy decoding as the book's generate_text_basic_stream (no cache): each step runs the
    whole sequence, without cropping to the context length, and appends the argmax of the last
    position's logits. No end-of-sequence stop. Returns (tokens (B, P + N), the N steps' logits
    as float32 (N, vocab) for B = 1, else (N, B, vocab))."""
    model.eval()
    tokens, steps = prompt, []
    for _ in range(max_new_tokens):
        last = model(tokens)[:, -1]
        steps.append(last.float())
        tokens = torch.cat([tokens, torch.argmax(last, dim=-1, keepdim=True)], dim=1)
    logits = torch.stack(steps)
    return tokens, logits[:, 0] if logits.shape[1] == 1 else logits
