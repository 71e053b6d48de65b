#!/usr/bin/python3
"""Compares the stand-ins of scripts/reference.py with the book's own classes.

The goldens come from scripts/reference.py, whose classes stand in for those of Raschka's
"Build a Large Language Model (From Scratch)" (github.com/rasbt/LLMs-from-scratch): the same
parameter names, creation order and arithmetic. The book changes; this tool says whether the
stand-ins still match it. It is run by hand, against a checkout of the book (the book's code is
not part of this repository, and CI has no network):

    /usr/bin/python3 scripts/check_book_classes.py --book PATH [--commit SHA] [--seeds 0 1 123]

PATH is a git checkout or an extracted tree of rasbt/LLMs-from-scratch; --commit names its commit
when the tree is not a git checkout. Each book class is loaded from the tree at run time: from
pkg/llms_from_scratch/ where it lives there, otherwise from the chapter folder's .py files, the
code cells of its notebooks or the ```python blocks of its README.md. Only the statement that
defines the class and those it needs (helper functions, classes, imports) are executed, in a
fresh module, so that the rest of a file (scripts, downloads, tokenizers) never runs.

For each pair (book class, stand-in), under several seeds and small sizes, with each option set
the two classes share (options only the stand-in has stay off), it checks:
  1. keys: the same state_dict keys, in the same order, with the same shapes;
  2. init: torch.manual_seed(s) before constructing each gives bit-identical tensors (every
     differing tensor is named with its max |diff|);
  3. forward: the same output on the same random input, in float64 (float32 within 1e-6 relative
     where the book's class does not run in float64). The stand-in's weights are loaded into the
     book's module first, so that an init difference neither hides nor causes an arithmetic one.
Where a stand-in's option corresponds to another book class (grouped-query and sliding-window
attention are options of the stand-in's MultiHeadAttention), only check 3 is run, with the
weights copied by name. A book forward known to fail is skipped with its verified reason.
MultiHeadAttentionWithKVSharing is compared as the book's GPT runs it, which takes three
adaptations (its line names them): the book's shared keys and values are transposed to the
stand-in's layout, what a reading layer passes on is ignored, and the book's reading layer is
called through its KV cache.

It prints one line per stand-in class (PASS, FAIL with reasons, SKIP with the reason) and exits
with status 1 if any line is FAIL. PyTorch older than 2.4 lacks torch.nn.RMSNorm, which the
book's GatedDeltaNet uses; a minimal stand-in is then installed into torch.nn (and the output
says so).
"""

import argparse
import ast
import builtins
import itertools
import json
import re
import subprocess
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))
import reference  # noqa: E402  (scripts/reference.py, found through the line above)

FLOAT64_TOLERANCE = 1e-12  # relative to the output's largest magnitude
FLOAT32_TOLERANCE = 1e-6


# --------------------------------------------------------------------------------------------
# torch.nn.RMSNorm for PyTorch < 2.4


class StandInRMSNorm(nn.Module):
    """torch.nn.RMSNorm as PyTorch 2.4+ computes it (ATen's composite rms_norm): half and
    bfloat16 inputs are upcast to float32, y = x * rsqrt(mean(x^2) + eps) * weight over the
    normalized dimensions, cast back to the input's dtype. eps None means the machine epsilon of
    the computation dtype. (2.4 multiplies by weight after the cast back, later versions before
    it; the two agree for float32 and float64, the dtypes used here.)"""

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None,
                 dtype=None):
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            # Ones, as PyTorch's reset_parameters: draws no random numbers.
            self.weight = nn.Parameter(torch.ones(self.normalized_shape, device=device,
                                                  dtype=dtype))
        else:
            self.register_parameter("weight", None)

    def forward(self, x):
        upcast = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        eps = self.eps if self.eps is not None else torch.finfo(upcast.dtype).eps
        dims = tuple(range(-len(self.normalized_shape), 0))
        y = upcast * torch.rsqrt(upcast.pow(2).mean(dims, keepdim=True) + eps)
        if self.weight is not None:
            y = y * self.weight
        return y.type_as(x)


def install_rmsnorm() -> bool:
    """Puts StandInRMSNorm into torch.nn if it has no RMSNorm; True if it did."""
    if hasattr(nn, "RMSNorm"):
        return False
    nn.RMSNorm = StandInRMSNorm
    return True


# --------------------------------------------------------------------------------------------
# Loading a class from the book's tree


@dataclass
class Statement:
    """A top-level statement of the book's code: where it is, what it binds, what it uses."""
    label: str
    node: ast.stmt
    flags: int
    binds: frozenset
    uses: frozenset


