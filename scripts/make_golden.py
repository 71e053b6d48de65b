#!/usr/bin/python3
"""Writes the golden cases that the C++ harness compares against: models/golden/.

For each case: <name>.pt, the reference module with its weights (torch.jit.save of the scripted
module; traced for the zoo's attention layers), <name>.state_dict.pt, the same weights as
torch.save(dict(m.state_dict())), <name>.safetensors, the same weights as safetensors (written by
python/attention_parity/safetensors_io.py), and <name>.tensors.pt, a plain dict of tensors
(torch.save): the inputs ("input.<arg>"), the upstream gradient ("grad_output"), the output
("output") and the gradient of the output against every input and parameter ("grad.<arg>",
"grad.<parameter name>"). manifest.json lists every case, with the kernel each is meant to
exercise ("path"), whether it runs with autograd ("mode": "train") or without ("inference":
inputs and output only), and whether the C++ module seeded alike draws Python's weights
("seeded"; false where the class draws in another order or the case changes its weights after
seeding). Two runs on one machine write identical tensors.

    scripts/make_golden.py                 # rewrite models/golden/
    scripts/make_golden.py --out DIR       # write elsewhere
    scripts/make_golden.py --verify        # regenerate into a temporary folder and compare with
                                           # models/golden/ (seeded tensors bit for bit, computed
                                           # ones within tolerance); exit 1 naming every drift
"""

import argparse
import contextlib
import copy
import json
import os
import sys
import tempfile
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The parity kit's package holds the safetensors reader and writer.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
import reference  # noqa: E402
from attention_parity import safetensors_io  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "models", "golden")

# bfloat16 keeps 8 bits of mantissa (relative rounding 2^-9); its cases compare the C++ module
# in bfloat16 with Python in float32 on the same bfloat16 weights and inputs, so a few roundings
# of the projections and the attention add up.
TOLERANCE = {"float32": {"atol": 1e-5, "rtol": 1e-5}, "float64": {"atol": 1e-12, "rtol": 1e-12},
             "bfloat16": {"atol": 2e-2, "rtol": 2e-2}}
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
# Above this context length the book's T x T `mask` buffer (a derived buffer that the C++ module
# does not keep) is left out of the saved files, which it would otherwise dominate.
MAX_SAVED_MASK = 128
INPUT_NAMES = {"CrossAttention": ["x_1", "x_2"]}


def article_embedding():
    sentence = "Life is short, eat dessert first"
    words = sentence.replace(",", "").split()
    dc = {s: i for i, s in enumerate(sorted(words))}
    torch.manual_seed(123)
    embed = torch.nn.Embedding(50_000, 3)
    return embed(torch.tensor([dc[s] for s in words])).detach()


def default_path(forward, mode):
    """The kernel a case's backend takes on the CPU: the one it names, or Auto's choice for the
    cases' small scores (Math for attention weights and in training, else the fused CPU kernels,
    which Auto takes at every size in inference). A training case of large scores names its
    path."""
    backend = forward.get("backend", "auto")
    if backend != "auto":
        return {"math": "math", "chunked": "chunked_fused", "native": "native"}[backend]
    if forward.get("need_weights") or mode == "train":
        return "math"
    return "chunked_fused"


