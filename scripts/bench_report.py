#!/usr/bin/python3
"""Turns the records of scripts/bench.sh (OUT/cpp.jsonl, OUT/python.jsonl, and the same in
OUT/libtorch2 when LibTorch 2 was measured too, with the runs forced to AVX2 there) into
OUT/results.json, OUT/table.md (the targets with their ratios, then every measurement, a column
group per LibTorch generation) and OUT/*.png plots."""

import json
import os
import sys


def load(out, names=("cpp.jsonl", "python.jsonl")):
    records = []
    for name in names:
        path = os.path.join(out, name)
        if os.path.exists(path):
            with open(path) as f:
                records += [json.loads(line) for line in f if line.startswith("{")]
    return records


def version(records):
    """The LibTorch version of a set of records, as major.minor."""
    full = next((r["torch"] for r in records if "torch" in r), "?")
    return ".".join(full.split(".")[:2])


def find(records, group, impl, t=None, allocator="glibc"):
    for r in records:
        if (r["group"] == group and r["impl"] == impl and (t is None or r["T"] == t)
                and r.get("allocator", "glibc") == allocator):
            return r
    return None


def ratio(a, b, key="ms"):
    return a[key] / b[key] if a and b and b[key] else None


def fmt(x, digits=2):
    return "n/a" if x is None else f"{x:.{digits}f}"


def targets(records, second, avx2):
    rows = []

    def target(name, value, limit, at_most=True):
        met = None if value is None else (value <= limit if at_most else value >= limit)
        rows.append((name, fmt(value), ("<= " if at_most else ">= ") + str(limit),
                     {None: "not measured", True: "met", False: "missed"}[met]))

    target("1. article SelfAttention forward, C++ / Python eager time per call",
           ratio(find(records, "article", "cpp.self_attention"),
                 find(records, "article", "python.self_attention")), 0.5)
    auto = find(records, "raschka", "cpp.fused.auto")
    target("2a. Raschka config, fused (Auto) / Python nn.MultiheadAttention with tcmalloc",
           ratio(auto, find(records, "raschka", "python.nn_mha", allocator="tcmalloc")), 0.7)
    target("2b. Raschka config, fused (Auto) / Python nn.MultiheadAttention, default allocator",
           ratio(auto, find(records, "raschka", "python.nn_mha")), 0.2)
    mm = find(records, "matmul", "mm_2048")
    target("2c. Raschka config, fused (Auto) GFLOP/s / same-run matmul GFLOP/s",
           ratio(auto, mm, "gflops"), 0.5, at_most=False)
    longest = max((r["T"] for r in records if r["impl"] == "cpp.core.chunked" and r["group"] == "long"),
                  default=None)
    peak = find(records, "long", "cpp.core.chunked", longest)
    target(f"3a. long context, chunked peak memory above inputs at T={longest} (MiB)",
           peak["peak_mb"] if peak else None, 1024)
    target("3b. long context T=8192, math peak / chunked peak",
           ratio(find(records, "long", "cpp.core.math", 8192),
                 find(records, "long", "cpp.core.chunked", 8192), "peak_mb"), 8, at_most=False)
    steps = sorted((r["T"], r["ms"]) for r in records if r["impl"] == "cpp.fused.kv_cache_step")
    growth = None
    if len(steps) >= 2:
        growth = (steps[-1][1] / steps[0][1]) / (steps[-1][0] / steps[0][0])
    target("4a. KV-cache decode: (time growth) / (position growth), first to last position",
           growth, 1.0)
    target("4b. KV-cache decode at position 2048: recompute / cached step",
           ratio(find(records, "decode", "cpp.fused.recompute", 2048),
                 find(records, "decode", "cpp.fused.kv_cache_step", 2048)), 20, at_most=False)
    if second:
        v = version(second)
        target(f"5a. LibTorch {v}: chunked attention core / Python {v} "
               "F.scaled_dot_product_attention (Raschka config)",
               ratio(find(second, "raschka", "cpp.core.chunked"),
                     find(second, "raschka", "python.core.sdpa")), 1.0)
        target(f"5b. LibTorch {v}: fused (Auto) / Python {v} nn.MultiheadAttention with tcmalloc",
               ratio(find(second, "raschka", "cpp.fused.auto"),
                     find(second, "raschka", "python.nn_mha", allocator="tcmalloc")), 0.8)
    training_targets(records, second, target)
    window_targets(records, second, target)
    dtype_targets(records, second, target)
    operator_targets(records, second, target)
    int8_cache_targets(records, second, target)
    avx2_targets(avx2, target)
    return rows


