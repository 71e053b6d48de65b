#!/usr/bin/python3
"""Compares book_zoo.py's stand-ins with the book's own model classes, on the tiny configs.

    check_against_book.py --book PATH [--commit SHA]

PATH is a checkout or extracted tree of rasbt/LLMs-from-scratch. A developer tool, run by hand:
the book's code is not part of this repository and CI has no network. The book's classes are
loaded from the tree at run time: the imports, definitions and plain aliases of a notebook's code
cells are executed in a fresh module (nothing else runs: no downloads, no model construction),
and Llama's KV-cache model is imported from pkg/llms_from_scratch/kv_cache. Modules the book
imports for tokenizers and downloads (tiktoken, huggingface_hub, safetensors, tokenizers) are
stubbed when missing. PyTorch < 2.4 has no torch.nn.RMSNorm, which Llama 3.2 uses: a stand-in
is installed that computes it as PyTorch 2.5+ does (float16/bfloat16 upcast to float32,
x * rsqrt(mean(x^2) + eps) * weight, cast back).

For each family, in float32 and in bfloat16 (the model built in that dtype, as the book does):
  keys     the same state_dict names, order, shapes and dtypes (and the same head tying);
  init     torch.manual_seed(s) before each build gives bit-identical tensors (s = 0, 123 and
           the family's seed in tiny_configs);
  forward  the seeded model of tiny_configs (adjusted as it says) loaded into the book's class:
           the same logits on two random sequences of 20 tokens, longer than the windows;
  greedy   the book's own non-KV generator gives the stand-in's tokens, and the book's model
           the stand-in's per-step logits;
  KV       the book's KV-cache model (its notebook; pkg for Llama) decoding greedily with its
           cache gives the same tokens and per-step logits. The book's cached generator primes
           the cache with the whole prompt. For Gemma 4 that prefill is wrong when the prompt
           is longer than the window and a KV-shared layer is a sliding one (that layer reads
           the providing layer's cache already trimmed to the window): every position but the
           last is off. So Gemma 4 is compared decoding the prompt token by token, and what its
           generator gives is reported beside it. Qwen3.5's cache is only wrong for chunks of
           several tokens after the prefill, which greedy decoding never feeds;
  hf       write_models.py's files: the book's load_weights_into_<family> fed with the merged
           hf/ shards rebuilds the stand-in's state_dict exactly (and ties where lm_head is
           absent), and generation.pt holds the stand-in's tokens.
Tolerances: forward and greedy logits must be bit-identical (the stand-ins run the book's
operations in the book's order). Qwen3.5 is run twice: with the book's chunked delta rule
swapped into the stand-in's Gated DeltaNet, bit-identical too; with its own recurrent rule,
float32 within 1e-6 of the largest |logit| (at least 1) and bfloat16 within 2 units in the last
place there, and that rule alone bit-identical to the book's recurrent one (which its cache runs
for single tokens). The cached path computes in another order: float32 within the same 1e-6;
in bfloat16 only the tokens must agree (its logits are reported beside the book's own
cached-versus-uncached difference, which is as large). The book never runs a model in float64
(its norms and rotary work in float32 whatever the dtype), so there is no float64 check.
Prints a PASS/FAIL line per family, then the numbers per dtype; exits 1 if any fails.

    check_against_book.py --book PATH --bench [--threads N] [FAMILY...]

runs no checks: for each family, the speed of the book's own cached greedy generation (its
KV-cache model and its generate_text_basic_stream, loaded as above; Llama's from pkg) on the
family's seeded tiny model in float32: 58 new tokens after the 6-token prompt (the context of
64), the prompt in one call then one token a call (the generator is stopped after its 58th
token, before it would feed that one back: 58 model calls, as the C++ example's `zoo MODEL_DIR
--bench`), best of 5 after a warm-up, at N threads (default: PyTorch's). One JSON line per
family, {"lang": "python", "generation": "python.book.kv_cache", "family", "dtype", "threads",
"tokens", "tokens_per_s", "same_tokens_as_stand_in"} (the last: the generated tokens equal the
stand-in's uncached greedy ones); where the book has no KV-cache model for a family,
tokens_per_s is null and "note" says why. Gemma 4's line notes that the prefill timed is the
book generator's, the one that is wrong for a prompt longer than the window (see above). The
header goes to stderr.
"""

