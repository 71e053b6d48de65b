#!/usr/bin/python3
"""The Python side of scripts/bench.sh: the same configurations as attention-bench, with the
reference modules, torch.nn.MultiheadAttention and PyTorch's scaled dot-product attention.
Prints one JSON record per measurement.

    bench_python.py [--threads N] [--repeats N] [--quick] GROUP...
    groups: matmul article raschka raschka-train core-train dtypes long:T long-train:T
            block-attention:T
            operators (python/attention_ops: its library from ATTENTION_OPS_LIBRARY)
"""

import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import reference  # noqa: E402

TORCH2 = int(torch.__version__.split(".")[0]) >= 2
ALLOCATOR = "tcmalloc" if "tcmalloc" in os.environ.get("LD_PRELOAD", "") else "glibc"


def median_ms(fn, repeats, warm_up=True):
    if warm_up:
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def record(group, impl, pass_, t, ms, gflop, peak_mb=-1.0):
    print(json.dumps({"lang": "python", "group": group, "impl": impl, "pass": pass_, "T": t,
                      "ms": round(ms, 4), "gflops": round(gflop * 1e3 / ms, 2) if gflop else 0.0,
                      "peak_mb": round(peak_mb, 1), "threads": torch.get_num_threads(),
                      "allocator": ALLOCATOR, "torch": torch.__version__}), flush=True)


def progress(what):
    print(f"bench_python: {what} ({ALLOCATOR})", file=sys.stderr, flush=True)


def sdpa(q, k, v, causal):
    if hasattr(F, "scaled_dot_product_attention"):  # public from PyTorch 2.0
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return F._scaled_dot_product_attention(q, k, v, None, 0.0, False, causal)[0]


def mha_gflop(b, t, d, causal):
    return (4.0 * 2 * b * t * d * d + 2.0 * 2 * b * t * t * d * (0.5 if causal else 1.0)) / 1e9


def bench_matmul(args):
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    c = torch.empty(2048, 2048)
    record("matmul", "mm_2048", "forward", 2048,
           median_ms(lambda: torch.mm(a, b, out=c), args.repeats), 2.0 * 2048 ** 3 / 1e9)


def bench_article(args):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(123)
    sa = reference.SelfAttention(3, 2, 4)
    x = torch.rand(6, 3)
    calls = 200 if args.quick else 20000

    def run():
        for _ in range(calls):
            sa(x)
    with torch.no_grad():
        ms = median_ms(run, args.repeats)
    record("article", "python.self_attention", "forward", 6, ms * 1000.0 / calls, 0)  # us/call
    torch.set_num_threads(threads)