def code_units(path: Path, root: Path) -> List[Tuple[str, str]]:
    """(label, code) for a .py file, each code cell of a notebook or each ```python block of a
    Markdown file."""
    rel = path.relative_to(root)
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        return [(str(rel), text)]
    if path.suffix == ".ipynb":
        units = []
        for i, cell in enumerate(json.loads(text)["cells"]):
            if cell["cell_type"] == "code":
                source = cell["source"]
                code = "".join(source) if isinstance(source, list) else source
                # Shell escapes and magics (!pip, %matplotlib) are not Python; blank lines keep
                # the line numbers of tracebacks right.
                code = re.sub(r"(?m)^[ \t]*[!%].*$", "", code)
                units.append((f"{rel} cell {i}", code))
        return units
    blocks = re.findall(r"(?ms)^```python[^\n]*\n(.*?)^```", text)
    return [(f"{rel} block {i}", block) for i, block in enumerate(blocks)]


def bound_names(node: ast.stmt) -> frozenset:
    """The module-level names a definition, an import or a plain assignment binds."""
    if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        return frozenset([node.name])
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return frozenset((a.asname or a.name).split(".")[0] for a in node.names)
    if isinstance(node, ast.Assign):
        return frozenset(t.id for t in node.targets if isinstance(t, ast.Name))
    return frozenset()


def free_names(node: ast.stmt) -> frozenset:
    """Names a statement reads and does not bind itself: the globals it needs. Any name stored
    anywhere inside counts as local, which errs towards pulling in less of a notebook (cells
    such as `keys = inputs @ W_key` share names with the methods' locals)."""
    loads, stores = set(), set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            (loads if isinstance(sub.ctx, ast.Load) else stores).add(sub.id)
        elif isinstance(sub, ast.arg):
            stores.add(sub.arg)
    return frozenset(loads - stores)


def statements(path: Path, root: Path) -> List[Statement]:
    """The definitions, imports and plain assignments at the top level of a source, in order.
    Units that do not parse (prose in a notebook, another Python's syntax) are left out."""
    found = []
    for label, code in code_units(path, root):
        try:
            tree = ast.parse(code, filename=label)
        except SyntaxError:
            continue
        flags = 0
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                for alias in node.names:
                    flags |= getattr(__import__("__future__"), alias.name).compiler_flag
            binds = bound_names(node)
            if binds:
                found.append(Statement(label, node, flags, binds, free_names(node)))
    return found


def candidate_files(root: Path, where: List[str]) -> List[Path]:
    """The files to look in, in order: each named file, or for a folder its .py files, then its
    notebooks, then its README.md."""
    files = []
    for entry in where:
        path = root / entry
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files += sorted(path.glob("*.py")) + sorted(path.glob("*.ipynb"))
            if (path / "README.md").is_file():
                files.append(path / "README.md")
    return files


def pick(stmts: List[Statement], name: str) -> List[Statement]:
    """The class's (last) definition and, transitively, the statements binding the globals it
    uses: for each, the last binding before its user, else the first after it."""
    classes = [i for i, s in enumerate(stmts)
               if isinstance(s.node, ast.ClassDef) and s.node.name == name]
    chosen, todo = {classes[-1]}, [classes[-1]]
    while todo:
        user = todo.pop()
        for needed in stmts[user].uses:
            before = [i for i in range(user) if needed in stmts[i].binds]
            after = [i for i in range(user + 1, len(stmts)) if needed in stmts[i].binds]
            source = before[-1] if before else (after[0] if after else None)
            if source is not None and source not in chosen:
                chosen.add(source)
                todo.append(source)
    return [stmts[i] for i in sorted(chosen)]


class NotInBook(Exception):
    pass


def load_book_class(root: Path, where: List[str], name: str) -> Tuple[type, str]:
    """The book's class `name` from the first file in `where` that defines it, executed in a
    fresh module, and the label of the unit it came from."""
    for path in candidate_files(root, where):
        stmts = statements(path, root)
        if not any(isinstance(s.node, ast.ClassDef) and s.node.name == name for s in stmts):
            continue
        module = types.ModuleType(f"book_{name}")
        # The usual aliases, for a class whose imports sit in a unit that did not parse.
        module.__dict__.update(torch=torch, nn=nn, F=torch.nn.functional, __builtins__=builtins)
        sys.modules[module.__name__] = module  # dataclasses and pickling look modules up
        # Imports of sibling files (previous_chapters) and of the book's package resolve.
        extra = [str(path.parent), str(root / "pkg")]
        sys.path[:0] = extra
        try:
            picked = pick(stmts, name)
            for s in picked:
                code = compile(ast.Module(body=[s.node], type_ignores=[]), s.label, "exec",
                               flags=s.flags, dont_inherit=True)
                exec(code, module.__dict__)
        finally:
            del sys.path[:len(extra)]
        label = next(s.label for s in picked
                     if isinstance(s.node, ast.ClassDef) and s.node.name == name)
        return module.__dict__[name], label
    if not any((root / entry).exists() for entry in where):
        raise NotInBook(f"{' and '.join(where)} not in this tree")
    raise NotInBook(f"no `class {name}` in {', '.join(where)}")