def operator_targets(records, second, target):
    """The library's operators called from Python (python/attention_ops) against the attention
    PyTorch gives a Python user of the same generation, each through its Python call: the goal
    is that the operator is the fastest of them."""
    for rs in [records] + ([second] if second else []):
        v = version(rs)

        def rec(impl, t, pass_):
            return next((r for r in rs if r["group"] == "operators" and r["impl"] == impl
                         and r["T"] == t and r["pass"] == pass_), None)
        long_t = max((r["T"] for r in rs if r["group"] == "operators"), default=None)
        for pass_ in ("forward", "forward+backward"):
            for t, what in ((1024, "attention core, Raschka config"),
                            (long_t, f"attention core T={long_t}")):
                target(f"9. Python {v}: {what} {pass_}, operator / F.scaled_dot_product_attention",
                       ratio(rec("python.ops.core", t, pass_), rec("python.core.sdpa", t, pass_)),
                       1.0)
            for impl, what in (("python.nn_mha", "nn.MultiheadAttention"),
                               ("python.book_mha", "the book's MultiHeadAttention")):
                target(f"9. Python {v}: Raschka module {pass_}, attention_ops.MultiHeadAttention "
                       f"/ {what}",
                       ratio(rec("python.ops.mha", 1024, pass_), rec(impl, 1024, pass_)), 1.0)


def int8_cache_targets(records, second, target):
    """One sequence's decoding step over an 8-bit paged cache against the float32 step over the
    same keys in the same run (attention-bench paged-decode): 8-bit codes and a float scale per
    row are (d + 4) / (4 d) = 0.258 of float's bytes at d = 128, so a step bound by reading the
    cache could take 0.26 of the time: 0.35 is the goal with 8 key/value heads. With one, 32 query
    rows share each key and the step is bound by arithmetic, not by bytes: 0.4 (docs/SERVING.md).
    The default route's records (scores on integer products); `.paged.widened` ones are left
    out."""
    for rs in [records] + ([second] if second else []):
        v = version(rs)
        steps = sorted((r for r in rs if r["group"] == "paged-decode"
                        and r["impl"].startswith("cpp.int8.") and r["impl"].endswith(".paged")),
                       key=lambda r: (r["impl"], r["T"]))
        # The goal is for long contexts, 8192 positions and more (a --quick run has only short).
        long_steps = [r for r in steps if r["T"] >= 8192]
        for r in long_steps or steps:
            heads = r["impl"].split(".")[2]
            what = ("1 key/value head (bound by arithmetic)" if heads == "kv1"
                    else f"{heads[2:]} key/value heads")
            target(f"10. LibTorch {v}: decoding step at position {r['T']}, {what}, 8-bit paged "
                   "cache / float32 (bytes 0.258)",
                   ratio(r, find(rs, "paged-decode", f"cpp.float32.{heads}.paged", r["T"])),
                   0.4 if heads == "kv1" else 0.35)


def avx2_targets(avx2, target):
    """Targets 6c and 6d once more with both sides on their AVX2 kernels (bench_measure.sh),
    LibTorch and Python of the same generation."""
    if not avx2:
        return
    v = version(avx2)
    target(f"11. LibTorch {v}, both sides forced to AVX2: attention core forward+backward, "
           f"Chunked / Python {v} F.scaled_dot_product_attention",
           ratio(find(avx2, "core-train", "cpp.core.chunked"),
                 find(avx2, "core-train", "python.core.sdpa")), 0.8)
    for t in sorted({r["T"] for r in avx2 if r["group"] == "long"}):
        target(f"11. LibTorch {v}, both sides forced to AVX2: long-context forward T={t}, "
               f"Chunked / Python {v} F.scaled_dot_product_attention",
               ratio(find(avx2, "long", "cpp.core.chunked", t),
                     find(avx2, "long", "python.core.sdpa", t)), 0.8)