import argparse
import ast
import contextlib
import io
import itertools
import json
import re
import sys
import tempfile
import textwrap
import time
import types
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import book_zoo  # noqa: E402
import tiny_configs  # noqa: E402
import write_models  # noqa: E402

SEEDS = (0, 123)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# family: the book's model class, its weight loader
BOOK_NAMES = {"llama32": ("Llama3Model", "load_weights_into_llama"),
              "qwen3": ("Qwen3Model", "load_weights_into_qwen"),
              "gemma3": ("Gemma3Model", "load_weights_into_gemma"),
              "olmo3": ("Olmo3Model", "load_weights_into_olmo"),
              "tiny_aya": ("TinyAyaModel", "load_weights_into_tiny_aya"),
              "qwen3_5": ("Qwen3_5Model", "load_weights_into_qwen3_5"),
              "gemma4": ("Gemma4DenseModel", "load_weights_into_gemma4_dense")}


# ------------------------------------------------------------------------------------------------
# Loading the book


class RMSNormStandIn(nn.Module):
    """torch.nn.RMSNorm (PyTorch 2.5+) for older PyTorch."""

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None,
                 dtype=None):
        super().__init__()
        shape = tuple(normalized_shape) if isinstance(normalized_shape, (tuple, list)) \
            else (normalized_shape,)
        self.dims, self.eps = tuple(range(-len(shape), 0)), eps
        self.weight = nn.Parameter(torch.ones(shape, device=device, dtype=dtype)) \
            if elementwise_affine else None

    def forward(self, x):
        u = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        eps = self.eps if self.eps is not None else torch.finfo(u.dtype).eps
        y = u * torch.rsqrt(u.pow(2).mean(self.dims, keepdim=True) + eps)
        return (y * self.weight if self.weight is not None else y).type_as(x)


def install_stand_ins():
    """nn.RMSNorm if missing; stubs for the book's tokenizer and download packages if missing.
    Returns what was installed."""
    installed = []
    if not hasattr(nn, "RMSNorm"):
        nn.RMSNorm = RMSNormStandIn
        installed.append("torch.nn.RMSNorm")

    def unavailable(name):
        def call(*args, **kwargs):
            raise RuntimeError(f"{name} is a stub in check_against_book.py")
        return type(name.rsplit(".", 1)[-1], (), {"__init__": call, "__call__": call,
                                                  "from_file": staticmethod(call)})

    def stub_getattr(module_name):
        def getattr_(attr):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return unavailable(f"{module_name}.{attr}")
        return getattr_

    for name in ("tiktoken", "tiktoken.load", "huggingface_hub", "safetensors",
                 "safetensors.torch", "tokenizers"):
        try:
            __import__(name)
        except ImportError:
            stub = types.ModuleType(name)
            stub.__getattr__ = stub_getattr(name)
            sys.modules[name] = stub
            if "." in name:
                parent, child = name.rsplit(".", 1)
                setattr(sys.modules[parent], child, stub)
            installed.append(name)
    return installed


def load_notebook(path):
    """A module holding the imports, functions, classes and `name = other_name` aliases of the
    notebook's code cells, executed in order. Shell and magic lines are dropped; a cell that
    does not parse, or a statement that fails, is skipped."""
    module = types.ModuleType("book_" + re.sub(r"\W", "_", path.stem))
    module.__dict__.update(torch=torch, nn=nn)
    sys.path.insert(0, str(path.parent))  # Qwen3.5 imports qwen3_5_transformers from there
    try:
        for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
            if cell["cell_type"] != "code":
                continue
            code = re.sub(r"(?m)^[ \t]*[!%].*$", "", "".join(cell["source"]))
            try:
                tree = ast.parse(code)
            except SyntaxError:
                continue
            for node in tree.body:
                alias = isinstance(node, ast.Assign) and isinstance(node.value, ast.Name)
                if alias or isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef,
                                              ast.ClassDef)):
                    try:
                        exec(compile(ast.Module(body=[node], type_ignores=[]),
                                     f"{path.name} cell {i}", "exec"), module.__dict__)
                    except Exception:
                        pass
    finally:
        sys.path.remove(str(path.parent))
    return module