# --------------------------------------------------------------------------------------------
# Comparisons


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b|, with equal infinities counting as no difference."""
    a, b = a.detach().double(), b.detach().double()
    diff = torch.where(a == b, torch.zeros_like(a), (a - b).abs())
    return diff.max().item() if diff.numel() else 0.0


def relative_diff(ref: torch.Tensor, out: torch.Tensor) -> float:
    scale = ref.detach().abs().max().item() if ref.numel() else 0.0
    return max_abs_diff(ref, out) / max(scale, 1e-30)


def key_problems(ref_sd: Dict, book_sd: Dict) -> List[str]:
    """Check 1: the same keys in the same order with the same shapes."""
    ref_keys, book_keys = list(ref_sd), list(book_sd)
    problems = []
    only_ref = [k for k in ref_keys if k not in book_sd]
    only_book = [k for k in book_keys if k not in ref_sd]
    if only_ref:
        problems.append(f"stand-in only: {', '.join(only_ref)}")
    if only_book:
        problems.append(f"book only: {', '.join(only_book)}")
    shapes = [f"{k} {tuple(ref_sd[k].shape)} vs book {tuple(book_sd[k].shape)}"
              for k in ref_keys if k in book_sd and ref_sd[k].shape != book_sd[k].shape]
    if shapes:
        problems.append("shapes: " + "; ".join(shapes))
    shared_ref = [k for k in ref_keys if k in book_sd]
    shared_book = [k for k in book_keys if k in ref_sd]
    if shared_ref != shared_book:
        # The stretch that differs, from its first to its last differing position.
        moved = [i for i, (a, b) in enumerate(zip(shared_ref, shared_book)) if a != b]
        first, last = moved[0], moved[-1] + 1
        problems.append(f"order from key {first}: stand-in {', '.join(shared_ref[first:last])}"
                        f" vs book {', '.join(shared_book[first:last])}")
    return problems


def init_differences(ref_sd: Dict, book_sd: Dict) -> Dict[str, float]:
    """Check 2: every tensor both have, bit for bit; max |diff| of each that differs."""
    return {k: max_abs_diff(v, book_sd[k]) for k, v in ref_sd.items()
            if k in book_sd and v.shape == book_sd[k].shape and not torch.equal(v, book_sd[k])}


def tensors(out) -> List[torch.Tensor]:
    """The tensors of a forward's result, flattened out of tuples and lists. None holds none (the
    book's reading MultiHeadAttentionWithKVSharing passes on None where the stand-in passes on
    the shared keys and values again)."""
    if out is None:
        return []
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for item in out for t in tensors(item)]


def compare_plain(ref, inputs, ref_out, book_out, tolerance):
    """Every output tensor within tolerance. Like the other compare functions, it returns
    (ok, largest relative difference or None, a note for the line)."""
    ref_t, book_t = tensors(ref_out), tensors(book_out)
    if [t.shape for t in ref_t] != [t.shape for t in book_t]:
        return False, None, (f"output shapes {[tuple(t.shape) for t in ref_t]} vs book "
                             f"{[tuple(t.shape) for t in book_t]}")
    worst = max(relative_diff(r, b) for r, b in zip(ref_t, book_t))
    ok = worst <= tolerance
    return ok, worst, "" if ok else f"max rel diff {worst:.2g} (tolerance {tolerance:g})"


# --------------------------------------------------------------------------------------------
# Class-specific pieces: how to call, how to compare, known failures of the book's code


def causal_float_mask(t: int, dtype: torch.dtype) -> torch.Tensor:
    future = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
    return torch.zeros(t, t, dtype=dtype).masked_fill(future, float("-inf"))


def call_plain(module, inputs):
    return module(*inputs)


def call_indexer(topk: int):
    """LightningIndexer(x, x_ctx, topk, causal_mask) on a sequence attending to itself."""
    def call(module, inputs):
        (x,) = inputs
        return module(x, x, topk, causal_float_mask(x.shape[1], x.dtype))
    return call


def call_kv_sharing(module, inputs):
    """A producing call on x, then a reading call whose queries x_next (as many tokens as x, or
    its last ones) attend to the keys and values it returned. Returns (out, keys, values,
    out_next), keys and values laid out (b, H, T, hd) as the stand-in's are (the book's are
    (b, T, H, hd)). What the reading call passes on is left out: the stand-in passes on the
    shared keys and values again, the book None, and neither's GPT uses it."""
    x, x_next = inputs
    out, (keys, values) = module(x)
    if isinstance(module, reference.MultiHeadAttentionWithKVSharing):
        out_next, _ = module(x_next, shared_kv=(keys, values))
        return out, keys, values, out_next
    return (out, keys.transpose(1, 2), values.transpose(1, 2),
            book_cached_read(module, x_next, keys, values))