def case_list():
    """Every case: name, module, constructor args, input shapes, dtype, input magnitude."""
    cases = []

    # mode: "train" (forward and backward) or "inference" (no autograd, the output only);
    # path: the kernel the case is meant to exercise (the C++ harness checks that it ran:
    # "direct", "math", "chunked_fused", "chunked_tiles" or "native"); forward["backend"] picks
    # the C++ backend ("auto" when absent); forward["decode"]: chunk sizes in which the C++ side
    # feeds the input through a KV cache (forward["sliding_cache"]: a SlidingKVCache of that
    # window), against Python's one forward over the whole input.
    def add(name, module, args, shapes, dtype="float32", magnitude=1.0, article=False,
            forward=None, against="reference", mode="train", path=None, computed_in=None):
        forward = forward or {}
        cases.append(dict(name=name, module=module, args=args, shapes=shapes, dtype=dtype,
                          magnitude=magnitude, article=article, forward=forward,
                          against=against, mode=mode, path=path or default_path(forward, mode),
                          computed_in=computed_in))

    # The article's own configurations, on its embedded sentence.
    add("article_self_attention", "SelfAttention", dict(d_in=3, d_out_kq=2, d_out_v=4), [[6, 3]],
        article=True)
    add("article_single_head", "SelfAttention", dict(d_in=3, d_out_kq=2, d_out_v=1), [[6, 3]],
        article=True)
    add("article_wrapper_4_heads", "MultiHeadAttentionWrapper",
        dict(d_in=3, d_out_kq=2, d_out_v=1, num_heads=4), [[6, 3]], article=True)
    add("article_causal", "CausalSelfAttention", dict(d_in=3, d_out_kq=2, d_out_v=4), [[6, 3]],
        article=True)
    add("article_cross_attention", "CrossAttention", dict(d_in=3, d_out_kq=2, d_out_v=4),
        [[6, 3], [8, 3]], article=True)

    # Every module over T in {1, 2, 6, 37, 128}, unbatched and batched, float32 and float64.
    batches = {1: 4, 2: 3, 6: 2, 37: 2, 128: 1}
    for t, b in batches.items():
        for dtype in ("float32", "float64"):
            tag = f"T{t}_{dtype}"
            add(f"self_unbatched_{tag}", "SelfAttention", dict(d_in=5, d_out_kq=3, d_out_v=4),
                [[t, 5]], dtype)
            add(f"self_batched_{tag}", "SelfAttention", dict(d_in=5, d_out_kq=4, d_out_v=2),
                [[b, t, 5]], dtype)
            add(f"causal_unbatched_{tag}", "CausalSelfAttention",
                dict(d_in=4, d_out_kq=3, d_out_v=5), [[t, 4]], dtype)
            add(f"causal_batched_{tag}", "CausalSelfAttention", dict(d_in=6, d_out_kq=2, d_out_v=3),
                [[b, t, 6]], dtype)
            t_kv = {1: 3, 2: 1, 6: 8, 37: 20, 128: 64}[t]
            add(f"cross_batched_{tag}", "CrossAttention",
                dict(d_in=4, d_out_kq=3, d_out_v=2, d_in_kv=7), [[b, t, 4], [b, t_kv, 7]], dtype)

    for heads in range(1, 9):
        add(f"wrapper_{heads}_heads", "MultiHeadAttentionWrapper",
            dict(d_in=8, d_out_kq=4, d_out_v=3, num_heads=heads), [[2, 9, 8]],
            "float64" if heads % 2 == 0 else "float32")
    add("wrapper_unbatched_T37", "MultiHeadAttentionWrapper",
        dict(d_in=6, d_out_kq=2, d_out_v=5, num_heads=3), [[37, 6]])
    add("cross_unbatched_same_width", "CrossAttention", dict(d_in=5, d_out_kq=4, d_out_v=6),
        [[7, 5], [3, 5]])
    add("cross_unbatched_wider_kv", "CrossAttention", dict(d_in=3, d_out_kq=2, d_out_v=4, d_in_kv=9),
        [[6, 3], [11, 9]], "float64")

    # Saturated softmax: inputs of magnitude up to 30.
    for dtype in ("float32", "float64"):
        add(f"saturated_self_{dtype}", "SelfAttention", dict(d_in=4, d_out_kq=3, d_out_v=3),
            [[2, 6, 4]], dtype, magnitude=30.0)
        add(f"saturated_causal_{dtype}", "CausalSelfAttention", dict(d_in=4, d_out_kq=3, d_out_v=3),
            [[2, 6, 4]], dtype, magnitude=30.0)
        add(f"saturated_cross_{dtype}", "CrossAttention", dict(d_in=4, d_out_kq=3, d_out_v=3, d_in_kv=2),
            [[2, 6, 4], [2, 5, 2]], dtype, magnitude=30.0)
        add(f"saturated_wrapper_{dtype}", "MultiHeadAttentionWrapper",
            dict(d_in=4, d_out_kq=3, d_out_v=2, num_heads=2), [[2, 6, 4]], dtype, magnitude=30.0)

    # The book's MultiHeadAttention, and what the C++ fused module adds to it.
    def mha(d_in, d_out, heads, **kw):
        args = dict(d_in=d_in, d_out=d_out, context_length=kw.pop("context_length", 64),
                    dropout=0.0, num_heads=heads, qkv_bias=kw.pop("qkv_bias", False),
                    num_kv_heads=kw.pop("num_kv_heads", heads), causal=kw.pop("causal", True),
                    d_in_kv=kw.pop("d_in_kv", d_in))
        # The variants of later models, named only where a case uses them.
        for variant in ("sliding_window", "softcap", "alibi", "top_left", "rope_theta",
                        "rotary_dim", "rope_interleaved", "llama3_scaling", "sinks",
                        "relative_bias"):
            if variant in kw:
                args[variant] = kw.pop(variant)
        assert not kw
        return args

    for dtype in ("float32", "float64"):
        add(f"mha_causal_{dtype}", "MultiHeadAttention", mha(8, 8, 2), [[2, 6, 8]], dtype)
        add(f"mha_gqa_2_kv_heads_{dtype}", "MultiHeadAttention", mha(12, 16, 4, num_kv_heads=2),
            [[2, 37, 12]], dtype)
    add("mha_not_causal", "MultiHeadAttention", mha(8, 12, 3, causal=False), [[3, 7, 8]])
    add("mha_qkv_bias", "MultiHeadAttention", mha(8, 8, 4, qkv_bias=True), [[2, 6, 8]])
    add("mha_mqa_1_kv_head", "MultiHeadAttention", mha(8, 16, 4, num_kv_heads=1), [[2, 9, 8]])
    add("mha_gqa_T1", "MultiHeadAttention", mha(8, 16, 4, num_kv_heads=2), [[3, 1, 8]])
    add("mha_T128", "MultiHeadAttention", mha(16, 16, 4, context_length=128), [[1, 128, 16]])
    add("mha_cross_attention", "MultiHeadAttention", mha(6, 8, 2, causal=False, d_in_kv=10),
        [[2, 5, 6], [2, 9, 10]], forward=dict(context=True))
    add("mha_cross_gqa_bias", "MultiHeadAttention",
        mha(6, 12, 6, causal=False, d_in_kv=4, num_kv_heads=3, qkv_bias=True),
        [[2, 5, 6], [2, 3, 4]], "float64", forward=dict(context=True))
    add("mha_key_padding_mask", "MultiHeadAttention", mha(8, 8, 2), [[3, 7, 8]],
        forward=dict(key_padding_mask=True))
    add("mha_not_causal_attn_mask_and_padding", "MultiHeadAttention", mha(8, 8, 2, causal=False),
        [[3, 7, 8]], "float64", forward=dict(key_padding_mask=True, attn_mask=True))
    add("mha_need_weights_averaged", "MultiHeadAttention", mha(8, 8, 4), [[2, 6, 8]],
        forward=dict(need_weights=True, average_attn_weights=True))
    add("mha_need_weights_per_head", "MultiHeadAttention", mha(8, 8, 4, num_kv_heads=2),
        [[2, 6, 8]], forward=dict(need_weights=True, average_attn_weights=False))
    add("mha_saturated", "MultiHeadAttention", mha(8, 8, 2), [[2, 6, 8]], magnitude=30.0)

    # The same weights in torch.nn.MultiheadAttention (bool masks: true = masked out).
    add("torch_mha_causal_weights", "MultiHeadAttention", mha(8, 8, 2), [[2, 6, 8]],
        forward=dict(need_weights=True, average_attn_weights=True), against="torch")
    add("torch_mha_padding_no_weights", "MultiHeadAttention", mha(8, 8, 4, causal=False),
        [[3, 7, 8]], forward=dict(key_padding_mask=True), against="torch")
    add("torch_mha_attn_mask_per_head", "MultiHeadAttention", mha(12, 12, 3, causal=False),
        [[2, 5, 12]], "float64",
        forward=dict(attn_mask=True, key_padding_mask=True, need_weights=True,
                     average_attn_weights=False), against="torch")
    add("torch_mha_bias_causal_padding", "MultiHeadAttention", mha(8, 8, 2, qkv_bias=True),
        [[2, 9, 8]], forward=dict(key_padding_mask=True, need_weights=True), against="torch")

    # The paths users run: inference (no autograd) through the direct path and the fused CPU
    # Chunked forward, long sequences, bfloat16, every backend by name, KV-cache decoding.
    add("inference_article_self_attention", "SelfAttention", dict(d_in=3, d_out_kq=2, d_out_v=4),
        [[6, 3]], article=True, mode="inference", path="direct")
    add("inference_causal_batched_T37", "CausalSelfAttention", dict(d_in=6, d_out_kq=4, d_out_v=3),
        [[2, 37, 6]], mode="inference", path="direct")
    add("inference_cross_unbatched_float64", "CrossAttention",
        dict(d_in=5, d_out_kq=4, d_out_v=6, d_in_kv=9), [[7, 5], [11, 9]], "float64",
        mode="inference", path="direct")
    add("inference_wrapper_3_heads", "MultiHeadAttentionWrapper",
        dict(d_in=8, d_out_kq=4, d_out_v=3, num_heads=3), [[2, 9, 8]], mode="inference",
        path="direct")
    add("inference_self_T128", "SelfAttention", dict(d_in=5, d_out_kq=3, d_out_v=4),
        [[1, 128, 5]], mode="inference")
    add("mha_inference_T1024_causal", "MultiHeadAttention", mha(16, 32, 4, context_length=1024),
        [[1, 1024, 16]], mode="inference", path="chunked_fused")
    add("mha_inference_T1100_gqa_padding", "MultiHeadAttention",
        mha(16, 32, 4, num_kv_heads=2, context_length=1100), [[2, 1100, 16]],
        forward=dict(key_padding_mask=True), mode="inference", path="chunked_fused")
    add("mha_inference_T1024_bfloat16", "MultiHeadAttention", mha(16, 32, 4, context_length=1024),
        [[1, 1024, 16]], "bfloat16", mode="inference", path="chunked_fused")
    add("mha_train_chunked_T300_float64", "MultiHeadAttention",
        mha(8, 16, 4, num_kv_heads=2, context_length=300), [[1, 300, 8]], "float64",
        forward=dict(backend="chunked"), path="chunked_fused")
    add("mha_train_native_padding", "MultiHeadAttention", mha(8, 8, 2), [[2, 6, 8]],
        forward=dict(backend="native", key_padding_mask=True), path="native")
    add("mha_train_math", "MultiHeadAttention", mha(8, 8, 2, num_kv_heads=1), [[2, 6, 8]],
        forward=dict(backend="math"), path="math")
    add("mha_decode_token_by_token", "MultiHeadAttention", mha(8, 16, 4, num_kv_heads=2),
        [[2, 12, 8]], forward=dict(decode=[1] * 12), mode="inference")
    add("mha_decode_chunks_float64", "MultiHeadAttention", mha(8, 8, 2), [[1, 40, 8]], "float64",
        forward=dict(decode=[1, 7, 16, 3, 13]), mode="inference")

    # Sliding windows, soft-capping, ALiBi and causal alignment (MultiHeadAttentionOptions'
    # sliding_window, softcap, alibi, causal_alignment): Math on short sequences, the fused
    # Chunked kernels forward and backward at T >= 1024, and combinations.
    add("variant_window_math", "MultiHeadAttention", mha(8, 16, 4, num_kv_heads=2, sliding_window=5),
        [[2, 40, 8]], "float64", forward=dict(backend="math"), path="math")
    add("variant_window_not_causal_math", "MultiHeadAttention",
        mha(8, 8, 2, causal=False, sliding_window=4), [[2, 17, 8]], forward=dict(backend="math"),
        path="math")
    add("variant_window_chunked_T1024_float64", "MultiHeadAttention",
        mha(8, 16, 4, num_kv_heads=2, context_length=1024, sliding_window=100), [[1, 1024, 8]],
        "float64", forward=dict(backend="chunked"), path="chunked_fused")
    add("variant_window_inference_T1100_float32", "MultiHeadAttention",
        mha(16, 32, 4, context_length=1100, sliding_window=256), [[1, 1100, 16]],
        mode="inference", path="chunked_fused")
    add("variant_softcap_math", "MultiHeadAttention", mha(8, 8, 2, softcap=1.5), [[2, 9, 8]],
        "float64", magnitude=3.0, forward=dict(backend="math"), path="math")
    add("variant_softcap_causal_chunked_T1024_float64", "MultiHeadAttention",
        mha(8, 16, 4, context_length=1024, softcap=1.0), [[1, 1024, 8]], "float64",
        magnitude=4.0, forward=dict(backend="chunked"), path="chunked_fused")
    add("variant_alibi_8_heads_math", "MultiHeadAttention", mha(8, 16, 8, alibi=True),
        [[2, 12, 8]], forward=dict(backend="math"), path="math")
    add("variant_alibi_6_heads_padding_chunked_T1024_float64", "MultiHeadAttention",
        mha(8, 24, 6, num_kv_heads=3, context_length=1024, alibi=True), [[2, 1024, 8]],
        "float64", forward=dict(backend="chunked", key_padding_mask=True), path="chunked_fused")
    add("variant_top_left_cross_math", "MultiHeadAttention",
        mha(6, 8, 2, d_in_kv=10, top_left=True), [[2, 5, 6], [2, 9, 10]], "float64",
        forward=dict(context=True, backend="math"), path="math")
    add("variant_top_left_cross_chunked_T1100_float64", "MultiHeadAttention",
        mha(6, 8, 2, d_in_kv=4, context_length=1100, top_left=True), [[1, 700, 6], [1, 1100, 4]],
        "float64", forward=dict(context=True, backend="chunked"), path="chunked_fused")
    add("variant_all_chunked_T1024_float64", "MultiHeadAttention",
        mha(8, 16, 4, num_kv_heads=1, context_length=1024, sliding_window=300, softcap=2.0,
            alibi=True), [[1, 1024, 8]], "float64", magnitude=4.0,
        forward=dict(backend="chunked"), path="chunked_fused")
    add("variant_window_gqa_decode_chunks", "MultiHeadAttention",
        mha(8, 16, 4, num_kv_heads=2, sliding_window=7, alibi=True), [[1, 40, 8]], "float64",
        forward=dict(decode=[1, 7, 16, 3, 13]), mode="inference")

    # Rotary position embeddings (MultiHeadAttentionOptions::rope): both layouts, partial,
    # Llama 3.1's scaling, and with GQA, a window and a KV cache decoding in chunks.
    add("rope_half_split_math", "MultiHeadAttention", mha(8, 16, 4, rope_theta=10000.0),
        [[2, 11, 8]], "float64", forward=dict(backend="math"), path="math")
    add("rope_interleaved_partial", "MultiHeadAttention",
        mha(8, 24, 3, rope_theta=100.0, rotary_dim=4, rope_interleaved=True), [[2, 9, 8]],
        forward=dict(backend="math"), path="math")
    add("rope_llama3_gqa_window_decode", "MultiHeadAttention",
        mha(8, 32, 4, num_kv_heads=2, sliding_window=7, rope_theta=500000.0,
            llama3_scaling=[8.0, 1.0, 4.0, 16.0]), [[2, 40, 8]], "float64",
        forward=dict(decode=[1, 7, 16, 3, 13]), mode="inference")
    add("rope_window_chunked_T1024_float64", "MultiHeadAttention",
        mha(8, 16, 4, num_kv_heads=2, context_length=1024, sliding_window=256,
            rope_theta=10000.0, llama3_scaling=[8.0, 1.0, 4.0, 64.0]), [[1, 1024, 8]], "float64",
        forward=dict(backend="chunked"), path="chunked_fused")

    # Attention sinks (MultiHeadAttentionOptions::sinks, gpt-oss), with their gradient; with a
    # window and padding, where some queries' every key is masked and the sink takes everything.
    add("sinks_math", "MultiHeadAttention", mha(8, 16, 4, num_kv_heads=2, sinks=True),
        [[2, 10, 8]], "float64", forward=dict(backend="math"), path="math")
    add("sinks_window_padding_chunked_T1024_float64", "MultiHeadAttention",
        mha(8, 16, 4, num_kv_heads=2, context_length=1024, sliding_window=128, sinks=True,
            rope_theta=10000.0), [[2, 1024, 8]], "float64",
        forward=dict(backend="chunked", key_padding_mask=True), path="chunked_fused")
    # A cache that keeps only the window (SlidingKVCache), decoding in chunks.
    add("rope_llama3_gqa_window_sliding_cache_decode", "MultiHeadAttention",
        mha(8, 32, 4, num_kv_heads=2, sliding_window=7, rope_theta=500000.0,
            llama3_scaling=[8.0, 1.0, 4.0, 16.0]), [[2, 40, 8]], "float64",
        forward=dict(decode=[1, 7, 16, 3, 13], sliding_cache=7), mode="inference")

    varlen_cases(cases, add, mha)
    paged_cases(cases, add, mha)
    block_mask_cases(cases, add, mha)
    latent_cases(cases, add)
    sharing_cases(cases, add)
    gated_cases(cases, add)
    deltanet_cases(cases, add)
    dsa_cases(cases, add)
    zoo_cases(cases, add)
    for i, case in enumerate(cases):
        case.setdefault("seed", 123 if case["article"] else 1000 + i)
    return cases