def load_pkg_llama_kv(root):
    """pkg/llms_from_scratch/kv_cache/llama3.py (and its generate.py), imported as a package."""
    sys.path.insert(0, str(root / "pkg"))
    try:
        import llms_from_scratch.kv_cache.generate as generate
        import llms_from_scratch.kv_cache.llama3 as llama3
    finally:
        sys.path.remove(str(root / "pkg"))
    # The cached greedy generator, under the name the notebooks give theirs.
    llama3.generate_text_basic_stream = generate.generate_text_simple_stream
    return llama3


def book_commit(root, given):
    head = root / ".git" / "HEAD"
    if head.is_file():
        ref = head.read_text().strip()
        if ref.startswith("ref: "):
            ref_file = root / ".git" / ref[5:]
            ref = ref_file.read_text().strip() if ref_file.is_file() else ref
        return ref + " (git checkout)"
    return f"{given} (from --commit)" if given else "unknown (not a git checkout; give --commit)"


# ------------------------------------------------------------------------------------------------
# Comparisons


def max_diff(a, b):
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def tolerance(ref):
    big = max(1.0, ref.abs().max().item())
    if ref.dtype == torch.bfloat16:
        return 2 * 2.0 ** (torch.tensor(big).log2().floor().item() - 7)
    return 1e-6 * big


def greedy_book(family, module, model, prompt, n):
    """The book's own non-KV generator (Llama: `generate` with temperature 0)."""
    with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
        if family == "llama32":
            return module.generate(model, prompt, n, context_size=model.cfg["context_length"])
        return torch.cat([prompt] + list(module.generate_text_basic_stream(model, prompt, n)),
                         dim=1)


@torch.no_grad()
def book_step_logits(family, model, tokens, p):
    """The book model's last-position logits for each prefix tokens[:, :p + i]."""
    steps = []
    for i in range(tokens.shape[1] - p):
        ids = tokens[:, : p + i]
        out = model(ids, reuse_shared_kv=True) if family == "gemma4" else model(ids)
        steps.append(out[:, -1, :].float())
    return torch.cat(steps)


@torch.no_grad()
def kv_decode(module, model, prompt, n, token_by_token):
    """Greedy decoding through the book's KV cache: the prompt at once (or a token at a time),
    then one token per call. Returns (tokens, per-step logits float32)."""
    cache = module.KVCache(n_layers=model.cfg["n_layers"])
    model.reset_kv_cache()
    chunks = prompt.split(1, dim=1) if token_by_token else [prompt]
    for chunk in chunks:
        logits = model(chunk, cache=cache)
    tokens, steps = prompt, []
    for _ in range(n):
        last = logits[:, -1]
        steps.append(last.float())
        nxt = torch.argmax(last, dim=-1, keepdim=True)
        tokens = torch.cat([tokens, nxt], dim=1)
        logits = model(nxt, cache=cache)
    return tokens, torch.cat(steps)


@contextlib.contextmanager
def book_delta_rule(plain):
    """Runs the stand-in's Gated DeltaNet with the book's chunked delta rule (the function of
    qwen3_5_transformers.py that the book's model calls without a cache) in place of its own."""
    chunked = sys.modules[plain.Qwen3_5GatedDeltaNet.__module__].torch_chunk_gated_delta_rule
    own = book_zoo.GatedDeltaNet.delta_rule
    book_zoo.GatedDeltaNet.delta_rule = lambda self, q, k, v, g, beta: chunked(
        q, k, v, g=g, beta=beta, initial_state=None, output_final_state=False,
        use_qk_l2norm_in_kernel=True)[0]
    try:
        yield
    finally:
        book_zoo.GatedDeltaNet.delta_rule = own