def book_cached_read(module, x_next, keys, values):
    """The book's reading call made through its KV cache, as its GPT makes it while generating.
    Without the cache its mask puts the queries at positions 0..T_q-1, so queries fewer than the
    keys would see the first keys, where the stand-in (and the cache) align them with the last;
    the book's GPT never reads that way. The earlier positions are read first, with the shared
    keys and values as they were then, only to move the layer's position on: zeros stand in for
    their hidden states, and their output is not compared."""
    earlier = keys.shape[1] - x_next.shape[1]  # the book's layout: tokens in dimension 1
    module.reset_cache()
    if earlier:
        module(x_next.new_zeros(x_next.shape[0], earlier, x_next.shape[2]), use_cache=True,
               shared_kv=(keys[:, :earlier], values[:, :earlier]))
    out_next, _ = module(x_next, use_cache=True, shared_kv=(keys, values))
    module.reset_cache()  # leaves the module as a cache-less call would
    return out_next


def indexer_scores(indexer, x: torch.Tensor) -> torch.Tensor:
    """The lightning indexer's scores I[t, s] plus the causal mask, from the stand-in's
    weights: used only to find where the top-k is ambiguous (equal scores at the cut)."""
    b, t, _ = x.shape
    q = indexer.W_q_index(x).view(b, t, indexer.index_n_heads, indexer.index_head_dim)
    raw = torch.relu(torch.einsum("bthd,bsd->bths", q, indexer.W_k_index(x)) * indexer.scale)
    weights = indexer.W_weights(x).softmax(dim=-1)
    return torch.einsum("bth,bths->bts", weights, raw) + causal_float_mask(t, x.dtype)


def tied_at_cut(scores: torch.Tensor, k: int) -> torch.Tensor:
    """(B, T) True where the k-th and (k+1)-th highest scores are equal and finite: torch.topk
    may then take either token, and the stand-in takes the earlier one. Ties among -inf (future
    tokens) are harmless: the causal mask hides them whichever is taken."""
    ordered = scores.sort(dim=-1, descending=True).values
    if k >= ordered.shape[-1]:
        return torch.zeros(ordered.shape[:-1], dtype=torch.bool)
    kth, next_ = ordered[..., k - 1], ordered[..., k]
    return (kth == next_) & torch.isfinite(kth)


def compare_indexer(topk: int):
    """Top-k positions agree as sets over the causally visible tokens; where scores tie at the
    cut, both choices must hold the same scores."""
    def compare(ref, inputs, ref_out, book_out, tolerance):
        (x,) = inputs
        scores = indexer_scores(ref, x)
        visible = torch.isfinite(scores)
        chosen = [torch.zeros_like(visible).scatter(-1, out, True) & visible
                  for out in (ref_out, book_out)]
        tied = tied_at_cut(scores, min(topk, x.shape[1]))
        differs = (chosen[0] != chosen[1]).any(-1)
        untied = differs & ~tied
        if untied.any():
            return False, None, f"top-k sets differ at {int(untied.sum())} untied queries"
        for row in zip(*torch.nonzero(differs & tied, as_tuple=True)):
            picked = [scores[row][c[row]].sort().values for c in chosen]
            if not torch.equal(*picked):
                return False, None, f"top-k differs at tied query {tuple(int(i) for i in row)}"
        changed = int((differs & tied).sum())
        return True, None, f"{changed} queries chose among tokens tied at the cut differently"
    return compare


def compare_dsa(ref, inputs, ref_out, book_out, tolerance):
    """Outputs agree at every query whose top-k is unambiguous."""
    (x,) = inputs
    tied = tied_at_cut(indexer_scores(ref.indexer, x), min(ref.topk, x.shape[1]))
    keep = ~tied
    if not keep.any():
        return True, None, "every query tied at the top-k cut: nothing compared"
    worst = relative_diff(ref_out[keep], book_out[keep])
    note = f"{int(tied.sum())} queries tied at the top-k cut left out" if tied.any() else ""
    ok = worst <= tolerance
    return ok, worst, note if ok else f"max rel diff {worst:.2g} (tolerance {tolerance:g})"


def deltanet_gate_layout(ref, book, inputs, error: Exception, tolerance: float) -> Optional[str]:
    """The book's GatedDeltaNet multiplies its normalized context, laid out (B, T, H, hd), by a
    gate it has transposed to (B, H, T, hd), so broadcasting fails unless T == num_heads. This
    verifies that reading of `error`: the book's forward must run at T == num_heads and match
    the stand-in once its W_gate output is pre-transposed (which its transpose then undoes).
    Returns the reason to print, or None if the failure is something else."""
    (x,) = inputs
    h, t = ref.num_heads, x.shape[1]
    if t <= h or "must match the size" not in str(error):
        return None
    square = x[:, :h]
    with torch.no_grad():
        expected = ref(square)
        as_is = relative_diff(expected, book(square))
        hook = book.W_gate.register_forward_hook(
            lambda m, i, out: out.view(out.shape[0], h, h, -1).transpose(1, 2).reshape(out.shape))
        try:
            fixed = relative_diff(expected, book(square))
        finally:
            hook.remove()
    if fixed > tolerance:
        return None
    message = str(error).splitlines()[0]
    return (f"the book's forward fails at T={t} != num_heads={h} ({message}); at T == num_heads "
            f"it runs with the gate transposed (rel diff {as_is:.2g}), and with the gate laid "
            f"out to undo that it matches (rel diff {fixed:.2g})")