def varlen_cases(cases, add, mha):
    """Packed sequences of different lengths (functional::varlen_attention): forward["packed"]
    holds the sequences' lengths, forward["packed_context"] their context's (cross-attention).
    Python runs the book's MultiHeadAttention on each sequence alone and joins the outputs; the
    C++ harness projects the packed tokens with the module's weights and computes every sequence
    in one varlen_attention call. Seeds of their own, so that cases added before them keep theirs."""
    def packed(name, args, lengths, dtype="float32", context=None, **kw):
        forward = dict(packed=lengths, backend=kw.pop("backend", "auto"))
        shapes = [[sum(lengths), args["d_in"]]]
        if context is not None:
            forward.update(context=True, packed_context=context)
            shapes.append([sum(context), args["d_in_kv"]])
        add(name, "MultiHeadAttention", args, shapes, dtype, forward=forward, **kw)
        cases[-1]["seed"] = 4100 + len(names)
        names.append(name)

    names = []
    packed("varlen_causal_gqa_math", mha(8, 16, 4, num_kv_heads=2), [5, 0, 13, 1, 7], "float64",
           backend="math", path="math")
    packed("varlen_causal_chunked_float64", mha(8, 16, 4, num_kv_heads=2, context_length=700),
           [300, 17, 0, 700, 1], "float64", backend="chunked", path="chunked_fused")
    packed("varlen_auto_chunked_float32", mha(8, 16, 4, context_length=900), [600, 900, 40],
           path="chunked_fused", mode="inference")
    packed("varlen_auto_small_math", mha(8, 8, 2), [3, 9, 1])
    packed("varlen_window_softcap_alibi_sinks_chunked_float64",
           mha(8, 16, 4, num_kv_heads=2, context_length=513, sliding_window=37, softcap=2.0,
               alibi=True, sinks=True), [200, 513, 64, 0, 3], "float64", magnitude=3.0,
           backend="chunked", path="chunked_fused")
    packed("varlen_not_causal_window_chunked_float64",
           mha(8, 16, 4, causal=False, context_length=400, sliding_window=9), [400, 31, 129],
           "float64", backend="chunked", path="chunked_fused")
    packed("varlen_cross_top_left_chunked_float64",
           mha(6, 8, 2, d_in_kv=4, context_length=600, top_left=True), [5, 40, 0, 300],
           "float64", context=[9, 20, 7, 600], backend="chunked", path="chunked_fused")
    # Bottom-right: each sequence's queries are the last of its keys' positions, which ALiBi's
    # distances show (the book's code takes that alignment on its variants' path).
    packed("varlen_cross_bottom_right_decode_alibi_math",
           mha(6, 8, 2, d_in_kv=4, context_length=33, alibi=True), [1, 3, 1, 2], "float64",
           context=[10, 4, 33, 0], backend="math", path="math")
    packed("varlen_inference_bfloat16", mha(16, 32, 4, context_length=700), [300, 50, 700],
           "bfloat16", backend="chunked", path="chunked_fused", mode="inference")
    packed("varlen_not_causal_native", mha(8, 8, 2, causal=False), [6, 11, 2], backend="native",
           path="native")
    return names