def dtype_targets(records, second, target):
    """bfloat16 against float32 in the same run (the attention core on Chunked and the Raschka
    module): on a processor with bfloat16 products (AVX512_BF16) the products run at twice float's
    rate, and the passes between them (softmax, rounding) do not speed up, so the goal is 1.6x
    rather than 2x; the widened route (ATTENTION_CPU_BF16=widened) against it shows what the
    products give, and elsewhere, where both are the widened route, that nothing was lost. The
    widened run's own float32 (timed in turn with it) against its bfloat16 is the route of a
    processor without bfloat16 products: at most float32's time. Where the processor has AMX,
    the run on AVX512_BF16's vectors shows what the tiles give; and the core against PyTorch's
    own bfloat16 SDPA, timed in turn with its float32 (bench_python.py dtypes)."""
    for rs in [records] + ([second] if second else []):
        v = version(rs)
        for impl, what in (("cpp.core.chunked", "attention core (Chunked)"),
                           ("cpp.fused.auto", "Raschka module (Auto)")):
            for pass_ in ("forward", "forward+backward"):
                def rec(name):
                    return next((r for r in rs if r["group"] == "dtypes" and r["pass"] == pass_
                                 and r["impl"] == f"{impl}.{name}"), None)
                target(f"8. LibTorch {v}: {what} {pass_}, float32 time / bfloat16 time "
                       "(with bfloat16 products)",
                       ratio(rec("float32"), rec("bfloat16")), 1.6, at_most=False)
                target(f"8. LibTorch {v}: {what} {pass_}, bfloat16 widened / bfloat16 time",
                       ratio(rec("bfloat16.widened"), rec("bfloat16")), 0.95, at_most=False)
                target(f"8. LibTorch {v}: {what} {pass_}, bfloat16 widened / float32 time "
                       "(the route without bfloat16 products, in turn in one run)",
                       ratio(rec("bfloat16.widened"), rec("float32.widened_run")), 1.0)
                vectors = ratio(rec("bfloat16.avx512_bf16"), rec("float32.avx512_bf16_run"))
                tiles = ratio(rec("bfloat16"), rec("float32"))
                if vectors is not None and tiles:  # measured where the processor has AMX
                    # Each bfloat16 against the float32 of its own run: the two runs are minutes
                    # apart.
                    target(f"12. LibTorch {v}: {what} {pass_}, bfloat16 time on AVX512_BF16's "
                           "vectors / on AMX's tiles (each over its run's float32)",
                           vectors / tiles, 1.0, at_most=False)
        # A decoding step over a paged cache (attention-bench paged-decode, each shape's float32
        # and bfloat16 steps in turn): half the bytes to read, so at most float32's time.
        for r in sorted((r for r in rs if r["group"] == "paged-decode" and r["T"] >= 8192
                         and r["impl"].startswith("cpp.bfloat16.") and r["impl"].endswith(".paged")),
                        key=lambda r: (r["impl"], r["T"])):
            heads = r["impl"].split(".")[2]
            what = "1 key/value head" if heads == "kv1" else f"{heads[2:]} key/value heads"
            target(f"8. LibTorch {v}: decoding step at position {r['T']}, {what}, paged bfloat16 "
                   "cache / float32",
                   ratio(r, find(rs, "paged-decode", f"cpp.float32.{heads}.paged", r["T"])), 1.0)
        for pass_ in ("forward", "forward+backward"):
            def sdpa(name):
                return next((r for r in rs if r["group"] == "dtypes" and r["pass"] == pass_
                             and r["impl"] == f"python.core.sdpa.{name}"), None)
            core = next((r for r in rs if r["group"] == "dtypes" and r["pass"] == pass_
                         and r["impl"] == "cpp.core.chunked.bfloat16"), None)
            target(f"12. LibTorch {v}: attention core {pass_}, bfloat16 / PyTorch's bfloat16 SDPA "
                   "time", ratio(core, sdpa("bfloat16")), 1.0)