# --------------------------------------------------------------------------------------------
# The pairs


@dataclass
class Case:
    """One option set: constructor arguments of each side, and the input shapes."""
    label: str
    ref_args: dict
    book_args: dict
    shapes: List[Tuple[int, ...]]


@dataclass
class Pair:
    """A stand-in, the book's class it is compared with, and how to compare them."""
    name: str                       # the stand-in's class in reference.py
    book_name: str
    where: List[str]                # where in the book, in order of preference
    cases: List[Case]
    mirror: bool = True             # False: another book class, so forward only
    call: Callable = call_plain
    compare: Callable = compare_plain
    known_failure: Optional[Callable] = None
    label: str = ""                 # the line's name when not just `name`
    adapted: str = ""               # how the call meets the book's class, said on the line


def mha(d_in, d_out, ctx, heads, **extra):
    return dict(d_in=d_in, d_out=d_out, context_length=ctx, dropout=0.0, num_heads=heads, **extra)


def no_ctx(d_in, d_out, heads, **extra):
    return dict(d_in=d_in, d_out=d_out, dropout=0.0, num_heads=heads, **extra)


CH03 = ["pkg/llms_from_scratch/ch03.py", "ch03/01_main-chapter-code/ch03.ipynb"]

PAIRS = [
    # The book's SelfAttention_v1 is the stand-in with d_out_kq == d_out_v, on unbatched input
    # (it transposes keys with .T).
    Pair("SelfAttention", "SelfAttention_v1", CH03, [
        Case("d_in 6, d_out 4", dict(d_in=6, d_out_kq=4, d_out_v=4), dict(d_in=6, d_out=4),
             [(5, 6)]),
        Case("d_in 3, d_out 7", dict(d_in=3, d_out_kq=7, d_out_v=7), dict(d_in=3, d_out=7),
             [(6, 3)]),
    ]),
    Pair("MultiHeadAttention", "MultiHeadAttention", CH03, [
        Case("3 heads", mha(8, 12, 10, 3), mha(8, 12, 10, 3), [(2, 5, 8)]),
        Case("qkv_bias, 2 heads, T = context", mha(6, 8, 7, 2, qkv_bias=True),
             mha(6, 8, 7, 2, qkv_bias=True), [(2, 7, 6)]),
    ]),
    # Options of the stand-in's MultiHeadAttention that the book writes as classes of their own.
    # Their state dicts differ by design (GroupedQueryAttention makes W_key and W_value before
    # W_query and has no out_proj bias; neither has the ch03 mask buffer), so only the
    # arithmetic is compared.
    Pair("MultiHeadAttention", "GroupedQueryAttention", ["ch04/04_gqa/gpt_with_kv_gqa.py"], [
        Case("4 heads, 2 kv heads", mha(8, 16, 10, 4, num_kv_heads=2),
             no_ctx(8, 16, 4, num_kv_groups=2), [(2, 6, 8)]),
        Case("qkv_bias, 6 heads, 1 kv head", mha(8, 12, 10, 6, num_kv_heads=1, qkv_bias=True),
             no_ctx(8, 12, 6, num_kv_groups=1, qkv_bias=True), [(2, 5, 8)]),
    ], mirror=False, label="MultiHeadAttention(num_kv_heads)"),
    Pair("MultiHeadAttention", "MultiHeadAttentionWithSWA", ["ch04/06_swa/gpt_with_kv_swa.py"], [
        Case("window 3", mha(8, 12, 10, 3, sliding_window=3),
             no_ctx(8, 12, 3, sliding_window_size=3), [(2, 8, 8)]),
        Case("qkv_bias, window 1", mha(6, 8, 10, 2, sliding_window=1, qkv_bias=True),
             no_ctx(6, 8, 2, sliding_window_size=1, qkv_bias=True), [(2, 5, 6)]),
    ], mirror=False, label="MultiHeadAttention(sliding_window)"),
    # The stand-in's rope_dim, q_latent_dim and latent_norm (DeepSeek-V2's parts) stay off.
    Pair("MultiHeadLatentAttention", "MultiHeadLatentAttention", ["ch04/05_mla"], [
        Case("default latent", no_ctx(8, 12, 3), no_ctx(8, 12, 3), [(2, 5, 8)]),
        Case("latent 5, qkv_bias", no_ctx(8, 12, 2, latent_dim=5, qkv_bias=True),
             no_ctx(8, 12, 2, latent_dim=5, qkv_bias=True), [(2, 6, 8)]),
    ]),
    Pair("GatedMultiHeadAttention", "GatedMultiHeadAttention", ["ch04/08_deltanet"], [
        Case("3 heads", mha(8, 12, 10, 3), mha(8, 12, 10, 3), [(2, 5, 8)]),
        Case("qkv_bias, 2 heads", mha(6, 8, 7, 2, qkv_bias=True),
             mha(6, 8, 7, 2, qkv_bias=True), [(2, 7, 6)]),
    ]),
    Pair("GatedDeltaNet", "GatedDeltaNet", ["ch04/08_deltanet"], [
        Case("3 heads", no_ctx(8, 12, 3), no_ctx(8, 12, 3), [(2, 5, 8)]),
        Case("qkv_bias, 2 heads", no_ctx(6, 8, 2, qkv_bias=True),
             no_ctx(6, 8, 2, qkv_bias=True), [(2, 4, 6)]),
    ], known_failure=deltanet_gate_layout),
    # One index head makes ties at zero (ReLU) common, where torch.topk and the stand-in's
    # stable sort may choose differently.
    Pair("LightningIndexer", "LightningIndexer", ["ch04/09_dsa"], [
        Case("3 index heads of 4", dict(d_model=8, index_n_heads=3, index_head_dim=4),
             dict(d_model=8, index_n_heads=3, index_head_dim=4), [(2, 7, 8)]),
        Case("1 index head of 5", dict(d_model=6, index_n_heads=1, index_head_dim=5),
             dict(d_model=6, index_n_heads=1, index_head_dim=5), [(3, 9, 6)]),
    ], call=call_indexer(3), compare=compare_indexer(3)),
    Pair("MultiHeadAttentionWithDSA", "MultiHeadAttentionWithDSA", ["ch04/09_dsa"], [
        Case("top 3", no_ctx(8, 12, 3, index_n_heads=2, index_head_dim=4, topk=3),
             no_ctx(8, 12, 3, index_n_heads=2, index_head_dim=4, topk=3), [(2, 7, 8)]),
        Case("qkv_bias, top 2, default indexer",
             no_ctx(6, 8, 2, qkv_bias=True, topk=2), no_ctx(6, 8, 2, qkv_bias=True, topk=2),
             [(2, 5, 6)]),
        Case("top 3, 1 index head", no_ctx(8, 12, 3, index_n_heads=1, index_head_dim=4, topk=3),
             no_ctx(8, 12, 3, index_n_heads=1, index_head_dim=4, topk=3), [(3, 9, 8)]),
    ], compare=compare_dsa),
    Pair("MultiHeadAttentionWithKVSharing", "MultiHeadAttentionWithKVSharing",
         ["ch04/10_kv-sharing"], [
        Case("3 heads", no_ctx(8, 12, 3), no_ctx(8, 12, 3), [(2, 5, 8), (2, 5, 8)]),
        Case("qkv_bias, 2 heads", no_ctx(6, 8, 2, qkv_bias=True),
             no_ctx(6, 8, 2, qkv_bias=True), [(2, 4, 6), (2, 4, 6)]),
        # The last 3 of 5 tokens read, as in the book's GPT generating with its cache.
        Case("4 heads, 3 queries read 5 keys", no_ctx(8, 16, 4), no_ctx(8, 16, 4),
             [(2, 5, 8), (2, 3, 8)]),
    ], call=call_kv_sharing,
         adapted="the book's shared K/V transposed from (b, T, H, hd) to the stand-in's "
                 "(b, H, T, hd); what a reading layer passes on ignored (book None, stand-in the "
                 "K/V again); the book's reading layer called through its KV cache, whose mask "
                 "aligns fewer queries than keys with the last keys as the stand-in's does (its "
                 "cache-less mask, which its GPT never uses so, aligns them with the first)"),
]