def paged_cases(cases, add, mha):
    """Sequences sharing a PagedKVCache (MultiHeadAttention::forward_paged over its pages):
    forward["paged"] holds page_size, num_pages, window (the cache's), steps (each a list of
    [sequence, new tokens]: some sequences take a chunk of their prompt, others one token, in one
    packed step) and forks ([step, parent, child]: before that step the child starts as a copy of
    the parent, sharing its pages). Python runs the book's module on each sequence alone; the
    output is (S, T, d_out), zeros past a sequence's length, and a fork's tokens before it forked
    are its parent's. The C++ harness runs the steps through the cache, one forward_paged call
    each. Seeds of their own."""
    def paged(name, args, shape, steps, page_size, num_pages, dtype="float32", forks=(),
              window=None, backend="auto", path="chunked_fused"):
        spec = dict(page_size=page_size, num_pages=num_pages, steps=steps,
                    forks=[list(f) for f in forks])
        if window:
            spec["window"] = window
        add(name, "MultiHeadAttention", args, [shape], dtype,
            forward=dict(paged=spec, backend=backend), mode="inference", path=path)
        cases[-1]["seed"] = 4200 + len(names)
        names.append(name)

    names = []
    mixed = [[[0, 5], [1, 1]], [[0, 1], [1, 6], [2, 3]], [[0, 1], [1, 1], [2, 9]],
             [[0, 6], [1, 1], [2, 1]], [[0, 1], [1, 1], [2, 7]], [[0, 6], [1, 10]]]
    paged("paged_mixed_steps_gqa", mha(8, 16, 4, num_kv_heads=2), [3, 20, 8], mixed, 4, 16)
    paged("paged_mixed_steps_math_float64", mha(8, 16, 4, num_kv_heads=2), [3, 20, 8], mixed, 4,
          16, "float64", backend="math", path="math")
    # A window of 5 keys in pages of 2: each sequence gives its old pages back, and the pool of
    # 14 pages holds two sequences of 30 tokens.
    windowed = [[[0, 9], [1, 1]]] + [[[0, 1], [1, 1]]] * 6 + [[[0, 1], [1, 7]]] + \
        [[[0, 1], [1, 1]]] * 14 + [[[1, 1]]] * 2
    paged("paged_rope_window_gqa_float64",
          mha(8, 32, 4, num_kv_heads=2, sliding_window=5, rope_theta=10000.0), [2, 30, 8],
          windowed, 2, 14, "float64", window=5)
    forked = [[[0, 6]], [[0, 1], [1, 1]]] + [[[0, 1], [1, 1], [2, 1]]] * 8 + [[[1, 1], [2, 1]]]
    paged("paged_forks_alibi_float64", mha(8, 16, 4, alibi=True), [3, 16, 8], forked, 4, 24,
          "float64", forks=[[1, 0, 1], [2, 0, 2]])
    paged("paged_sinks_softcap_mqa_bfloat16", mha(8, 16, 4, num_kv_heads=1, sinks=True,
                                                  softcap=2.0), [2, 12, 8],
          [[[0, 4], [1, 7]]] + [[[0, 1], [1, 1]]] * 5 + [[[0, 3]]], 4, 8, "bfloat16")
    return names


def paged_lengths(spec, sequences):
    """Each sequence's tokens once every step has run, and where each fork began:
    {child: (parent, parent's length at the fork)}."""
    lengths, forked_at = [0] * sequences, {}
    for index, step in enumerate(spec["steps"]):
        for when, parent, child in spec["forks"]:
            if when == index:
                lengths[child] = lengths[parent]
                forked_at[child] = (parent, lengths[parent])
        for sequence, count in step:
            lengths[sequence] += count
    return lengths, forked_at


def run_paged(module, x, spec):
    """Each sequence alone through the book's module: (S, T, d_out), zeros past its length."""
    lengths, _ = paged_lengths(spec, x.shape[0])
    out = torch.zeros(x.shape[0], x.shape[1], module.d_out, dtype=x.dtype)
    for s, length in enumerate(lengths):
        if length > 0:
            out[s, :length] = module(x[s:s + 1, :length])[0]
    return out


def block_mask_cases(cases, add, mha):
    """Block masks (forward["block_mask"]: kind, block size and the kind's parameters), at
    T >= 1024. Python hands the book's module the dense mask written from the kind's definition
    (block_mask_hidden); the C++ harness makes the BlockMask with the library's builders or its
    own mask function and passes that, never a dense mask. Seeds of their own."""
    def masked(name, args, shape, spec, dtype="float32", **kw):
        add(name, "MultiHeadAttention", args, shape, dtype,
            forward=dict(block_mask=spec, backend=kw.pop("backend", "auto")), **kw)
        cases[-1]["seed"] = 4300 + len(names)
        names.append(name)

    names = []
    documents = dict(kind="document", lengths=[300, 10, 590, 200], causal=True, block=128)
    masked("blockmask_document_causal_chunked_float64",
           mha(8, 16, 4, num_kv_heads=2, causal=False, context_length=1100), [[1, 1100, 8]],
           documents, "float64", backend="chunked", path="chunked_fused")
    masked("blockmask_document_causal_math_float64",
           mha(8, 16, 4, num_kv_heads=2, causal=False, context_length=1100), [[1, 1100, 8]],
           documents, "float64", backend="math", path="math")
    masked("blockmask_prefix_lm_chunked_float32", mha(16, 32, 4, causal=False, context_length=1024),
           [[1, 1024, 16]], dict(kind="prefix_lm", prefix=300, block=64), backend="chunked",
           path="chunked_fused")
    # Global tokens and a dilated band (Longformer's pattern), with the module's own causality:
    # a mask function in C++, whose blocks are of every class.
    masked("blockmask_global_dilated_causal_auto_float64",
           mha(8, 16, 2, causal=True, context_length=1024), [[2, 1024, 8]],
           dict(kind="global_dilated", globals=16, dilation=7, block=128), "float64",
           path="chunked_fused")
    masked("blockmask_document_inference_bfloat16", mha(16, 32, 4, causal=False, context_length=1100),
           [[1, 1100, 16]], dict(documents, block=256), "bfloat16", backend="chunked",
           path="chunked_fused", mode="inference")
    # A score modification with a gradient: T5's relative position bias (the book's module with
    # the table `relative_attention_bias`), alone and under a block mask.
    t5 = [32, 128, 1]
    add("blockmask_relative_bias_t5_chunked_float64", "MultiHeadAttention",
        mha(8, 16, 4, num_kv_heads=2, context_length=1100, relative_bias=t5), [[1, 1100, 8]],
        "float64", forward=dict(backend="chunked"), path="chunked_fused")
    cases[-1]["seed"] = 4300 + len(names)
    names.append(cases[-1]["name"])
    add("blockmask_relative_bias_t5_unidirectional_math_float32", "MultiHeadAttention",
        mha(8, 16, 2, relative_bias=[16, 64, 0]), [[2, 40, 8]], forward=dict(backend="math"),
        path="math")
    cases[-1]["seed"] = 4300 + len(names)
    names.append(cases[-1]["name"])
    masked("blockmask_document_relative_bias_chunked_float32",
           mha(16, 32, 4, causal=False, context_length=1100, relative_bias=t5), [[1, 1100, 16]],
           documents, backend="chunked", path="chunked_fused")
    # A score modification of the user's (forward["score_mod"], written once in the reference
    # module and once in the C++ harness), with its derivative: alone with the module's
    # causality, over a batch of two, and under the document mask.
    add("blockmask_score_mod_wavy_chunked_float64", "MultiHeadAttention",
        mha(8, 16, 4, num_kv_heads=2, context_length=1030), [[2, 1030, 8]], "float64",
        forward=dict(score_mod="wavy", backend="chunked"), path="chunked_fused")
    cases[-1]["seed"] = 4300 + len(names)
    names.append(cases[-1]["name"])
    masked("blockmask_score_mod_document_math_float32",
           mha(16, 32, 4, causal=False, context_length=1100), [[1, 1100, 16]], documents,
           backend="math", path="math")
    cases[-1]["forward"]["score_mod"] = "wavy"
    masked("blockmask_score_mod_document_chunked_bfloat16",
           mha(16, 32, 4, causal=False, context_length=1100), [[1, 1100, 16]], documents,
           "bfloat16", backend="chunked", path="chunked_fused", mode="inference")
    cases[-1]["forward"]["score_mod"] = "wavy"
    return names


