#!/usr/bin/python3
"""One attention layer of the book's chapter-5 zoo at the real models' sizes, timed in Python as
the book's classes compute it: the Python side of `attention-bench zoo-layer`. Prints one JSON
record per measurement, in attention-bench's style.

    bench_zoo.py [--threads N] [--repeats N] [--quick] [--verify-book PATH]

Layers (examples/zoo/book_zoo.Attention, built with dtype=... as the book builds its models, so
a bfloat16 layer draws its init in bfloat16; seed 0 before each):
  qwen3_0_6b  Qwen3-0.6B: d_in 1024, 16 heads, 8 key/value heads, head_dim 128, QK-norm (Qwen3
              RMSNorm), softmax(scores / sqrt(128)), causal, rotary base 1e6;
  gemma3_1b   Gemma 3 1B's sliding layers: d_in 1152, 4 heads, 1 key/value head, head_dim 256,
              QK-norm (zero-centred RMSNorm), queries * 256^-0.5, window 512, rotary base 10000.
Each in float32 and bfloat16, B=1, no_grad, eval, median of --repeats after a warm-up:
  prefill        T=2048 (--quick: 128): the stand-in's forward, given the mask (masks_for:
                 causal, or sliding with the window) and the rotary tables (rope_tables), both
                 built beforehand as the book's models build them once per forward;
  decode_step    one token after 4096 cached ones (--quick: 256), as the book's KV-cache classes
                 do a step (ch05/11_qwen3/standalone-qwen3-plus-kvcache.ipynb cell 11,
                 ch05/12_gemma3/standalone-gemma3-plus-kvcache.ipynb cells 11-12), written out
                 below with the stand-in's modules: project the token, QK-norm, rotary at its
                 position, torch.cat onto the cached keys and values, repeat_interleave to the
                 query heads, attend with the mask row, out_proj. Qwen3 caches rotated keys, all
                 4096 of them; Gemma 3 caches unrotated keys, trimmed by the block to the last
                 512, so a step concatenates 512 + 1 keys, rotates all 513 again (offset
                 position - 512), concatenates a second time for the next cache and trims it.
                 Every repeat starts from the same cache (the new cache is dropped), so each
                 times the step at position 4096. T in the record is the cached count;
  decode_mask    what the book's model does once per step for all its layers before them: the
                 mask row, built as the whole (pos + 1) x (pos + 1) mask and sliced
                 (Qwen3Model.forward: triu(ones) then [pos:pos + 1]; Gemma3Model._create_masks:
                 the causal and the sliding mask, triu | triu(...).T, both sliced). It grows
                 with the square of the position, so it is timed apart: a one-layer book model's
                 step is decode_step + decode_mask; a 28-layer Qwen3-0.6B pays the mask once
                 for 28 decode_steps (Gemma 3 1B: once for 26).
"gflops" uses attention-bench's counts for the same record (so rates compare as times do):
projections plus half of the causal T^2 products for prefill (the window not discounted),
projections plus the products over all cached tokens for decode_step; 0 for decode_mask.

--verify-book PATH runs first, at these sizes with a short cache: the book's own
GroupedQueryAttention of each KV-cache notebook (loaded from PATH as
examples/zoo/check_against_book.py loads notebooks) given the layer's weights must give the same
cache after a prefill of 600 tokens (Gemma 3: trimmed to 512) and the same output and next cache
for a step, bit for bit, in float32 and bfloat16; and the book's mask expressions (its
Gemma3Model._create_masks itself) the same mask rows. Exits 1 on a difference.

Runs on PyTorch 1.13 (Debian 12's /usr/bin/python3) and 2.x, with torch alone.
"""

import argparse
import sys
import types
from pathlib import Path

import torch

ZOO = Path(__file__).resolve().parent.parent / "examples" / "zoo"
sys.path.insert(0, str(ZOO))
import book_zoo  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_python import median_ms, record  # noqa: E402  the records of scripts/bench_python.py