# Stand-ins with no book class to compare with, and why. Where a book class of the same role
# exists, its state_dict keys are printed beside the stand-in's as evidence.
NOT_MIRRORS = {
    "MultiHeadAttentionWrapper": (
        "the article's wrapper of non-causal SelfAttention heads (raw W_query); the book's "
        "wraps CausalAttention", "MultiHeadAttentionWrapper", CH03,
        dict(d_in=4, d_out_kq=2, d_out_v=2, num_heads=2),
        dict(d_in=4, d_out=2, context_length=3, dropout=0.0, num_heads=2)),
    "CausalSelfAttention": (
        "the article's class (raw W_query tensors from torch.rand); the book's CausalAttention "
        "uses nn.Linear", "CausalAttention", CH03,
        dict(d_in=4, d_out_kq=2, d_out_v=2), dict(d_in=4, d_out=2, context_length=3, dropout=0.0)),
    "CrossAttention": ("the article's class; the book has no cross-attention", None, None,
                       None, None),
    "KVSharingStack": ("runs MultiHeadAttentionWithKVSharing layers as the book's GPT does; the "
                       "book has no such class (its layer is checked on its own)", None, None,
                       None, None),
    "RMSNorm": ("stands in for torch.nn.RMSNorm, not for a book class", None, None, None, None),
}


# --------------------------------------------------------------------------------------------
# Running the checks