def latent_cases(cases, add):
    """The book's MultiHeadLatentAttention: forward and backward as the book computes it, and
    decoding through a LatentCache (forward["decode"], the absorbed form on the C++ side) against
    Python's one forward; then DeepSeek-V2's parts. Seeds of their own."""
    def mla(name, d_in, d_out, heads, shape, dtype="float32", latent_dim=None, qkv_bias=False,
            args=None, **kw):
        args = dict(d_in=d_in, d_out=d_out, dropout=0.0, num_heads=heads, qkv_bias=qkv_bias,
                    latent_dim=latent_dim, **(args or {}))
        add(name, "MultiHeadLatentAttention", args, [shape], dtype, **kw)
        cases[-1]["seed"] = 4400 + len(names)
        names.append(name)

    names = []
    for dtype in ("float32", "float64"):
        mla(f"mla_T6_{dtype}", 8, 8, 2, [2, 6, 8], dtype, latent_dim=4)
        mla(f"mla_bias_T37_{dtype}", 12, 16, 4, [2, 37, 12], dtype, latent_dim=6, qkv_bias=True)
    mla("mla_default_latent_T1", 8, 32, 4, [3, 1, 8])
    mla("mla_saturated", 8, 8, 2, [2, 6, 8], latent_dim=4, magnitude=30.0)
    mla("mla_T1024_chunked", 16, 32, 4, [1, 1024, 16], latent_dim=8,
        forward=dict(backend="chunked"), path="chunked_fused")
    mla("mla_decode_token_by_token", 8, 16, 4, [2, 12, 8], latent_dim=8,
        forward=dict(decode=[1] * 12), mode="inference")
    mla("mla_bias_decode_chunks_float64", 8, 16, 2, [2, 40, 8], "float64", latent_dim=5,
        qkv_bias=True, forward=dict(decode=[1, 7, 16, 3, 13]), mode="inference")
    mla("mla_decode_chunked_T300", 16, 32, 4, [1, 300, 16], latent_dim=8,
        forward=dict(decode=[250, 1, 49], backend="chunked"), mode="inference",
        path="chunked_fused")
    # DeepSeek-V2's parts the book's class lacks: the decoupled rotary part, compressed queries
    # and the latents' RMSNorms, alone and together, forward and backward and through the cache
    # (the absorbed form with the rotary key cached beside the latent).
    deepseek = dict(rope_dim=4, q_latent_dim=6, latent_norm=True)
    mla("mla_rope_T37", 12, 16, 4, [2, 37, 12], latent_dim=6, args=dict(rope_dim=4))
    mla("mla_query_latent_T37", 12, 16, 4, [2, 37, 12], latent_dim=6,
        args=dict(q_latent_dim=6, latent_norm=True))
    mla("mla_deepseek_bias_T37_float64", 12, 16, 4, [2, 37, 12], "float64", latent_dim=6,
        qkv_bias=True, args=dict(deepseek, rope_theta=500.0))
    mla("mla_deepseek_T1024_chunked", 16, 32, 4, [1, 1024, 16], latent_dim=8,
        args=dict(deepseek, rope_dim=8), forward=dict(backend="chunked"), path="chunked_fused")
    mla("mla_deepseek_decode_chunks", 8, 16, 2, [2, 40, 8], latent_dim=5,
        args=deepseek, forward=dict(decode=[1, 7, 16, 3, 13]), mode="inference")
    mla("mla_deepseek_decode_token_by_token_float64", 8, 16, 4, [2, 12, 8], "float64",
        latent_dim=8, qkv_bias=True, args=dict(deepseek, rope_dim=2),
        forward=dict(decode=[1] * 12), mode="inference")


def sharing_cases(cases, add):
    """Cross-layer KV sharing: a stack of the book's MultiHeadAttentionWithKVSharing layers (later
    layers read the last producing layer's keys and values), forward and backward, and decoding
    with a KVCache for each producing layer only (forward["decode"]). Seeds of their own."""
    def stack(name, d_in, heads, layers, producing, shape, dtype="float32", **kw):
        args = dict(d_in=d_in, num_heads=heads, n_layers=layers,
                    n_kv_producing_layers=producing, qkv_bias=kw.pop("qkv_bias", False))
        add(name, "KVSharingStack", args, [shape], dtype, **kw)
        cases[-1]["seed"] = 4500 + len(names)
        names.append(name)

    names = []
    for dtype in ("float32", "float64"):
        stack(f"kv_sharing_T9_{dtype}", 8, 2, 4, 2, [2, 9, 8], dtype)
    stack("kv_sharing_one_producer_bias", 12, 3, 3, 1, [2, 37, 12], "float64", qkv_bias=True)
    stack("kv_sharing_decode_chunks", 8, 2, 4, 2, [2, 40, 8], "float64",
          forward=dict(decode=[1, 7, 16, 3, 13]), mode="inference")
    stack("kv_sharing_T1024_chunked", 16, 4, 3, 1, [1, 1024, 16],
          forward=dict(backend="chunked"), path="chunked_fused")


def gated_cases(cases, add):
    """Gated attention: the book's GatedMultiHeadAttention against MultiHeadAttention with
    gate(true), forward and backward, and decoding through a KVCache (forward["decode"]). Seeds
    of their own."""
    def gated(name, d_in, d_out, heads, shape, dtype="float32", qkv_bias=False, **kw):
        args = dict(d_in=d_in, d_out=d_out, context_length=shape[-2], dropout=0.0,
                    num_heads=heads, qkv_bias=qkv_bias)
        add(name, "GatedMultiHeadAttention", args, [shape], dtype, **kw)
        cases[-1]["seed"] = 4600 + len(names)
        names.append(name)

    names = []
    for dtype in ("float32", "float64"):
        gated(f"gated_T6_{dtype}", 8, 8, 2, [2, 6, 8], dtype)
    gated("gated_bias_T37", 12, 16, 4, [2, 37, 12], "float64", qkv_bias=True)
    gated("gated_saturated", 8, 8, 2, [2, 6, 8], magnitude=30.0)
    gated("gated_decode_chunks", 8, 16, 4, [2, 40, 8], "float64",
          forward=dict(decode=[1, 7, 16, 3, 13]), mode="inference")
    gated("gated_T1024_chunked", 16, 32, 4, [1, 1024, 16], forward=dict(backend="chunked"),
          path="chunked_fused")


def own_kernel_case(cases, add, names, first_seed, name, module, args, shape, dtype, **kw):
    """A case of a module with a fused CPU kernel of its own: forward["backend"] "chunked" unless
    given, the path that backend takes, and the next seed of the module's own series."""
    backend = kw.setdefault("forward", {}).setdefault("backend", "chunked")
    kw.setdefault("path", "chunked_fused" if backend != "math" else "math")
    add(name, module, args, [shape], dtype, **kw)
    cases[-1]["seed"] = first_seed + len(names)
    names.append(name)


def deltanet_cases(cases, add):
    """The book's GatedDeltaNet: forward and backward of its token-by-token loop against the C++
    module on the fused kernel ("chunked") and on the recurrence in ops ("math"), and decoding
    through a GatedDeltaNetState (forward["decode"]). Seeds of their own."""
    def net(name, d_in, d_out, heads, shape, dtype="float32", qkv_bias=False, **kw):
        args = dict(d_in=d_in, d_out=d_out, dropout=0.0, num_heads=heads, qkv_bias=qkv_bias)
        own_kernel_case(cases, add, names, 4700, name, "GatedDeltaNet", args, shape, dtype, **kw)

    names = []
    # The float32 cases' outputs and gradients are the float64 loop's on their float32 weights and
    # inputs, rounded: with the book's decay rates (A up to 16) the float32 loop's own rounding
    # puts its gradients up to 4e-5 off the float64 truth, as far as the fused kernel's are on
    # the other side, so two float32 results could differ by twice float32's tolerance while each
    # is as accurate as float32 allows.
    for dtype in ("float32", "float64"):
        wide = "float64" if dtype == "float32" else None
        net(f"deltanet_T6_{dtype}", 8, 8, 2, [2, 6, 8], dtype, computed_in=wide)
        net(f"deltanet_bias_T37_{dtype}", 12, 16, 4, [2, 37, 12], dtype, qkv_bias=True,
            computed_in=wide)
    net("deltanet_math_T37", 12, 16, 4, [2, 37, 12], "float64", forward=dict(backend="math"))
    net("deltanet_T1", 8, 32, 4, [3, 1, 8], computed_in="float64")
    # Saturated gates in float64: in float32 the gradients of W_query and W_key through the L2
    # normalization of such inputs are off the float64 truth by up to 6e-5 relative, in Python's
    # loop and in the fused kernel alike, beyond float32's tolerance of the comparison.
    net("deltanet_saturated_float64", 8, 8, 2, [2, 6, 8], "float64", magnitude=30.0)
    net("deltanet_T300_head64", 16, 128, 2, [1, 300, 16], computed_in="float64")
    net("deltanet_decode_token_by_token", 8, 16, 4, [2, 12, 8],
        forward=dict(decode=[1] * 12), mode="inference")
    net("deltanet_bias_decode_chunks_float64", 8, 16, 2, [2, 40, 8], "float64", qkv_bias=True,
        forward=dict(decode=[1, 7, 16, 3, 13]), mode="inference")