def window_targets(records, second, target):
    """Sliding window against full causal attention at the same length: the arithmetic ratio
    is that of the (query, key) pairs computed, about T * w against T^2 / 2."""
    for rs in [records] + ([second] if second else []):
        v = version(rs)
        for r in sorted((r for r in rs if r["group"] == "window"), key=lambda r: r["T"]):
            w = int(r["impl"].rsplit("window", 1)[1])
            t = r["T"]
            floor = (min(t, w) * (min(t, w) + 1) / 2 + max(0, t - w) * w) / (t * (t + 1) / 2)
            target(f"7. LibTorch {v}: long-context forward T={r['T']}, sliding window {w} / full "
                   f"causal (arithmetic {floor:.3f})",
                   ratio(r, find(rs, "long", "cpp.core.chunked", r["T"])),
                   round(1.6 * floor, 3))


def training_targets(records, second, target):
    """The targets of the fused backward and the long-context forward: each generation against
    the same run's arithmetic floor or against Python 2.x."""
    sets = [records] + ([second] if second else [])
    python2 = second if second else None
    p = version(python2) if python2 else "2.x"
    for rs in sets:
        v = version(rs)
        mm = find(rs, "matmul", "mm_2048")
        target(f"6a. LibTorch {v}: Raschka forward, fused (Auto) time / arithmetic floor "
               "(its GFLOP at the same run's matmul rate)",
               ratio(mm, find(rs, "raschka", "cpp.fused.auto"), "gflops"), 1.3)
    for rs in sets:
        v = version(rs)
        target(f"6b. LibTorch {v}: Raschka training step, fused (Chunked) / Python {p} "
               "nn.MultiheadAttention with tcmalloc",
               ratio(find(rs, "raschka-train", "cpp.fused.chunked"),
                     python2 and find(python2, "raschka-train", "python.nn_mha",
                                      allocator="tcmalloc")), 0.7)
    for rs in sets:
        v = version(rs)
        target(f"6c. LibTorch {v}: attention core forward+backward, Chunked / Python {p} "
               "F.scaled_dot_product_attention",
               ratio(find(rs, "core-train", "cpp.core.chunked"),
                     python2 and find(python2, "core-train", "python.core.sdpa")), 0.8)
    for t in (8192, 32768):
        for rs in sets:
            v = version(rs)
            target(f"6d. LibTorch {v}: long-context forward T={t}, Chunked / Python {p} "
                   "F.scaled_dot_product_attention",
                   ratio(find(rs, "long", "cpp.core.chunked", t),
                         python2 and find(python2, "long", "python.core.sdpa", t)), 0.8)
    for rs in sets:
        v = version(rs)
        target(f"6e. LibTorch {v}: training at T=8192, Math peak / Chunked peak (memory above "
               "the inputs)",
               ratio(find(rs, "long-train", "cpp.core.math", 8192),
                     find(rs, "long-train", "cpp.core.chunked", 8192), "peak_mb"), 8,
               at_most=False)


def key(r):
    # Names without their language (the matmul of each side) get it, so the sides keep a row each.
    impl = r["impl"] if r["impl"].startswith(r["lang"] + ".") else f'{r["lang"]}.{r["impl"]}'
    return (r["group"], impl, r.get("pass", "forward"), r.get("allocator", "glibc"), r["T"])


def cells(r):
    if r is None:
        return ["", "", ""]
    unit = " (us/call)" if r["group"] == "article" else ""
    peak = fmt(r["peak_mb"], 0) if r["peak_mb"] >= 0 else ""
    return [f"{fmt(r['ms'], 3)}{unit}", fmt(r["gflops"], 1), peak]


# The instruction sets that pick the library's routes (docs/PERFORMANCE.md), as /proc/cpuinfo
# names them.
ROUTE_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")