@dataclass
class Outcome:
    """What the runs (option set x seed) of one pair found."""
    runs: int = 0
    failures: Dict[str, List[Tuple[str, str]]] = field(default_factory=dict)  # (message, where)
    init_diffs: Dict[str, float] = field(default_factory=dict)  # tensor -> largest max |diff|
    skips: List[str] = field(default_factory=list)
    worst: Optional[float] = None  # the forward's largest relative difference
    notes: List[str] = field(default_factory=list)
    float32: bool = False

    def fail(self, check: str, where: str, message: str):
        self.failures.setdefault(check, []).append((message, where))


def make_inputs(shapes, seed: int, dtype: torch.dtype) -> List[torch.Tensor]:
    """Random inputs drawn from their own generator, so that they do not depend on (or move)
    the global seed the constructors use."""
    generator = torch.Generator().manual_seed(10_000 + seed)
    return [torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)
            for shape in shapes]


def load_weights(ref: nn.Module, book: nn.Module, mirror: bool):
    """The stand-in's tensors into the book's module. For another book class (mirror False)
    they go by name; a stand-in parameter the book's class lacks (GroupedQueryAttention's
    out_proj has no bias) is zeroed, which is what its absence computes."""
    ref_sd, book_sd = ref.state_dict(), book.state_dict()
    if mirror:
        book.load_state_dict(ref_sd)
        return
    missing = [k for k in book_sd if k not in ref_sd]
    if missing:
        raise ValueError(f"the book's {', '.join(missing)} have no stand-in counterpart")
    book.load_state_dict({k: ref_sd[k] for k in book_sd}, strict=True)
    with torch.no_grad():
        for name, param in ref.named_parameters():
            if name not in book_sd:
                param.zero_()


def run_forward(pair: Pair, case: Case, seed: int, ref, book, out: Outcome, where: str):
    """Check 3, in float64 if the book's class runs in it, else float32."""
    for dtype, tolerance in ((torch.float64, FLOAT64_TOLERANCE),
                             (torch.float32, FLOAT32_TOLERANCE)):
        ref_d, book_d = ref.to(dtype).eval(), book.to(dtype).eval()
        inputs = make_inputs(case.shapes, seed, dtype)
        with torch.no_grad():
            ref_out = pair.call(ref_d, inputs)
            try:
                book_out = pair.call(book_d, inputs)
            except Exception as error:  # the book's code may fail in any way; report it
                if pair.known_failure is not None:
                    reason = pair.known_failure(ref_d, book_d, inputs, error, tolerance)
                    if reason is not None:
                        out.skips.append(reason)
                        return
                if dtype == torch.float64:
                    continue
                out.fail("forward", where, f"the book's forward raised {error!r}")
                return
        out.float32 |= dtype != torch.float64
        ok, worst, note = pair.compare(ref_d, inputs, ref_out, book_out, tolerance)
        if worst is not None:
            out.worst = max(worst, out.worst or 0.0)
        if not ok:
            out.fail("forward", where, note)
        elif note:
            out.notes.append(note)
        return


def check_pair(pair: Pair, book_class: type, seeds: List[int]) -> Outcome:
    ref_class = getattr(reference, pair.name)
    out = Outcome()
    for case, seed in itertools.product(pair.cases, seeds):
        where = f"{case.label}, seed {seed}"
        out.runs += 1
        torch.manual_seed(seed)
        ref = ref_class(**case.ref_args)
        torch.manual_seed(seed)
        try:
            book = book_class(**case.book_args)
        except Exception as error:
            out.fail("construct", where, f"the book's class raised {error!r}")
            continue
        ref_sd, book_sd = ref.state_dict(), book.state_dict()
        if pair.mirror:
            problems = key_problems(ref_sd, book_sd)
            for problem in problems:
                out.fail("keys", where, problem)
            differing = init_differences(ref_sd, book_sd)
            if differing:
                out.fail("init", where, ", ".join(differing))
                for name, diff in differing.items():
                    out.init_diffs[name] = max(diff, out.init_diffs.get(name, 0.0))
            if problems:
                continue  # no faithful way to give the book's module the stand-in's weights
        try:
            load_weights(ref, book, pair.mirror)
        except Exception as error:
            out.fail("forward", where, f"cannot load the stand-in's weights: {error}")
            continue
        run_forward(pair, case, seed, ref, book, out, where)
    return out


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def kinds(messages: List[str]) -> int:
    """How many different messages there are, numbers aside."""
    return len({re.sub(r"\d+(\.\d+)?(e-?\d+)?", "#", m) for m in messages})


def summed_notes(notes: List[str]) -> List[str]:
    """Notes of all runs ("3 queries tied ..."), their leading counts summed per kind."""
    totals: Dict[str, int] = {}
    for note in notes:
        count, _, text = note.partition(" ")
        if count.isdigit():
            totals[text] = totals.get(text, 0) + int(count)
        else:
            totals.setdefault(note, -1)
    return [text if n < 0 else f"{n} {text}" for text, n in totals.items()]