def dsa_cases(cases, add):
    """The book's MultiHeadAttentionWithDSA (its indexer choosing deterministically, see
    reference.LightningIndexer): forward and backward against DeepSeekSparseAttention on the fused
    kernel ("chunked") and on gathered keys in ops ("math"), and decoding through a
    SparseAttentionCache (forward["decode"]). Seeds of their own."""
    def dsa(name, d_in, d_out, heads, shape, dtype="float32", qkv_bias=False, index_heads=2,
            index_dim=4, topk=3, **kw):
        args = dict(d_in=d_in, d_out=d_out, dropout=0.0, num_heads=heads, qkv_bias=qkv_bias,
                    index_n_heads=index_heads, index_head_dim=index_dim, topk=topk)
        own_kernel_case(cases, add, names, 4800, name, "MultiHeadAttentionWithDSA", args, shape,
                        dtype, **kw)

    names = []
    for dtype in ("float32", "float64"):
        dsa(f"dsa_T6_{dtype}", 8, 8, 2, [2, 6, 8], dtype)
        dsa(f"dsa_bias_T37_{dtype}", 12, 16, 4, [2, 37, 12], dtype, qkv_bias=True, index_heads=4,
            index_dim=8, topk=8)
    dsa("dsa_math_T37", 12, 16, 4, [2, 37, 12], "float64", topk=8, forward=dict(backend="math"))
    dsa("dsa_topk_beyond_T", 8, 8, 2, [2, 9, 8], "float64", topk=64)
    dsa("dsa_topk1", 8, 8, 2, [2, 9, 8], "float64", topk=1)
    dsa("dsa_saturated_float64", 8, 8, 2, [2, 6, 8], "float64", magnitude=30.0)
    dsa("dsa_T300", 16, 32, 4, [1, 300, 16], index_heads=4, index_dim=16, topk=32)
    dsa("dsa_decode_token_by_token", 8, 16, 4, [2, 12, 8], topk=4,
        forward=dict(decode=[1] * 12), mode="inference")
    dsa("dsa_bias_decode_chunks_float64", 8, 16, 2, [2, 40, 8], "float64", qkv_bias=True, topk=5,
        forward=dict(decode=[1, 7, 16, 3, 13]), mode="inference")


# The book's config keys that the zoo's attention layers do not read (zoo_cases drops them).
ZOO_OTHER_KEYS = {"vocab_size", "hidden_dim", "n_layers", "layer_types", "logit_scale",
                  "tie_word_embeddings", "vocab_size_per_layer_input",
                  "hidden_size_per_layer_input", "num_kv_shared_layers", "use_double_wide_mlp",
                  "final_logit_softcap", "pad_token_id", "linear_conv_kernel_dim",
                  "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads",
                  "linear_num_value_heads"}


def zoo_cases(cases, add):
    """The attention layer of each family of the book's chapter-5 zoo (module "ZooAttention":
    reference.zoo_attention, book_zoo.py's Attention with its family's options, or its
    Gemma4Attention) against MultiHeadAttention with the matching options: forward and backward
    on each layer kind the family has, decoding through a KVCache (forward["decode"]) against
    Python's one forward, bfloat16 inference for two families. The configs are
    examples/zoo/tiny_configs.py's (emb_dim 32, 4 heads, 2 KV heads, head_dim 12 or 16, windows
    of 4), less the keys the attention does not read; Tiny Aya's with attention_bias, so that
    the biases of all four projections are compared too. The "_norms" cases add noise to the
    seeded norm weights (ones or zeros), so that their values matter; they and Llama 3.2, whose
    class draws W_key and W_value before W_query, are "seeded": false (the C++ module, seeded
    alike, draws other weights; the harness loads Python's and compares from there).
    float32, not float64: the stand-ins compute their norms and Gemma 4's softmax in float32
    whatever the input's dtype, so a float64 case would hold float32 roundings against a
    float64 tolerance. Gemma 4's training cases are computed in float64 (float32_casts_widened)
    and rounded: with its scale of 1 on unit-RMS queries and keys the softmax is sharp, and
    Python's own float32 gradients fall up to 2.5e-5 from the float64 ones (0.9 of float32's
    tolerance; the other families' within 0.13 of it). Seeds of their own."""
    reference.book_zoo()  # puts examples/zoo on the path
    import tiny_configs

    def config(family):
        cfg = {k: v for k, v in tiny_configs.config(family).items()
               if k not in ZOO_OTHER_KEYS and k != "dtype"}
        if family == "tiny_aya":
            cfg["attention_bias"] = True
        return cfg

    def zoo(name, family, layer, shape, dtype="float32", perturb_norms=False, **kw):
        args = dict(family=family, layer=f"{layer}_attention", **config(family))
        if perturb_norms:
            args["perturb_norms"] = True
        add(f"zoo_{family}_{name}", "ZooAttention", args, [shape], dtype, **kw)
        cases[-1]["seed"] = 4900 + len(names)
        cases[-1]["seeded"] = family != "llama32" and not perturb_norms
        names.append(name)

    names = []
    # Forward and backward on each layer kind; norm weights that matter on one kind of each
    # family with two (OLMo 3's over the whole projection among them). Batches of one past 16
    # tokens keep the files small.
    for family, layer, t, perturb in (("llama32", "full", 13, False), ("qwen3", "full", 9, False),
                                      ("gemma3", "sliding", 17, False),
                                      ("gemma3", "full", 11, True),
                                      ("olmo3", "sliding", 19, False),
                                      ("olmo3", "full", 10, True),
                                      ("tiny_aya", "sliding", 21, False),
                                      ("tiny_aya", "full", 12, False),
                                      ("qwen3_5", "full", 15, False),
                                      ("gemma4", "sliding", 23, True),
                                      ("gemma4", "full", 37, False)):
        zoo(f"{layer}{'_norms' if perturb else ''}_T{t}", family, layer,
            [2 if t <= 16 else 1, t, 32], perturb_norms=perturb,
            computed_in="float64" if family == "gemma4" else None)
    # Decoding through a KVCache, token by token or in chunks: the sliding kind where a family
    # has two (its window over the cache), Gemma 4's full one (its proportional rotary); norm
    # weights that matter for the families whose training case above has seeded ones.
    for family, layer, decode, perturb in (("llama32", "full", [1] * 12, False),
                                           ("qwen3", "full", [5] + [1] * 7, True),
                                           ("gemma3", "sliding", [1, 7, 16, 3, 13], False),
                                           ("olmo3", "sliding", [3, 1, 1, 6, 1, 1, 9], False),
                                           ("tiny_aya", "sliding", [1] * 10, False),
                                           ("qwen3_5", "full", [6, 1, 9, 1, 1], True),
                                           ("gemma4", "full", [4, 1, 1, 12, 1], False)):
        zoo(f"{layer}{'_norms' if perturb else ''}_decode", family, layer,
            [2 if sum(decode) <= 16 else 1, sum(decode), 32], forward=dict(decode=decode),
            mode="inference", perturb_norms=perturb)
    for family, layer, t in (("gemma3", "sliding", 24), ("qwen3_5", "full", 20)):
        zoo(f"{layer}_inference_bfloat16", family, layer, [1, t, 32], "bfloat16",
            mode="inference")


def block_mask_hidden(spec, t_q, t_k):
    """The dense mask of a case's block mask, from the kind's definition: (t_q, t_k) bool, true
    = hidden (the library's attn_mask convention)."""
    q = torch.arange(t_q)[:, None]
    k = torch.arange(t_k)[None, :]
    kind = spec["kind"]
    if kind == "document":
        ids = torch.cat([torch.full((n,), i) for i, n in enumerate(spec["lengths"])])
        visible = ids[q] == ids[k]
        if spec.get("causal"):
            visible = visible & (k <= q + (t_k - t_q))
    elif kind == "prefix_lm":
        visible = (k < spec["prefix"]) | (k <= q)
    elif kind == "global_dilated":
        g = spec["globals"]
        visible = (k < g) | (q < g) | ((q - k) % spec["dilation"] == 0)
    else:
        raise ValueError(f"unknown block mask kind {kind}")
    return ~visible