def processor(out):
    """One line naming the processor of a run (OUT/processor.txt, written by bench_measure.sh)."""
    path = os.path.join(out, "processor.txt")
    if not os.path.exists(path):
        return None
    fields = {}
    with open(path) as f:
        for line in f:
            name, _, value = line.partition(":")
            fields.setdefault(name.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    has = ", ".join(flag for flag in ROUTE_FLAGS if flag in flags) or "none of " + "/".join(
        ROUTE_FLAGS)
    return (f"{fields.get('model name', '?')} ({fields.get('vendor_id', '?')}, family "
            f"{fields.get('cpu family', '?')} model {fields.get('model', '?')}; {has})")


def table(records, second, avx2, machines=()):
    lines = [f"Processor ({name}): {line}" for name, line in machines if line]
    lines += [""] if lines else []
    lines += ["| target | measured | goal | |", "| --- | --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in targets(records, second, avx2)]
    sets = [records] + ([second] if second else [])
    head = ["group", "implementation", "pass", "allocator", "T"]
    for rs in sets:
        v = version(rs)
        head += [f"{v} ms", f"{v} GFLOP/s", f"{v} peak MiB"]
    lines += ["", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    by_key = [{key(r): r for r in rs} for rs in sets]
    order = list(dict.fromkeys(key(r) for rs in sets for r in rs))
    for k in order:
        row = [str(x) for x in k]
        for found in by_key:
            row += cells(found.get(k))
        lines.append("| " + " | ".join(row) + " |")
    threads = sorted({r["threads"] for rs in sets for r in rs})
    lines += ["", f"Threads: {', '.join(map(str, threads))}; BLAS: OpenBLAS (openmp); times are "
              "medians of repeated runs after a warm-up; a long-context forward's peak is that of "
              "one call (the warm-up) above its inputs."]
    return "\n".join(lines) + "\n"


def plots(records, second, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench_report: matplotlib missing, no plots", file=sys.stderr)
        return
    series = [("cpp.core.chunked", "C++ chunked"), ("cpp.core.math", "C++ math"),
              ("python.core.sdpa", "Python SDPA")]
    sets = [(records, "")] + ([(second, f", LibTorch {version(second)}")] if second else [])
    for field, label, name in (("ms", "time (ms)", "long_context_time.png"),
                               ("peak_mb", "peak memory above inputs (MiB)",
                                "long_context_memory.png")):
        fig, ax = plt.subplots(figsize=(6, 4))
        for rs, suffix in sets:
            for impl, legend in series:
                points = sorted((r["T"], r[field]) for r in rs
                                if r["group"] == "long" and r["impl"] == impl and r[field] >= 0)
                if points:
                    ax.plot(*zip(*points), marker="o", label=legend + suffix,
                            linestyle="--" if suffix else "-")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("T (B=1, H=8, head size 64, causal)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(out, name), dpi=100)
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    for impl, legend in (("cpp.fused.kv_cache_step", "one token, KV cache"),
                         ("cpp.fused.recompute", "recompute whole causal forward")):
        points = sorted((r["T"], r["ms"]) for r in records if r["impl"] == impl)
        if points:
            ax.plot(*zip(*points), marker="o", label=legend)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("position (d=768, 12 heads)")
    ax.set_ylabel("time per token (ms)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "decode_time.png"), dpi=100)
    plt.close(fig)


def main(out):
    records = load(out)
    second = load(os.path.join(out, "libtorch2"))
    # The runs forced to AVX2: in the Debian 13 root's results, or here where Python is 2.x.
    avx2_names = ("cpp_avx2.jsonl", "python_avx2.jsonl")
    avx2 = load(os.path.join(out, "libtorch2"), avx2_names) or load(out, avx2_names)
    for r in avx2:
        r["route"] = "avx2"
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(records + second + avx2, f, indent=1)
    with open(os.path.join(out, "table.md"), "w") as f:
        machines = [(f"LibTorch {version(records)}", processor(out))]
        if second:
            machines.append((f"LibTorch {version(second)}", processor(os.path.join(out, "libtorch2"))))
        f.write(table(records, second, avx2, machines))
    plots(records, second, out)
    print(f"bench_report: {len(records) + len(second)} records; {out}/table.md and plots written")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench-results")