def bench_raschka(args, train):
    b, t, d, h = (2, 128, 64, 4) if args.quick else (8, 1024, 768, 12)
    group, pass_ = ("raschka-train", "forward+backward") if train else ("raschka", "forward")
    repeats = max(1, args.repeats // 2) if train else args.repeats  # training steps take seconds
    torch.manual_seed(0)
    x = torch.randn(b, t, d, requires_grad=train)
    gflop = mha_gflop(b, t, d, True) * (3.0 if train else 1.0)
    causal = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)

    def run(impl, forward, flop=gflop):
        progress(f"{group} {impl}")

        def step():
            y = forward()
            if train:
                y.sum().backward()
        with torch.set_grad_enabled(train):
            record(group, impl, pass_, t, median_ms(step, repeats), flop)

    book = reference.MultiHeadAttention(d, d, t, 0.0, h)
    run("python.book_mha", lambda: book(x))
    nn_mha = torch.nn.MultiheadAttention(d, h, batch_first=True)
    run("python.nn_mha", lambda: nn_mha(x, x, x, attn_mask=causal, need_weights=False)[0])
    if not train:
        wrapper = reference.MultiHeadAttentionWrapper(d, d // h, d // h, h)
        run("python.wrapper", lambda: wrapper(x),
            (3.0 * 2 * b * t * d * d + 2.0 * 2 * b * t * t * d) / 1e9)
        q = torch.randn(b, h, t, d // h)
        k, v = torch.randn_like(q), torch.randn_like(q)
        run("python.core.sdpa", lambda: sdpa(q, k, v, True), 2.0 * b * t * t * d / 1e9)


def bench_long(args, t):
    with torch.no_grad():
        q = torch.randn(1, 8, t, 64)
        k, v = torch.randn_like(q), torch.randn_like(q)
        # The peak of one call (the warm-up) above the inputs, and the median of three after it,
        # as attention-bench's long runs.
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        sdpa(q, k, v, True)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base
        ms = median_ms(lambda: sdpa(q, k, v, True), 3, warm_up=False)
    record("long", "python.core.sdpa", "forward", t, ms, 2.0 * 8 * t * t * 64 / 1e9, peak)


def bench_core_train(args):
    """The attention core's forward and backward, as attention-bench's core-train."""
    b, t, d, h = (2, 128, 64, 4) if args.quick else (8, 1024, 768, 12)
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, t, d // h, requires_grad=True) for _ in range(3))
    upstream = torch.randn(b, h, t, d // h)

    def step():
        torch.autograd.grad(sdpa(q, k, v, True), (q, k, v), upstream)
    progress("core-train sdpa")
    record("core-train", "python.core.sdpa", "forward+backward", t,
           median_ms(step, max(1, args.repeats // 2)), 7.0 * b * h * t * t * (d // h) / 1e9)


def interleaved_medians(fns, repeats):
    """Each call of `fns` in turn, `repeats` rounds after one warm-up round; the median of each, so
    that the host's drift moves them together (attention-bench's interleaved_medians)."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, out in zip(fns, times):
            start = time.perf_counter()
            fn()
            out.append((time.perf_counter() - start) * 1e3)
    return [statistics.median(t) for t in times]


def bench_dtypes(args):
    """PyTorch's SDPA as attention-bench's dtypes core (B=8, H=12, T=1024, head size 64, causal)
    and a 2048^2 matmul, float32 and bfloat16 in turn: forward, and forward and backward."""
    b, t, d, h = (2, 128, 64, 4) if args.quick else (8, 1024, 768, 12)
    inputs = []
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        q, k, v = (torch.randn(b, h, t, d // h).to(dtype).requires_grad_() for _ in range(3))
        upstream = torch.randn(b, h, t, d // h).to(dtype)
        a, m = torch.randn(2048, 2048).to(dtype), torch.randn(2048, 2048).to(dtype)
        inputs.append((str(dtype).split(".")[1], q, k, v, upstream, a, m))

    def forward(q, k, v):
        with torch.no_grad():
            sdpa(q, k, v, True)
    progress("dtypes sdpa and matmul: float32 and bfloat16 in turn")
    forward_ms = interleaved_medians([lambda i=i: forward(*i[1:4]) for i in inputs], args.repeats)
    train_ms = interleaved_medians(
        [lambda i=i: torch.autograd.grad(sdpa(*i[1:4], True), i[1:4], i[4]) for i in inputs],
        max(1, args.repeats // 2))
    matmul_ms = interleaved_medians([lambda i=i: torch.mm(i[5], i[6]) for i in inputs],
                                    args.repeats)
    forward_gflop = 2.0 * b * h * t * t * (d // h) / 1e9
    for i, (name, *_) in enumerate(inputs):
        record("dtypes", f"python.core.sdpa.{name}", "forward", t, forward_ms[i], forward_gflop)
        record("dtypes", f"python.core.sdpa.{name}", "forward+backward", t, train_ms[i],
               3.5 * forward_gflop)
        record("dtypes", f"python.mm_2048.{name}", "forward", 2048, matmul_ms[i],
               2.0 * 2048 ** 3 / 1e9)


def bench_long_train(args, t):
    q, k, v = (torch.randn(1, 8, t, 64, requires_grad=True) for _ in range(3))
    upstream = torch.randn(1, 8, t, 64)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    ms = median_ms(lambda: torch.autograd.grad(sdpa(q, k, v, True), (q, k, v), upstream), 1)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base
    record("long-train", "python.core.sdpa", "forward+backward", t, ms,
           7.0 * 8 * t * t * 64 / 1e9, peak)


def bench_block_attention(args, t):
    """16 causal documents in T positions (attention-bench block-attention:T): PyTorch's SDPA with
    the dense bool mask, and FlexAttention eagerly with its block mask (2.5 and later; at T above
    8192 its whole score matrix would not fit this machine, so it is left out there). B=1, H=4,
    head size 64; forward and forward+backward; the peak of each first call above the process's
    peak so far (SDPA first: FlexAttention's is the larger), one T per process for the peaks."""
    length = (t + 15) // 16
    ids = torch.arange(t) // length
    positions = torch.arange(t)
    visible = (ids[:, None] == ids[None, :]) & (positions[None, :] <= positions[:, None])
    shape = (1, 4, t, 64)

    def timed(name, call, train):
        q, k, v = (torch.randn(shape, requires_grad=train) for _ in range(3))
        upstream = torch.randn(shape)

        def once():
            with torch.set_grad_enabled(train):
                out = call(q, k, v)
                if train:
                    out.backward(upstream)

        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        once()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base
        ms = median_ms(once, 1 if train else args.repeats, warm_up=False)
        pass_ = "forward+backward" if train else "forward"
        record("block-attention", name, pass_, t, ms, 0, peak)
        progress(f"block-attention documents T={t} {pass_}: {name} {ms:.1f} ms, peak +{peak:.0f} MB")

    flex = None
    if t <= 8192:
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
            block_mask = create_block_mask(
                lambda b, h, q, kv: (ids[q] == ids[kv]) & (kv <= q), None, None, t, t,
                device="cpu")
            flex = lambda q, k, v: flex_attention(q, k, v, block_mask=block_mask)  # noqa: E731
        except ImportError:
            progress("block-attention: this PyTorch has no flex_attention")
    for train in (False, True):
        timed("python.core.sdpa.dense_mask.documents",
              lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=visible), train)
        if flex is not None:
            try:
                timed("python.core.flex_attention.documents", flex, train)
            except (RuntimeError, NotImplementedError) as error:
                progress(f"block-attention: flex_attention {'backward' if train else 'forward'} "
                         f"refused: {str(error).splitlines()[0]}")


def bench_operators(args):
    """The library's operators (python/attention_ops) beside what PyTorch offers a Python user,
    in one process: the attention core (B=8, H=12, T=1024, d=64, causal; and B=1, H=8, T=8192)
    against F.scaled_dot_product_attention (1.13: its private _scaled_dot_product_attention),
    and the Raschka module (B=8, T=1024, d_model 768, 12 heads) against nn.MultiheadAttention
    and the book's class, forward and forward+backward, each through its Python call."""
    try:
        import attention_ops
    except ImportError as error:
        progress(f"operators: attention_ops not importable ({error}); skipped")
        return
    b, t, d, h = (2, 128, 64, 4) if args.quick else (8, 1024, 768, 12)
    long_t = 512 if args.quick else 8192
    torch.manual_seed(0)

    def timed(impl, t_, call, inputs, train, gflop):
        def step():
            with torch.set_grad_enabled(train):
                out = call()
                if train:
                    torch.autograd.grad(out, inputs, torch.ones_like(out))
        progress(f"operators {impl} T={t_} {'forward+backward' if train else 'forward'}")
        repeats = max(1, args.repeats // 2) if train else args.repeats
        ms = median_ms(step, repeats)
        record("operators", impl, "forward+backward" if train else "forward", t_, ms,
               gflop * (3.5 if train else 1.0))

    for batch, heads, length in ((b, h, t), (1, 8, long_t)):
        q, k, v = (torch.randn(batch, heads, length, 64, requires_grad=True) for _ in range(3))
        flop = 2.0 * batch * heads * length * length * 64 / 1e9
        for train in (False, True):
            timed("python.ops.core", length, lambda: attention_ops.scaled_dot_product_attention(
                q, k, v, is_causal=True), (q, k, v), train, flop)
            # 1.13's SDPA is whole score matrices: at T=8192 its training step holds 6 GiB.
            if length == t or TORCH2 or not train:
                timed("python.core.sdpa", length, lambda: sdpa(q, k, v, True), (q, k, v), train,
                      flop)
    x = torch.randn(b, t, d, requires_grad=True)
    causal = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
    ours = attention_ops.MultiHeadAttention(d, d, t, 0.0, h)
    book = reference.MultiHeadAttention(d, d, t, 0.0, h)
    nn_mha = torch.nn.MultiheadAttention(d, h, batch_first=True)
    for train in (False, True):
        timed("python.ops.mha", t, lambda: ours(x), (x,), train, mha_gflop(b, t, d, True))
        timed("python.nn_mha", t,
              lambda: nn_mha(x, x, x, attn_mask=causal, need_weights=False)[0], (x,), train,
              mha_gflop(b, t, d, True))
        timed("python.book_mha", t, lambda: book(x), (x,), train, mha_gflop(b, t, d, True))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("groups", nargs="+")
    args = parser.parse_args()
    if args.quick:
        args.repeats = 1
    torch.set_num_threads(args.threads)
    print(f"bench_python: {torch.get_num_threads()} thread(s), torch {torch.__version__}, "
          f"allocator {ALLOCATOR}", file=sys.stderr)
    for group in args.groups:
        if group == "matmul":
            bench_matmul(args)
        elif group == "article":
            bench_article(args)
        elif group in ("raschka", "raschka-train"):
            bench_raschka(args, group == "raschka-train")
        elif group == "core-train":
            bench_core_train(args)
        elif group == "dtypes":
            bench_dtypes(args)
        elif group.startswith("long-train:"):
            bench_long_train(args, int(group.split(":")[1]))
        elif group.startswith("long:"):
            bench_long(args, int(group.split(":")[1]))
        elif group == "operators":
            bench_operators(args)
        elif group.startswith("block-attention:"):
            bench_block_attention(args, int(group.split(":")[1]))
        else:
            sys.exit(f"bench_python: unknown group {group}")


if __name__ == "__main__":
    main()