def summary(outcome: Outcome, mirror: bool) -> Tuple[str, str]:
    """The line's status and text."""
    checks = ["keys", "init", "forward"] if mirror else ["forward"]
    runs = outcome.runs
    parts = []
    for check in ["construct"] + checks:
        found = outcome.failures.get(check)
        if not found:
            continue
        if check == "init":
            tensors_text = ", ".join(f"{name} (max|diff| up to {diff:.3g})"
                                     for name, diff in outcome.init_diffs.items())
            parts.append(f"init differs in {len(found)} of {runs} runs: {tensors_text}")
            continue
        message, where = found[0]
        others = kinds([m for m, _ in found]) - 1
        parts.append(f"{check} fails in {len(found)} of {runs} runs: {message} (first in "
                     f"{where}" + (f"; {plural(others, 'other message')})" if others else ")"))
    skipped = ""
    if outcome.skips:
        others = kinds(outcome.skips) - 1
        skipped = (f"forward skipped in {len(outcome.skips)} of {runs} runs: {outcome.skips[0]}"
                   + (f" ({plural(others, 'other reason')})" if others else ""))
    if parts:
        if "keys" in outcome.failures:
            parts.append("forward not compared where the keys differ")
        return "FAIL", "; ".join(parts + ([skipped] if skipped else []))
    compared = [c for c in checks if c != "forward" or len(outcome.skips) < runs]
    text = (", ".join(compared[:-1]) + " and " if len(compared) > 1 else "") + compared[-1]
    text += f" agree{'s' if len(compared) == 1 else ''} in {runs} runs"
    if "forward" in compared:
        details = ["forward in float32 (the book's class fails in float64)" if outcome.float32
                   else "forward in float64"]
        if outcome.worst is not None:
            details.append(f"max rel diff {outcome.worst:.2g}")
        details += summed_notes(outcome.notes)
        text += f" ({', '.join(details)})"
    return "PASS", text + (f"; {skipped}" if skipped else "")


def book_commit(root: Path, given: Optional[str]) -> str:
    """The checkout's HEAD, else --commit, else unknown."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        head = ""
    # A tree extracted inside some other repository would report that repository's HEAD.
    inside = (root / ".git").exists()
    if head and inside:
        if given and not head.startswith(given):
            return f"{head} (git checkout; --commit {given} ignored)"
        return f"{head} (git checkout)"
    if given:
        return f"{given} (from --commit)"
    return "unknown (not a git checkout; name it with --commit)"


def not_mirror_line(root: Path, name: str) -> str:
    reason, book_name, where, ref_args, book_args = NOT_MIRRORS[name]
    if book_name is None:
        return reason
    try:
        book_class, label = load_book_class(root, where, book_name)
        ref_keys = list(getattr(reference, name)(**ref_args).state_dict())
        book_keys = list(book_class(**book_args).state_dict())
        return f"{reason}: book {book_name} ({label}) keys {book_keys} vs stand-in {ref_keys}"
    except Exception as error:
        return f"{reason} ({book_name} not loaded: {error})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--book", required=True, type=Path,
                        help="a checkout or extracted tree of rasbt/LLMs-from-scratch")
    parser.add_argument("--commit", help="the tree's commit, when it is not a git checkout")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 123])
    args = parser.parse_args(argv)
    root = args.book.resolve()
    if not (root / "ch03").is_dir():
        parser.error(f"{root} does not look like LLMs-from-scratch (no ch03/)")

    print(f"book: {root}")
    print(f"book commit: {book_commit(root, args.commit)}")
    print(f"stand-ins: {Path(reference.__file__).resolve()}")
    rmsnorm = install_rmsnorm()
    print(f"torch {torch.__version__}: " + (
        "no torch.nn.RMSNorm, so this script's stand-in was installed as torch.nn.RMSNorm "
        "(weight `weight`, x * rsqrt(mean(x^2) + eps) * weight)" if rmsnorm
        else "torch.nn.RMSNorm is PyTorch's own"))
    print(f"seeds: {' '.join(map(str, args.seeds))}")
    torch.set_grad_enabled(False)

    failed = False
    covered = set()
    for pair in PAIRS:
        covered.add(pair.name)
        label = pair.label or pair.name
        try:
            book_class, where = load_book_class(root, pair.where, pair.book_name)
        except NotInBook as missing:
            print(f"SKIP {label}: {missing}")
            continue
        except Exception as error:
            print(f"FAIL {label}: the book's {pair.book_name} did not load: {error!r}")
            failed = True
            continue
        status, text = summary(check_pair(pair, book_class, args.seeds), pair.mirror)
        if pair.adapted:
            text += f"; adapted: {pair.adapted}"
        failed |= status == "FAIL"
        print(f"{status} {label} vs {pair.book_name} [{where}]: {text}")
    for name, cls in vars(reference).items():
        if isinstance(cls, type) and issubclass(cls, nn.Module) and cls.__module__ == "reference":
            if name in NOT_MIRRORS:
                print(f"SKIP {name}: {not_mirror_line(root, name)}")
            elif name not in covered:
                print(f"SKIP {name}: no book counterpart known to this script")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