# name: the stand-in's Attention arguments, the rotary base, the sliding window (None: causal)
LAYERS = {
    "qwen3_0_6b": (dict(d_in=1024, heads=16, kv_heads=8, head_dim=128, qk_norm="qwen3"),
                   1_000_000.0, None),
    "gemma3_1b": (dict(d_in=1152, heads=4, kv_heads=1, head_dim=256, qk_norm="gemma3",
                       scale=("queries", 256 ** -0.5)), 10_000.0, 512),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def progress(what):
    print(f"bench_zoo: {what}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------
# The book's KV-cache step, written out with the stand-in's modules (att: book_zoo.Attention,
# whose W_query, W_key, W_value, out_proj, q_norm and k_norm are the book's modules' twins).


def apply_rope(x, cos, sin, offset=0):
    """The KV-cache notebooks' apply_rope: the rows offset.. of the tables, rotate-half, in
    float32 (x times a float32 table promotes), cast back to x's dtype."""
    batch_size, num_heads, seq_len, head_dim = x.shape
    x1 = x[..., : head_dim // 2]
    x2 = x[..., head_dim // 2:]
    cos = cos[offset:offset + seq_len, :].unsqueeze(0).unsqueeze(0)
    sin = sin[offset:offset + seq_len, :].unsqueeze(0).unsqueeze(0)
    rotated = torch.cat((-x2, x1), dim=-1)
    x_rotated = (x * cos) + (rotated * sin)
    return x_rotated.to(dtype=x.dtype)


def project(att, x):
    """Projections, heads, QK-norm: the start of both notebooks' GroupedQueryAttention.forward."""
    b, num_tokens, _ = x.shape
    queries, keys, values = att.W_query(x), att.W_key(x), att.W_value(x)
    queries = queries.view(b, num_tokens, att.heads, att.head_dim).transpose(1, 2)
    keys_new = keys.view(b, num_tokens, att.kv_heads, att.head_dim).transpose(1, 2)
    values_new = values.view(b, num_tokens, att.kv_heads, att.head_dim).transpose(1, 2)
    if att.q_norm is not None:
        queries = att.q_norm(queries)
    if att.k_norm is not None:
        keys_new = att.k_norm(keys_new)
    return queries, keys_new, values_new


def attend(att, queries, keys, values, mask, divide):
    """Repeat the key/value heads, scores, mask, softmax (Qwen3 divides the scores by
    sqrt(head_dim) inside it; Gemma 3 scaled the queries before), context, out_proj."""
    b, _, num_tokens, _ = queries.shape
    group = att.heads // att.kv_heads
    keys = keys.repeat_interleave(group, dim=1)
    values = values.repeat_interleave(group, dim=1)
    attn_scores = queries @ keys.transpose(2, 3)
    attn_scores = attn_scores.masked_fill(mask, -torch.inf)
    attn_weights = torch.softmax(attn_scores / att.head_dim ** 0.5 if divide else attn_scores,
                                 dim=-1)
    context = (attn_weights @ values).transpose(1, 2).reshape(b, num_tokens,
                                                                att.heads * att.head_dim)
    return att.out_proj(context)


def qwen3_step(att, x, mask, cos, sin, start_pos, cache):
    """standalone-qwen3-plus-kvcache.ipynb, GroupedQueryAttention.forward with a cache: the new
    keys rotated at start_pos, then concatenated to the cached (rotated) ones."""
    queries, keys_new, values_new = project(att, x)
    queries = apply_rope(queries, cos, sin, offset=start_pos)
    keys_new = apply_rope(keys_new, cos, sin, offset=start_pos)
    prev_k, prev_v = cache
    keys = torch.cat([prev_k, keys_new], dim=2)
    values = torch.cat([prev_v, values_new], dim=2)
    return attend(att, queries, keys, values, mask, divide=True), (keys, values)


def gemma3_step(att, x, mask_local, cos, sin, start_pos, cache, window):
    """standalone-gemma3-plus-kvcache.ipynb, a sliding layer's TransformerBlock.forward around
    GroupedQueryAttention.forward with a cache: the mask's last (cached + 1) columns; the cache
    holds unrotated keys, so all of them are concatenated with the new one and rotated again
    from position start_pos - cached; queries scaled; the cache concatenated again for the next
    step and trimmed to the window."""
    attn_mask = mask_local[..., -(cache[0].size(2) + x.size(1)):]
    queries, keys_new, values_new = project(att, x)
    prev_k, prev_v = cache
    prev_len = prev_k.size(2)
    keys_cat_raw = torch.cat([prev_k, keys_new], dim=2)
    values_cat_raw = torch.cat([prev_v, values_new], dim=2)
    queries = apply_rope(queries, cos, sin, offset=start_pos)
    keys = apply_rope(keys_cat_raw, cos, sin, offset=start_pos - prev_len)
    queries = queries * att.scale[1]
    next_cache = (torch.cat([cache[0], keys_new], dim=2), torch.cat([cache[1], values_new], dim=2))
    out = attend(att, queries, keys, values_cat_raw, attn_mask, divide=False)
    k, v = next_cache
    if k.size(2) > window:
        k, v = k[:, :, -window:, :], v[:, :, -window:, :]
    return out, (k, v)


def prime_cache(att, h, cos, sin, window):
    """The cache the book's prefill of h leaves (that forward's keys and values, without its
    attention): Qwen3 the rotated keys; Gemma 3 the unrotated ones, the last `window`."""
    _, keys, values = project(att, h)
    if window is None:
        return apply_rope(keys, cos, sin, offset=0), values
    return keys[:, :, -window:, :], values[:, :, -window:, :]


def step_masks(pos, window):
    """The book model's mask for one new token at position pos (the (pos + 1)-square mask
    sliced to row pos, (1, 1, 1, pos + 1)): Qwen3Model.forward's causal one; for a window, the
    sliding one of Gemma3Model._create_masks, which builds the causal one too."""
    pos_end = pos + 1
    if window is None:
        mask = torch.triu(torch.ones(pos_end, pos_end, dtype=torch.bool), diagonal=1)
        return mask[pos:pos_end, :pos_end][None, None, :, :]
    return gemma3_masks(pos, pos_end, window)[1]


def gemma3_masks(pos_start, pos_end, window):
    """Gemma3Model._create_masks: (the full layers' mask, the sliding layers' mask)."""
    ones = torch.ones((pos_end, pos_end), dtype=torch.bool)
    mask_global_full = torch.triu(ones, diagonal=1)
    far_past_full = torch.triu(ones, diagonal=window).T
    mask_local_full = mask_global_full | far_past_full
    row_slice = slice(pos_start, pos_end)
    return (mask_global_full[row_slice, :pos_end][None, None, :, :],
            mask_local_full[row_slice, :pos_end][None, None, :, :])


def make_layer(name, dtype):
    kwargs, base, window = LAYERS[name]
    torch.manual_seed(0)
    att = book_zoo.Attention(dtype=dtype, **kwargs).eval()
    return att, base, window


def step(att, x, mask, cos, sin, pos, cache, window):
    """The layer's step: Qwen3's without a window, Gemma 3's sliding one with it."""
    if window is None:
        return qwen3_step(att, x, mask, cos, sin, pos, cache)
    return gemma3_step(att, x, mask, cos, sin, pos, cache, window)


# ------------------------------------------------------------------------------------------------


def bench(args):
    prefill, cached = (128, 256) if args.quick else (2048, 4096)
    for name, (kwargs, _, _) in LAYERS.items():
        d, hd = kwargs["d_in"], kwargs["head_dim"]
        heads, kv = kwargs["heads"], kwargs["kv_heads"]
        projections = 2.0 * d * hd * (2 * heads + 2 * kv)  # per token
        for dtype_name, dtype in DTYPES.items():
            att, base, window = make_layer(name, dtype)
            tag = f"python.book.{name}.{dtype_name}"
            cos, sin = book_zoo.rope_tables(book_zoo.rope_inv_freq(hd, base),
                                            max(prefill, cached + 1))
            x = torch.randn(1, prefill, d).to(dtype)
            masks = book_zoo.masks_for(prefill, window)
            mask = masks["sliding_attention" if window else "full_attention"]
            prefill_ms = median_ms(lambda: att(x, mask, cos, sin), args.repeats)
            record("zoo-layer", f"{tag}.prefill", "forward", prefill, prefill_ms,
                   (projections * prefill + 2.0 * 2 * heads * prefill * prefill * hd * 0.5) / 1e9)

            cache = prime_cache(att, torch.randn(1, cached, d).to(dtype), cos, sin, window)
            token = torch.randn(1, 1, d).to(dtype)
            row = step_masks(cached, window)
            step_ms = median_ms(lambda: step(att, token, row, cos, sin, cached, cache, window),
                                args.repeats)
            record("zoo-layer", f"{tag}.decode_step", "forward", cached, step_ms,
                   (projections + 2.0 * 2 * heads * cached * hd) / 1e9)
            mask_ms = median_ms(lambda: step_masks(cached, window), args.repeats)
            record("zoo-layer", f"{tag}.decode_mask", "forward", cached, mask_ms, 0)
            progress(f"zoo-layer {tag}: prefill {prefill_ms:.1f} ms, decoding step "
                     f"{step_ms:.3f} ms, its mask {mask_ms:.3f} ms")


def verify(book):
    """The steps above against the book's own classes (see the docstring)."""
    import check_against_book  # examples/zoo: its notebook loader and stand-ins
    check_against_book.install_stand_ins()
    notebooks = {"qwen3_0_6b": "ch05/11_qwen3/standalone-qwen3-plus-kvcache.ipynb",
                 "gemma3_1b": "ch05/12_gemma3/standalone-gemma3-plus-kvcache.ipynb"}
    failed = False
    for name, notebook in notebooks.items():
        module = check_against_book.load_notebook(Path(book) / notebook)
        kwargs, base, window = LAYERS[name]
        prompt, hd, d = 600, kwargs["head_dim"], kwargs["d_in"]
        cos, sin = book_zoo.rope_tables(book_zoo.rope_inv_freq(hd, base), prompt + 1)
        # The book's own mask row: Qwen3Model.forward's expression is inline, Gemma 3's method
        # is called on a stand-in `self`.
        if window is None:
            book_row = torch.triu(torch.ones(prompt + 1, prompt + 1, dtype=torch.bool),
                                  diagonal=1)[prompt:prompt + 1, :prompt + 1][None, None, :, :]
        else:
            book_masks = module.Gemma3Model._create_masks(
                types.SimpleNamespace(cfg={"sliding_window": window}), cur_len=1,
                device=torch.device("cpu"), pos_start=prompt, pos_end=prompt + 1)
            book_row = book_masks[1]
        same = [torch.equal(step_masks(prompt, window), book_row)]
        if window is not None:
            same += [all(map(torch.equal, gemma3_masks(prompt, prompt + 1, window), book_masks))]
        for dtype_name, dtype in DTYPES.items():
            att, _, _ = make_layer(name, dtype)
            extra = {} if window is None else {"query_pre_attn_scalar": 256}
            theirs = module.GroupedQueryAttention(d, kwargs["heads"], kwargs["kv_heads"], hd,
                                                  qk_norm=True, dtype=dtype, **extra).eval()
            theirs.load_state_dict(att.state_dict())
            gen = torch.Generator().manual_seed(1)
            h = torch.randn(1, prompt, d, generator=gen).to(dtype)
            token = torch.randn(1, 1, d, generator=gen).to(dtype)
            # The book's prefill (cache None) and the block's trim, then its step.
            prefill_mask = book_zoo.masks_for(prompt, window)[
                "sliding_attention" if window else "full_attention"]
            _, book_cache = theirs(h, prefill_mask, cos, sin, start_pos=0, cache=None)
            if window is not None:
                book_cache = tuple(c[:, :, -window:, :] for c in book_cache)
            mask_for_att = book_row if window is None else \
                book_row[..., -(book_cache[0].size(2) + 1):]
            book_out, book_next = theirs(token, mask_for_att, cos, sin, start_pos=prompt,
                                         cache=book_cache)
            if window is not None:
                book_next = tuple(c[:, :, -window:, :] for c in book_next)
            ours_cache = prime_cache(att, h, cos, sin, window)
            ours_out, ours_next = step(att, token, step_masks(prompt, window), cos, sin,
                                       prompt, ours_cache, window)
            same += [all(map(torch.equal, ours_cache, book_cache)),
                     torch.equal(ours_out, book_out), all(map(torch.equal, ours_next, book_next)),
                     ours_next[0].shape == book_next[0].shape]
        ok = all(same)
        failed |= not ok
        progress(f"verify {name} against {notebook}: mask row, primed cache, step output and "
                 f"next cache {'identical' if ok else 'DIFFER'} (float32, bfloat16)")
    return not failed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="T 128, 256 cached: a smoke test")
    parser.add_argument("--verify-book", metavar="PATH",
                        help="first check the steps against the book's classes in this tree")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    if args.verify_book and not verify(args.verify_book):
        return 1
    bench(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