def make_inputs(case, dtype):
    if case["article"]:
        x = article_embedding()
        inputs = [x]
        if case["module"] == "CrossAttention":
            # The article draws x_2 right after constructing the module under seed 123.
            reference.build(case["module"], case["args"], case["seed"], dtype)
            inputs.append(torch.rand(8, 3))
        return [t.to(dtype) for t in inputs]
    torch.manual_seed(case["seed"] + 1)
    return [((torch.rand(*shape, dtype=torch.float64) * 2 - 1) * case["magnitude"]).to(dtype)
            for shape in case["shapes"]]



def input_names(case):
    if case["module"] != "MultiHeadAttention":
        return INPUT_NAMES.get(case["module"], ["x"])
    forward = case["forward"]
    return ["x"] + [name for name in ("context", "key_padding_mask", "attn_mask") if forward.get(name)]


def make_masks(case, inputs):
    """Key padding (true = padding, at the end of each sequence) and a random attention mask,
    both leaving every query at least one key."""
    forward, masks = case["forward"], {}
    x = inputs["x"]
    keys = inputs.get("context", x)
    b, t_q, t_k = x.shape[0], x.shape[1], keys.shape[1]
    torch.manual_seed(case["seed"] + 3)
    if forward.get("key_padding_mask"):
        lengths = torch.randint(1, t_k + 1, (b,))
        lengths[0] = t_k
        masks["key_padding_mask"] = torch.arange(t_k)[None, :] >= lengths[:, None]
    if forward.get("attn_mask"):
        mask = torch.rand(t_q, t_k) < 0.3
        mask[:, 0] = False
        masks["attn_mask"] = mask
    return masks


def module_attn_mask(case, x, context, attn_mask):
    """The attn_mask the book's module takes: the case's own, or its block mask's dense mask."""
    spec = case["forward"].get("block_mask")
    if spec is None:
        return attn_mask
    keys = x if context is None else context
    return block_mask_hidden(spec, x.shape[1], keys.shape[1])


def torch_mha_twin(module):
    """torch.nn.MultiheadAttention holding the book-style module's weights."""
    twin = torch.nn.MultiheadAttention(module.d_out, module.num_heads, bias=True, batch_first=True)
    twin = twin.to(module.out_proj.weight.dtype)
    with torch.no_grad():
        twin.in_proj_weight.copy_(torch.cat(
            [module.W_query.weight, module.W_key.weight, module.W_value.weight]))
        if module.W_query.bias is not None:
            twin.in_proj_bias.copy_(torch.cat(
                [module.W_query.bias, module.W_key.bias, module.W_value.bias]))
        else:
            twin.in_proj_bias.zero_()
        twin.out_proj.weight.copy_(module.out_proj.weight)
        twin.out_proj.bias.copy_(module.out_proj.bias)
    return twin


def run_mha(case, module, inputs, masks):
    """Output and weights of the case's forward, from the book-style reference or from
    torch.nn.MultiheadAttention; returns also a function giving the gradients by C++ name."""
    forward = case["forward"]
    x, context = inputs["x"], inputs.get("context")
    padding, attn_mask = masks.get("key_padding_mask"), masks.get("attn_mask")
    need_weights = forward.get("need_weights", False)
    average = forward.get("average_attn_weights", True)
    if case["against"] == "torch":
        twin = torch_mha_twin(module)
        t = x.shape[1]
        combined = attn_mask
        if case["args"]["causal"]:
            causal = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
            combined = causal if combined is None else combined | causal
        output, weights = twin(x, x, x, key_padding_mask=padding, attn_mask=combined,
                               need_weights=need_weights, average_attn_weights=average)

        def grads():
            q, k, v = twin.in_proj_weight.grad.chunk(3)
            out = {"W_query.weight": q, "W_key.weight": k, "W_value.weight": v,
                   "out_proj.weight": twin.out_proj.weight.grad,
                   "out_proj.bias": twin.out_proj.bias.grad}
            if module.W_query.bias is not None:
                bq, bk, bv = twin.in_proj_bias.grad.chunk(3)
                out.update({"W_query.bias": bq, "W_key.bias": bk, "W_value.bias": bv})
            return out
        return output, weights, grads
    if "packed" in forward:
        return packed_mha(module, x, context, forward), None, \
            lambda: {n: p.grad for n, p in module.named_parameters()}
    attn_mask = module_attn_mask(case, x, context, attn_mask)
    module.score_mod = forward.get("score_mod", "")
    output = module(x, context, padding, attn_mask)
    weights = None
    if need_weights:
        with torch.no_grad():
            weights, _ = module.attention_weights(x, context, padding, attn_mask)
            if average:
                weights = weights.mean(dim=1)
    return output, weights, lambda: {n: p.grad for n, p in module.named_parameters()}


def packed_mha(module, x, context, forward):
    """The book's module on each packed sequence alone (a batch of one), the outputs joined along
    the tokens again: x (total, d_in), context (total_kv, d_in_kv) or None."""
    lengths = forward["packed"]
    context_lengths = forward.get("packed_context", lengths)
    outputs, start, start_kv = [], 0, 0
    for n, n_kv in zip(lengths, context_lengths):
        x_s = x[start:start + n][None]
        c_s = None if context is None else context[start_kv:start_kv + n_kv][None]
        if n > 0:
            outputs.append(module(x_s, c_s)[0])
        start, start_kv = start + n, start_kv + n_kv
    return torch.cat(outputs, 0)


def run_inference(case):
    """The module and the tensors of an inference case: inputs and output, no gradients. A
    bfloat16 case is computed in float32 on its bfloat16 weights and inputs."""
    dtype = DTYPES[case["dtype"]]
    module = reference.build(case["module"], case["args"], case["seed"], dtype)
    names = input_names(case)
    inputs = dict(zip(names, make_inputs(case, dtype)))
    compute = copy.deepcopy(module).float() if dtype == torch.bfloat16 else module
    spec = case["forward"].get("paged")
    if spec:
        # A fork's tokens before it forked are its parent's.
        for child, (parent, length) in paged_lengths(spec, inputs["x"].shape[0])[1].items():
            inputs["x"][child, :length] = inputs["x"][parent, :length]
    with torch.no_grad():
        if spec:
            output = run_paged(compute, inputs["x"].float() if dtype == torch.bfloat16
                               else inputs["x"], spec)
            masks = {}
        elif case["module"] == "MultiHeadAttention":
            masks = make_masks(case, inputs)
            wide = {n: t.float() if dtype == torch.bfloat16 else t for n, t in inputs.items()}
            output, _, _ = run_mha(case, compute, wide, masks)
        else:
            masks = {}
            output = compute(*[t.float() if dtype == torch.bfloat16 else t
                               for t in inputs.values()])
    tensors = {f"input.{n}": t.clone() for n, t in {**inputs, **masks}.items()}
    tensors["output"] = output.clone()
    return module, tensors