def check_dtype(family, plain, kv, dtype_name, exact):
    """Runs the checks of one family in one dtype: (failures, summary text). exact: the forward
    and greedy logits must be bit-identical."""
    dtype = DTYPES[dtype_name]
    cls_name, loader_name = BOOK_NAMES[family]
    book_cls, kv_cls = getattr(plain, cls_name), getattr(kv, cls_name)
    cfg = tiny_configs.config(family, dtype)
    fails, parts = [], []

    def build_book(c, seed=None):
        if seed is not None:
            torch.manual_seed(seed)
        with contextlib.redirect_stdout(io.StringIO()):  # Qwen3.5's fast-path notice
            return c(tiny_configs.config(family, dtype)).eval()

    # keys and init
    for seed in sorted(set(SEEDS) | {tiny_configs.seed(family)}):
        torch.manual_seed(seed)
        ours = book_zoo.build(family, tiny_configs.config(family, dtype))
        book = build_book(book_cls, seed)
        ours_sd, book_sd = ours.state_dict(), book.state_dict()
        spec = [(k, tuple(v.shape), v.dtype) for k, v in ours_sd.items()]
        if spec != [(k, tuple(v.shape), v.dtype) for k, v in book_sd.items()]:
            fails.append(f"state_dict differs: ours {spec} vs book "
                         f"{[(k, tuple(v.shape), v.dtype) for k, v in book_sd.items()]}")
            return fails, ""
        tied = (ours.out_head.weight is ours.tok_emb.weight,
                book.out_head.weight is book.tok_emb.weight)
        if tied[0] != tied[1]:
            fails.append(f"head tying differs (ours {tied[0]}, book {tied[1]})")
        differing = [k for k in ours_sd if not torch.equal(ours_sd[k], book_sd[k])]
        if differing:
            fails.append(f"seed {seed}: init differs in {differing}")
    parts.append(f"keys {len(spec)} and init identical (seeds "
                 f"{', '.join(map(str, sorted(set(SEEDS) | {tiny_configs.seed(family)})))})")

    # forward
    ours = tiny_configs.seeded_model(family, dtype)
    book = build_book(book_cls)
    book.load_state_dict(ours.state_dict())
    x = torch.randint(0, cfg["vocab_size"], (2, 20), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        ref = book(x, reuse_shared_kv=True) if family == "gemma4" else book(x)
        diff, tol = max_diff(ours(x), ref), 0.0 if exact else tolerance(ref)
        if diff > tol:
            fails.append(f"forward differs by {diff:.3g} (tolerance {tol:.3g})")
        text = f"forward {diff:.2g}"
        if family == "gemma4":  # the book's default forward: no KV sharing
            diff2 = max_diff(ours(x, reuse_shared_kv=False), book(x))
            if diff2 > tol:
                fails.append(f"forward without KV sharing differs by {diff2:.3g}")
            text += f" (without sharing {diff2:.2g})"
    parts.append(text)

    if family == "qwen3_5" and not exact:  # the recurrent rule is the book's single-step one
        rule = sys.modules[plain.Qwen3_5GatedDeltaNet.__module__].torch_recurrent_gated_delta_rule
        gen = torch.Generator().manual_seed(11)
        q, k = (torch.randn(2, 20, 4, 8, generator=gen).to(dtype) for _ in range(2))
        v = torch.randn(2, 20, 4, 16, generator=gen).to(dtype)
        g = -torch.rand(2, 20, 4, generator=gen)
        beta = torch.rand(2, 20, 4, generator=gen).to(dtype)
        layer = ours.trf_blocks[0].token_mixer
        with torch.no_grad():
            diff = max_diff(layer.delta_rule(q, k, v, g, beta),
                            rule(q, k, v, g, beta, None, False, use_qk_l2norm_in_kernel=True)[0])
        if diff != 0:
            fails.append(f"the recurrent delta rule differs from the book's by {diff:.3g}")
        parts.append(f"delta rule vs the book's recurrent one {diff:.2g}")

    # greedy, no cache
    prompt, n = tiny_configs.prompt(), tiny_configs.NEW_TOKENS
    tokens, logits = book_zoo.generate(ours, prompt, n)
    book_tokens = greedy_book(family, plain, book, prompt, n)
    diff = max_diff(logits, book_step_logits(family, book, tokens, prompt.shape[1]))
    tol = tolerance(logits.to(dtype))
    if not torch.equal(tokens, book_tokens):
        fails.append(f"greedy tokens differ: ours {tokens.tolist()} book {book_tokens.tolist()}")
    if diff > (0.0 if exact else tol):
        fails.append(f"greedy step logits differ by {diff:.3g}")
    parts.append(f"greedy tokens equal, step logits {diff:.2g}")

    # KV cache
    book_kv = build_book(kv_cls)
    book_kv.load_state_dict(ours.state_dict())
    kv_tokens, kv_logits = kv_decode(kv, book_kv, prompt, n, token_by_token=family == "gemma4")
    diff = max_diff(logits, kv_logits)
    if not torch.equal(tokens, kv_tokens):
        fails.append(f"KV tokens differ: ours {tokens.tolist()} book {kv_tokens.tolist()}")
    if diff > tol and dtype == torch.float32:
        fails.append(f"KV step logits differ by {diff:.3g}")
    text = f"KV {'token by token' if family == 'gemma4' else 'prefill + steps'}: tokens equal, " \
           f"step logits {diff:.2g}"
    if dtype != torch.float32:  # the book's own cached and uncached models differ as much
        book_diff = max_diff(book_step_logits(family, book, tokens, prompt.shape[1]), kv_logits)
        text += f" (book cached vs uncached {book_diff:.2g})"
    with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
        gen = torch.cat([prompt] + list(kv.generate_text_basic_stream(book_kv, prompt, n)), dim=1)
        if family == "gemma4":
            book_kv.reset_kv_cache()
            prefill = book_kv(prompt, cache=kv.KVCache(n_layers=cfg["n_layers"]))
            wrong = max_diff(prefill[:, :-1], ours(prompt)[:, :-1])
    if family == "gemma4":
        _, prefill_logits = kv_decode(kv, book_kv, prompt, n, token_by_token=False)
        text += (f"; the book's cached generator (prefill {prompt.shape[1]} > window "
                 f"{cfg['sliding_window']}): {'the same' if torch.equal(gen, tokens) else 'other'}"
                 f" tokens, step logits {max_diff(logits, prefill_logits):.2g}, its prefill's "
                 f"logits before the last position off by {wrong:.2g}")
    elif not torch.equal(gen, tokens):
        fails.append(f"the book's KV generator gives {gen.tolist()}")
    parts.append(text)

    # write_models.py's files
    with tempfile.TemporaryDirectory() as tmp:
        folder, _, _ = write_models.write(tmp, family, dtype_name)
        params = write_models.load_sharded(str(Path(folder) / "hf"))
        saved = torch.load(Path(folder) / "generation.pt")
        config = json.loads((Path(folder) / "config.json").read_text())
    loaded = build_book(book_cls, seed=999)
    with contextlib.redirect_stdout(io.StringIO()):
        getattr(plain, loader_name)(loaded, cfg, params)
    want, got = ours.state_dict(), loaded.state_dict()
    wrong = [k for k in want if k not in got or not torch.equal(want[k], got[k])]
    if wrong or list(want) != list(got):
        fails.append(f"hf/ through {loader_name} differs in {wrong or 'the key order'}")
    if (loaded.out_head.weight is loaded.tok_emb.weight) != ("lm_head.weight" not in params):
        fails.append("hf/: lm_head.weight absent but the loaded head is not tied, or the reverse")
    if not torch.equal(saved["tokens"], tokens) or config["dtype"] != dtype_name:
        fails.append("generation.pt or config.json does not match")
    parts.append(f"hf/ ({len(params)} tensors) through {loader_name} identical")
    return fails, "; ".join(parts)


# ------------------------------------------------------------------------------------------------
# --bench: the book's cached generation, timed

BENCH_REPEATS = 5


def bench_family(family, kv, threads):
    """The JSON record of the book's cached greedy generation for `family` (see the docstring)."""
    cfg = tiny_configs.config(family, torch.float32)
    prompt = tiny_configs.prompt()
    n = cfg["context_length"] - prompt.shape[1]
    line = {"lang": "python", "generation": "python.book.kv_cache", "family": family,
            "dtype": "float32", "threads": threads, "tokens": n}
    cls_name = BOOK_NAMES[family][0]
    missing = [name for name in (cls_name, "KVCache", "generate_text_basic_stream")
               if not hasattr(kv, name)]
    if missing:
        return {**line, "tokens_per_s": None,
                "note": f"the book's KV-cache code ({book_zoo.FAMILIES[family][2]}) has no "
                        f"{', '.join(missing)}: no cached generation to time"}
    ours = tiny_configs.seeded_model(family, torch.float32)
    with contextlib.redirect_stdout(io.StringIO()):
        model = getattr(kv, cls_name)(cfg).eval()
    model.load_state_dict(ours.state_dict())

    def generate():
        # islice stops the generator after its n-th token, before it feeds that one back.
        with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
            return list(itertools.islice(kv.generate_text_basic_stream(model, prompt, n), n))

    tokens = torch.cat([prompt] + generate(), dim=1)  # the warm-up
    best = float("inf")
    for _ in range(BENCH_REPEATS):
        start = time.perf_counter()
        generate()
        best = min(best, time.perf_counter() - start)
    line.update(tokens_per_s=round(n / best, 1),
                same_tokens_as_stand_in=torch.equal(tokens, book_zoo.generate(ours, prompt, n)[0]))
    if family == "gemma4":
        line["note"] = (f"timed as the book's generator runs it: the {prompt.shape[1]}-token "
                        f"prompt in one call, whose logits before the last position are wrong "
                        f"(window {cfg['sliding_window']}, a KV-shared sliding layer); the "
                        f"generated tokens are right")
    return line


def bench(root, families, threads):
    if threads is not None:
        torch.set_num_threads(threads)
    threads = torch.get_num_threads()
    for family in families:
        kv_source = book_zoo.FAMILIES[family][2]
        try:
            if not (root / kv_source).is_file():
                raise FileNotFoundError(f"{kv_source} is not in the book's tree")
            kv = load_pkg_llama_kv(root) if kv_source.endswith(".py") \
                else load_notebook(root / kv_source)
        except Exception as error:
            line = {"lang": "python", "generation": "python.book.kv_cache", "family": family,
                    "dtype": "float32", "threads": threads,
                    "tokens": tiny_configs.CONFIGS[family]["context_length"] - len(
                        tiny_configs.PROMPT),
                    "tokens_per_s": None,
                    "note": f"the book has no KV-cache model to time here: {error!r}"}
        else:
            line = bench_family(family, kv, threads)
        print(json.dumps(line), flush=True)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--book", required=True, type=Path,
                        help="a checkout or extracted tree of rasbt/LLMs-from-scratch")
    parser.add_argument("--commit", help="the tree's commit, when it is not a git checkout")
    parser.add_argument("--bench", action="store_true",
                        help="no checks: time the book's cached generation per family")
    parser.add_argument("--threads", type=int, help="with --bench (default: PyTorch's)")
    parser.add_argument("families", nargs="*", metavar="FAMILY")
    args = parser.parse_args(argv)
    root = args.book.resolve()
    header = sys.stderr if args.bench else sys.stdout
    print(f"book commit {book_commit(root, args.commit)}; torch {torch.__version__}", file=header)
    installed = install_stand_ins()
    if installed:
        print(f"stand-ins installed: {', '.join(installed)}", file=header)
    torch.set_grad_enabled(False)
    if args.bench:
        return bench(root, args.families or list(book_zoo.FAMILIES), args.threads)
    failed = False
    for family in args.families or list(book_zoo.FAMILIES):
        _, notebook, kv_source = book_zoo.FAMILIES[family]
        try:
            plain = load_notebook(root / notebook)
            kv = (load_pkg_llama_kv(root) if kv_source.endswith(".py")
                  else load_notebook(root / kv_source))
        except Exception as error:
            print(f"FAIL {family}: the book's code did not load: {error!r}")
            failed = True
            continue
        # Qwen3.5 twice: with the book's chunked delta rule swapped in, which must give the
        # same bits, then with the stand-in's own recurrent rule, within the tolerances.
        variants = [("", contextlib.nullcontext, True)]
        if family == "qwen3_5":
            variants = [(" (book's chunked delta rule)", lambda: book_delta_rule(plain), True),
                        (" (own recurrent delta rule)", contextlib.nullcontext, False)]
        lines, fails = [], []
        for label, context, exact in variants:
            for dtype_name in DTYPES:
                try:
                    with context():
                        f, text = check_dtype(family, plain, kv, dtype_name, exact)
                except Exception as error:
                    f, text = [f"{type(error).__name__}: {error}"], "raised"
                fails += [f"{dtype_name}{label}: {m}" for m in f]
                lines.append(textwrap.fill(text, 100, initial_indent=f"    {dtype_name}{label}: ",
                                           subsequent_indent=" " * 8))
        failed |= bool(fails)
        print(f"{'FAIL' if fails else 'PASS'} {family}: {notebook}, {kv_source}")
        print("\n".join(lines + [f"    FAILED {m}" for m in fails]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