def run_case(case):
    """The module, and every tensor of the case: inputs, output, upstream gradient, gradients."""
    if case["mode"] == "inference":
        return run_inference(case)
    dtype = DTYPES[case["dtype"]]
    module = reference.build(case["module"], case["args"], case["seed"], dtype)
    names = input_names(case)
    float_inputs = dict(zip(names, [t.requires_grad_() for t in make_inputs(case, dtype)]))
    weights = None
    if case["module"] == "MultiHeadAttention":
        masks = make_masks(case, float_inputs)
        output, weights, grads = run_mha(case, module, float_inputs, masks)
    elif case.get("computed_in"):
        # Computed in a wider dtype on the case's weights and inputs, then rounded to them.
        masks = {}
        wide_dtype = DTYPES[case["computed_in"]]
        wide = copy.deepcopy(module).to(wide_dtype)
        wide_inputs = [t.detach().to(wide_dtype).requires_grad_() for t in float_inputs.values()]
        with float32_casts_widened(case):
            wide_output = wide(*wide_inputs)
        output = wide_output.detach().to(dtype)
        torch.manual_seed(case["seed"] + 2)
        grad_output = torch.randn(output.shape, dtype=torch.float64).to(dtype)
        wide_output.backward(grad_output.to(wide_dtype))
        for t, w in zip(float_inputs.values(), wide_inputs):
            t.grad = w.grad.to(dtype)
        grads = lambda: {n: p.grad.to(dtype) if p.grad is not None  # noqa: E731
                         else torch.zeros_like(p) for n, p in wide.named_parameters()}
    else:
        masks = {}
        output = module(*float_inputs.values())
        # A parameter the output does not use (a KV-sharing reader's W_key) has no gradient: 0.
        grads = lambda: {n: p.grad if p.grad is not None else torch.zeros_like(p)  # noqa: E731
                         for n, p in module.named_parameters()}
    if not case.get("computed_in"):
        torch.manual_seed(case["seed"] + 2)
        grad_output = torch.randn(output.shape, dtype=torch.float64).to(dtype)
        output.backward(grad_output)

    tensors = {}
    for name, t in float_inputs.items():
        tensors[f"input.{name}"] = t.detach().clone()
        tensors[f"grad.{name}"] = t.grad.detach().clone()
    for name, t in masks.items():
        tensors[f"input.{name}"] = t.clone()
    tensors["output"] = output.detach().clone()
    if weights is not None:
        tensors["weights"] = weights.detach().clone()
    tensors["grad_output"] = grad_output
    for name, g in grads().items():
        tensors[f"grad.{name}"] = g.detach().clone()
    if case.get("computed_in"):
        case["tolerance"] = tolerance_of_own_dtype(case, tensors)
    return module, tensors


@contextlib.contextmanager
def float32_casts_widened(case):
    """For a ZooAttention case: Tensor.float() leaves float64 tensors as they are while the
    wide forward runs. book_zoo.py's classes compute their norms and Gemma 4's softmax in float32
    (x.float()) whatever the input's dtype, so their float64 run would still round there; in
    float64 throughout it is the float64 result of the same formulas. Other modules: nothing."""
    if case["module"] != "ZooAttention":
        yield
        return
    real = torch.Tensor.float

    def wide_float(self, *args, **kwargs):
        return self if self.dtype == torch.float64 else real(self, *args, **kwargs)
    torch.Tensor.float = wide_float
    try:
        yield
    finally:
        torch.Tensor.float = real


def tolerance_of_own_dtype(case, wide_tensors):
    """The tolerance of a case computed in a wider dtype: the dtype's own, or twice as far as the
    reference class computed in the case's dtype falls from the wide result, whichever is larger
    (a C++ result as accurate as Python's own in that dtype passes; one twice as far off fails)."""
    narrow_case = dict(case, computed_in=None)
    _, narrow = run_case(narrow_case)
    off = max(float((narrow[k].double() - t.double()).abs().max()) if t.numel() else 0.0
              for k, t in wide_tensors.items() if t.is_floating_point())
    base = TOLERANCE[case["dtype"]]
    return {"atol": max(base["atol"], 2 * off), "rtol": base["rtol"]}


def script(case, module):
    """The module as TorchScript: scripted, or traced on zeros of the case's input shape for
    ZooAttention (book_zoo.py's classes are not scriptable; the archive is for the weights)."""
    if case["module"] != "ZooAttention":
        return torch.jit.script(module)
    x = torch.zeros(case["shapes"][0], dtype=DTYPES[case["dtype"]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        return torch.jit.trace(module, x, check_trace=False)


def write(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    manifest = {"torch_version": torch.__version__, "cases": []}
    for case in case_list():
        module, tensors = run_case(case)
        name = case["name"]
        if getattr(module, "mask", None) is not None and module.mask.shape[0] > MAX_SAVED_MASK:
            module.mask = module.mask[:0, :0].clone()
        torch.jit.save(script(case, module.eval()), os.path.join(out_dir, f"{name}.pt"))
        torch.save(dict(module.state_dict()), os.path.join(out_dir, f"{name}.state_dict.pt"))
        safetensors_io.save(module.state_dict(), os.path.join(out_dir, f"{name}.safetensors"))
        torch.save(tensors, os.path.join(out_dir, f"{name}.tensors.pt"))
        manifest["cases"].append({
            "name": name,
            "module": case["module"],
            "args": case["args"],
            "seed": case["seed"],
            "dtype": case["dtype"],
            "inputs": input_names(case),
            "forward": case["forward"],
            "against": case["against"],
            "mode": case["mode"],
            "path": case["path"],
            "computed_in": case["computed_in"] or case["dtype"],
            "seeded": case.get("seeded", True),
            "shapes": {k: list(v.shape) for k, v in tensors.items()},
            "input_magnitude": case["magnitude"],
            "tolerance": case.get("tolerance", TOLERANCE[case["dtype"]]),
            "weights": f"{name}.pt",
            "state_dict": f"{name}.state_dict.pt",
            "safetensors": f"{name}.safetensors",
            "tensors": f"{name}.tensors.pt",
        })
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    return manifest


def load_case(directory, entry):
    weights = torch.jit.load(os.path.join(directory, entry["weights"])).state_dict()
    state_dict = torch.load(os.path.join(directory, entry["state_dict"]))
    state_dict.update({f"safetensors.{k}": v for k, v in
                       safetensors_io.load(os.path.join(directory, entry["safetensors"])).items()})
    tensors = torch.load(os.path.join(directory, entry["tensors"]))
    return {**{f"weight.{k}": v for k, v in weights.items()},
            **{f"state_dict.{k}": v for k, v in state_dict.items()}, **tensors}


def computed(key):
    """Whether a tensor of a case is computed (output, weights, gradients) rather than drawn from
    the seeded generator (inputs, module weights, upstream gradient)."""
    return key in ("output", "weights") or key.startswith("grad.")


def described(entry):
    """A manifest entry less what the processor's own rounding decides: the tolerance of a case
    computed in a wider dtype is measured where the goldens are made (tolerance_of_own_dtype), and
    float32's kernels round differently on AVX2 and AVX-512. The committed one is used."""
    return {k: v for k, v in entry.items() if not (k == "tolerance" and entry.get("computed_in"))}


def verify():
    """Regenerates the goldens and compares them with the committed ones: what the seeded
    generator draws (inputs, weights, upstream gradients) bit for bit; what is computed from it
    within each case's tolerance, since BLAS kernels round differently on other processors and
    under another torch generation."""
    with open(os.path.join(GOLDEN, "manifest.json")) as f:
        committed = json.load(f)
    same_generation = committed["torch_version"].split(".")[0] == torch.__version__.split(".")[0]
    with tempfile.TemporaryDirectory() as tmp:
        fresh = write(tmp)
        drifted = []
        old = {c["name"]: c for c in committed["cases"]}
        for entry in fresh["cases"]:
            name = entry["name"]
            if name not in old:
                drifted.append(f"{name}: not in the committed manifest")
                continue
            committed_entry = old.pop(name)
            if described(entry) != described(committed_entry):
                drifted.append(f"{name}: manifest entry differs")
                continue
            a, b = load_case(tmp, entry), load_case(GOLDEN, entry)
            tol = committed_entry["tolerance"]

            def same(key, x, y):
                exact = not x.is_floating_point() or (same_generation and not computed(key))
                if exact:
                    return torch.equal(x, y)
                return x.shape == y.shape and torch.allclose(x, y, rtol=tol["rtol"], atol=tol["atol"])
            for key in sorted(set(a) | set(b)):
                if key not in a or key not in b or not same(key, a[key], b[key]):
                    diff = ((a[key] - b[key]).abs().max().item()
                            if key in a and key in b and a[key].shape == b[key].shape else "shape")
                    drifted.append(f"{name}: {key} differs (max |diff| {diff})")
        drifted += [f"{name}: committed but no longer generated" for name in old]
    if drifted:
        print("golden drift:\n  " + "\n  ".join(drifted))
        return 1
    how = ("seeded tensors identical and computed ones within tolerance of" if same_generation else
           f"within tolerance (torch {torch.__version__} against {committed['torch_version']}) of")
    print(f"goldens: {len(fresh['cases'])} cases regenerated, {how} models/golden")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=GOLDEN)
    parser.add_argument("--verify", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.verify:
        sys.exit(verify())
    manifest = write(args.out)
    print(f"wrote {len(manifest['cases'])} cases to {args.out}")


if __name__ == "__main__":
    main()
