"""The operators of libattention_ops from Python: outputs against the attention formula written
out here in float64, gradients by torch.autograd.gradcheck in float64 on each class of options
of docs/CONTRACT.md, the packed and rotary operators, MultiHeadAttention against the book's
class, TorchScript, bad arguments, and (PyTorch 2) torch.compile, torch.export and
torch.library.opcheck.

    ATTENTION_OPS_LIBRARY=build/libattention_ops.so PYTHONPATH=python:scripts \\
        /usr/bin/python3 -m unittest discover -s python/tests -v
"""

import io
import math
import os
import unittest

import torch

import attention_ops
import reference  # scripts/reference.py: the book's classes

OPS = torch.ops.attention
INT64_MAX = 2**63 - 1
TORCH2 = int(torch.__version__.split(".")[0]) >= 2


def has_aot_inductor_packages():
    if not TORCH2:
        return False
    try:
        import torch._inductor
    except ImportError:
        return False
    return hasattr(torch._inductor, "aoti_compile_and_package")


def formula(q, k, v, attn_mask=None, is_causal=False, top_left=False, window_left=None,
            window_right=None, alibi_slopes=None, softcap=None, sinks=None, scale=None):
    """softmax(Q K^T * scale + mask) V in float64, every option written out; a query that sees
    no key gives zeros (docs/CONTRACT.md)."""
    dtype = q.dtype
    q, k, v = q.double(), k.double(), v.double()
    unbatched = q.dim() == 2
    if unbatched:
        q, k, v = q[None], k[None], v[None]
    group = q.shape[-3] // k.shape[-3]
    k = k.repeat_interleave(group, dim=-3)
    v = v.repeat_interleave(group, dim=-3)
    tq, tk = q.shape[-2], k.shape[-2]
    s = q @ k.transpose(-1, -2) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    pos = torch.arange(tq)[:, None] + (0 if top_left else tk - tq)
    key = torch.arange(tk)[None, :]
    if alibi_slopes is not None:
        s = s - alibi_slopes.double()[:, None, None] * (pos - key).abs()
    hidden = torch.zeros(tq, tk, dtype=torch.bool)
    if is_causal:
        hidden |= key > pos
    if window_left is not None:
        hidden |= key < pos - window_left
    if window_right is not None:
        hidden |= key > pos + window_right
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        hidden = hidden | attn_mask
    elif attn_mask is not None:
        s = s + attn_mask.double()
    s = s.masked_fill(hidden, -math.inf)
    if sinks is not None:
        sink = sinks.double()[:, None, None].expand(*s.shape[:-1], 1)
        s = torch.cat([s, sink], dim=-1)
    top = s.amax(-1, keepdim=True)
    weights = torch.exp(s - top.clamp(min=-1e300))
    weights = weights / weights.sum(-1, keepdim=True)
    weights = torch.where(top == -math.inf, torch.zeros_like(weights), weights)
    if sinks is not None:
        weights = weights[..., :-1]
    out = weights @ v
    return (out[0] if unbatched else out).to(dtype)


def inputs(shape_q=(2, 4, 7, 8), shape_kv=(2, 2, 9, 8), dv=None, dtype=torch.float64, seed=0,
           grad=False):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(*shape_q, generator=generator, dtype=torch.float64)
    k = torch.randn(*shape_kv, generator=generator, dtype=torch.float64)
    v_shape = list(shape_kv)
    if dv is not None:
        v_shape[-1] = dv
    v = torch.randn(*v_shape, generator=generator, dtype=torch.float64)
    return [t.to(dtype).requires_grad_(grad) for t in (q, k, v)]


# Each class of options of docs/CONTRACT.md the operator carries, as operator arguments; the
# shapes are (2, 4, 7, 8) queries against (2, 2, 9, 8) keys unless a case says otherwise.
def option_cases():
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], dtype=torch.float64)
    mask_bool = torch.rand(7, 9, generator=torch.Generator().manual_seed(1)) < 0.3
    mask_float = torch.randn(2, 1, 7, 9, generator=torch.Generator().manual_seed(2),
                             dtype=torch.float64)
    sinks = torch.tensor([0.3, -0.2, 1.0, 0.0], dtype=torch.float64)
    return {
        "plain": {},
        "causal bottom-right, Tq < Tk": {"is_causal": True},
        "causal top-left": {"is_causal": True, "causal_alignment": "top_left"},
        "sliding window": {"is_causal": True, "window_left": 3},
        "two-sided window": {"window_left": 2, "window_right": 1},
        "window up to INT64_MAX": {"is_causal": True, "window_left": INT64_MAX},
        "ALiBi": {"is_causal": True, "alibi_slopes": slopes},
        "soft-capping": {"softcap": 2.0},
        "sinks": {"is_causal": True, "sinks": sinks},
        "scale": {"scale": 0.3},
        "bool mask (true = hidden)": {"attn_mask": mask_bool},
        "float mask, broadcast": {"attn_mask": mask_float},
        "every option": {"is_causal": True, "window_left": 4, "alibi_slopes": slopes,
                         "softcap": 3.0, "sinks": sinks, "scale": 0.4, "attn_mask": mask_bool},
    }


def formula_arguments(options):
    """The formula's keywords for operator options."""
    given = dict(options)
    top_left = given.pop("causal_alignment", "bottom_right") == "top_left"
    return dict(given, top_left=top_left)


def operator(q, k, v, options, backend="auto"):
    options = dict(options)
    mask = options.pop("attn_mask", None)
    causal = options.pop("is_causal", False)
    return OPS.scaled_dot_product_attention(q, k, v, mask, causal, backend=backend, **options)


class Forward(unittest.TestCase):
    def test_each_option_class_matches_the_formula_on_every_backend(self):
        for name, options in option_cases().items():
            for backend in ("auto", "chunked", "math"):
                with self.subTest(options=name, backend=backend):
                    q, k, v = inputs()
                    got = operator(q, k, v, options, backend)
                    expected = formula(q, k, v, **formula_arguments(options))
                    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)

    def test_float32_and_bfloat16_within_the_contract(self):
        for dtype, tolerance in ((torch.float32, 2e-5), (torch.bfloat16, 3e-2)):
            q, k, v = inputs((2, 4, 300, 64), (2, 2, 300, 64), dtype=dtype)
            got = OPS.scaled_dot_product_attention(q, k, v, None, True)
            expected = formula(q, k, v, is_causal=True)
            torch.testing.assert_close(got.double(), expected.double(), rtol=tolerance,
                                       atol=tolerance)

    def test_ranks_two_to_five_and_value_size(self):
        for shape_q, shape_kv in (((7, 8), (9, 8)), ((4, 7, 8), (2, 9, 8)),
                                  ((2, 3, 4, 7, 8), (2, 3, 1, 9, 8))):
            with self.subTest(shape=shape_q):
                q, k, v = inputs(shape_q, shape_kv, dv=5)
                got = OPS.scaled_dot_product_attention(q, k, v, None, True)
                self.assertEqual(got.shape, (*shape_q[:-1], 5))
                torch.testing.assert_close(got, formula(q, k, v, is_causal=True))

    def test_transposed_inputs_read_in_place(self):
        q, k, v = inputs((2, 7, 4, 8), (2, 9, 2, 8))
        got = OPS.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               v.transpose(1, 2))
        torch.testing.assert_close(got, formula(q.transpose(1, 2), k.transpose(1, 2),
                                                v.transpose(1, 2)))

    def test_empty_problems(self):
        q, k, v = inputs((2, 4, 7, 8), (2, 2, 0, 8))
        self.assertTrue(torch.equal(OPS.scaled_dot_product_attention(q, k, v),
                                    torch.zeros(2, 4, 7, 8, dtype=torch.float64)))
        q, k, v = inputs((2, 4, 0, 8), (2, 2, 9, 8))
        self.assertEqual(OPS.scaled_dot_product_attention(q, k, v).shape, (2, 4, 0, 8))

    def test_native_backend(self):
        q, k, v = inputs()
        got = OPS.scaled_dot_product_attention(q, k, v, None, True, backend="native")
        torch.testing.assert_close(got, formula(q, k, v, is_causal=True))

    def test_packed_sequences_match_each_sequence_alone(self):
        lengths_q, lengths_k = [5, 0, 3, 1], [6, 2, 3, 4]
        q, k, v = inputs((sum(lengths_q), 4, 8), (sum(lengths_k), 2, 8), dv=6)
        cu_q = torch.tensor([0] + lengths_q).cumsum(0).to(torch.int32)
        cu_k = torch.tensor([0] + lengths_k).cumsum(0)
        got = OPS.varlen_attention(q, k, v, cu_q, cu_k, True, window_left=2)
        for s in range(len(lengths_q)):
            rows = slice(int(cu_q[s]), int(cu_q[s + 1]))
            keys = slice(int(cu_k[s]), int(cu_k[s + 1]))
            alone = formula(q[rows].transpose(0, 1), k[keys].transpose(0, 1),
                            v[keys].transpose(0, 1), is_causal=True, window_left=2)
            torch.testing.assert_close(got[rows], alone.transpose(0, 1))

    def test_rotary_matches_rotate_half(self):
        x = torch.randn(2, 3, 10, 8, dtype=torch.float64)
        positions = torch.arange(5, 15)
        got = OPS.apply_rotary(x, positions, theta=500.0)
        freqs = 500.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
        angles = positions.double()[:, None] * freqs[None, :]
        cos, sin = angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)
        rotated = torch.cat([-x[..., 4:], x[..., :4]], dim=-1)
        torch.testing.assert_close(got, x * cos + rotated * sin)


class Gradients(unittest.TestCase):
    def test_gradcheck_each_option_class_fused_and_math(self):
        for name, options in option_cases().items():
            for backend in ("chunked", "math"):
                with self.subTest(options=name, backend=backend):
                    q, k, v = inputs((1, 4, 5, 4), (1, 2, 6, 4), grad=True)
                    local = dict(options)
                    if "attn_mask" in local:  # cut to these shapes
                        mask = local["attn_mask"]
                        local["attn_mask"] = mask[:1, :, :5, :6] if mask.dim() == 4 \
                            else mask[:5, :6]
                    sinks = local.pop("sinks", None)
                    if sinks is not None:
                        sinks = sinks.clone().requires_grad_()

                        def call(q, k, v, sinks):
                            return operator(q, k, v, dict(local, sinks=sinks), backend)
                        self.assertTrue(torch.autograd.gradcheck(call, (q, k, v, sinks)))
                    else:
                        self.assertTrue(torch.autograd.gradcheck(
                            lambda q, k, v: operator(q, k, v, local, backend), (q, k, v)))

    def test_fused_route_records_one_node(self):
        q, k, v = inputs(grad=True)
        out = OPS.scaled_dot_product_attention(q, k, v, None, True)
        self.assertEqual(type(out.grad_fn).__name__, "CppFunction")
        self.assertEqual(len(out.grad_fn.next_functions), 4)  # q, k, v and the sinks' place

    def test_gradcheck_packed_sequences(self):
        q, k, v = inputs((6, 2, 4), (7, 1, 4), grad=True)
        cu_q, cu_k = torch.tensor([0, 4, 4, 6]), torch.tensor([0, 3, 5, 7])
        self.assertTrue(torch.autograd.gradcheck(
            lambda q, k, v: OPS.varlen_attention(q, k, v, cu_q, cu_k, True), (q, k, v)))

    def test_bfloat16_gradients_near_float64(self):
        q, k, v = inputs((1, 2, 200, 32), (1, 2, 200, 32), dtype=torch.bfloat16, grad=True)
        OPS.scaled_dot_product_attention(q, k, v, None, True).float().square().sum().backward()
        q64, k64, v64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
        formula(q64, k64, v64, is_causal=True).square().sum().backward()
        for got, expected in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
            error = (got.double() - expected).abs().max() / expected.abs().max()
            self.assertLess(error.item(), 2**-6)

    def test_double_backward_refused_on_the_fused_route_and_computed_on_math(self):
        q, k, v = inputs((1, 2, 5, 4), (1, 2, 6, 4), grad=True)
        out = OPS.scaled_dot_product_attention(q, k, v, None, True)
        with self.assertRaisesRegex(RuntimeError, "attention::scaled_dot_product_attention: "
                                    "the fused CPU backward gives first-order gradients only"):
            torch.autograd.grad(out.square().sum(), q, create_graph=True)
        self.assertTrue(torch.autograd.gradgradcheck(
            lambda q, k, v: operator(q, k, v, {"is_causal": True}, "math"), (q, k, v)))

    def test_a_mask_that_needs_a_gradient_gets_it(self):
        q, k, v = inputs((1, 2, 5, 4), (1, 2, 6, 4), grad=True)
        mask = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
        self.assertTrue(torch.autograd.gradcheck(
            lambda mask: OPS.scaled_dot_product_attention(q, k, v, mask), (mask,)))


class Modules(unittest.TestCase):
    def test_book_state_dict_loads_by_name_and_gives_the_books_numbers(self):
        torch.manual_seed(123)
        book = reference.MultiHeadAttention(d_in=32, d_out=32, context_length=40, dropout=0.0,
                                            num_heads=4)
        ours = attention_ops.MultiHeadAttention(d_in=32, d_out=32, context_length=40,
                                                dropout=0.0, num_heads=4)
        ours.load_state_dict(book.state_dict())  # strict: the same names and buffers
        x = torch.randn(3, 40, 32, requires_grad=True)
        expected = book(x)
        got = ours(x)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        (expected_grad,) = torch.autograd.grad(expected.square().sum(), x)
        (got_grad,) = torch.autograd.grad(got.square().sum(), x)
        torch.testing.assert_close(got_grad, expected_grad, rtol=1e-4, atol=1e-5)

    def test_grouped_query_heads(self):
        torch.manual_seed(5)
        book = reference.MultiHeadAttention(32, 32, 16, 0.0, 4, num_kv_heads=2)
        ours = attention_ops.MultiHeadAttention(32, 32, 16, 0.0, 4, num_kv_heads=2)
        ours.load_state_dict(book.state_dict())
        x = torch.randn(2, 16, 32)
        torch.testing.assert_close(ours(x), book(x), rtol=1e-5, atol=1e-5)

    def test_bad_sizes(self):
        with self.assertRaisesRegex(ValueError, "divisible by num_heads"):
            attention_ops.MultiHeadAttention(30, 30, 8, 0.0, 4)
        with self.assertRaisesRegex(ValueError, "multiple of num_kv_heads"):
            attention_ops.MultiHeadAttention(32, 32, 8, 0.0, 4, num_kv_heads=3)


class Scripted(torch.nn.Module):
    def forward(self, q, k, v):
        return attention_ops.scaled_dot_product_attention(q, k, v, is_causal=True, window_left=3)


class TorchScript(unittest.TestCase):
    def test_scripted_module_saves_loads_and_matches(self):
        scripted = torch.jit.script(Scripted())
        buffer = io.BytesIO()
        torch.jit.save(scripted, buffer)
        buffer.seek(0)
        loaded = torch.jit.load(buffer)
        self.assertIn("attention::scaled_dot_product_attention", str(loaded.inlined_graph))
        q, k, v = inputs()
        torch.testing.assert_close(loaded(q, k, v),
                                   formula(q, k, v, is_causal=True, window_left=3))

    def test_scripted_book_module(self):
        model = attention_ops.MultiHeadAttention(16, 16, 8, 0.0, 2).eval()
        scripted = torch.jit.script(model)
        x = torch.randn(2, 8, 16)
        torch.testing.assert_close(scripted(x), model(x))


class BadArguments(unittest.TestCase):
    def check(self, error, text, call):
        with self.assertRaises(error) as caught:
            call()
        self.assertIn(text, str(caught.exception))

    def test_messages_name_the_operator(self):
        q, k, v = inputs()
        name = "attention::scaled_dot_product_attention: "
        self.check(ValueError, name + "expected causal_alignment 'bottom_right' or 'top_left', "
                   "got 'bottom'", lambda: OPS.scaled_dot_product_attention(
                       q, k, v, causal_alignment="bottom"))
        self.check(ValueError, name + "expected backend 'auto', 'math', 'chunked' or 'native', "
                   "got 'flash'", lambda: OPS.scaled_dot_product_attention(q, k, v,
                                                                            backend="flash"))
        self.check(ValueError, name, lambda: OPS.scaled_dot_product_attention(q, k[..., :3], v))
        self.check(TypeError, name, lambda: OPS.scaled_dot_product_attention(q, k.float(), v))
        self.check(TypeError, name, lambda: OPS.scaled_dot_product_attention(
            q.half(), k.half(), v.half()))
        for window in (-1, -INT64_MAX - 1):
            self.check(ValueError, name, lambda: OPS.scaled_dot_product_attention(
                q, k, v, window_left=window))
        for block in (0, -1):
            self.check(ValueError, name, lambda: OPS.scaled_dot_product_attention(
                q, k, v, block_size=block))
        self.check(ValueError, name, lambda: OPS.scaled_dot_product_attention(
            q, k, v, scale=math.nan))
        self.check(ValueError, name, lambda: OPS.scaled_dot_product_attention(
            q, k, v, softcap=0.0))
        self.check(ValueError, name, lambda: OPS.scaled_dot_product_attention(
            q, k, v, dropout_p=1.0))
        self.check(ValueError, name, lambda: OPS.scaled_dot_product_attention(
            q, k, v, sinks=torch.zeros(3, dtype=torch.float64)))
        self.check(ValueError, "attention::varlen_attention: ", lambda: OPS.varlen_attention(
            q[0, 0], k[0, 0], v[0, 0], torch.tensor([0, 7]), torch.tensor([0, 8])))

    def test_tensors_on_different_devices_are_refused(self):
        # A meta tensor beside CPU ones sends the call to the Meta kernel (the dispatcher takes
        # the highest device): it must refuse, never return a CPU tensor of undefined values.
        q, k, v = inputs()
        name = "attention::scaled_dot_product_attention: "
        meta = lambda t: t.detach().to("meta")  # noqa: E731
        mask = torch.zeros(q.shape[-2], k.shape[-2], dtype=q.dtype)
        for args, moved in (((q, meta(k), v), "key"), ((q, k, meta(v)), "value"),
                            ((meta(q), k, v), "key")):
            self.check(RuntimeError, name + "expected " + moved + " on the queries' device",
                       lambda: OPS.scaled_dot_product_attention(*args))
        self.check(RuntimeError, name + "expected attn_mask on the queries' device (cpu), got meta",
                   lambda: OPS.scaled_dot_product_attention(q, k, v, meta(mask)))
        self.check(RuntimeError, name + "expected sinks on the queries' device (cpu), got meta",
                   lambda: OPS.scaled_dot_product_attention(
                       q, k, v, sinks=meta(torch.zeros(q.shape[1], dtype=q.dtype))))
        self.check(RuntimeError, name + "expected alibi_slopes on the queries' device (cpu) or "
                   "the CPU, got meta", lambda: OPS.scaled_dot_product_attention(
                       q, k, v, alibi_slopes=meta(torch.ones(q.shape[1]))))
        leaf = q.clone().requires_grad_()
        self.check(RuntimeError, name + "expected key on the queries' device (cpu), got meta",
                   lambda: OPS.scaled_dot_product_attention(leaf, meta(k), v, is_causal=True))
        packed_q, packed_k = q[0].transpose(0, 1), k[0].transpose(0, 1)
        offsets_q = torch.tensor([0, packed_q.shape[0]])
        offsets_k = torch.tensor([0, packed_k.shape[0]])
        self.check(RuntimeError, "attention::varlen_attention: expected key on the queries' "
                   "device (cpu), got meta", lambda: OPS.varlen_attention(
                       packed_q, meta(packed_k), packed_k, offsets_q, offsets_k))
        self.check(RuntimeError, "attention::varlen_attention: expected cu_seqlens_k on the "
                   "queries' device (cpu) or the CPU, got meta", lambda: OPS.varlen_attention(
                       packed_q, packed_k, packed_k, offsets_q, meta(offsets_k)))
        # Meta tensors alone are what torch.compile's fake tensors are: shapes come back.
        out = OPS.scaled_dot_product_attention(meta(q), meta(k), meta(v))
        self.assertEqual((out.device.type, tuple(out.shape)), ("meta", tuple(q.shape)))

    def test_extremes_accepted(self):
        q, k, v = inputs()
        for block in (1, 2, 2**31, INT64_MAX):
            got = OPS.scaled_dot_product_attention(q, k, v, None, True, block_size=block)
            torch.testing.assert_close(got, formula(q, k, v, is_causal=True))
        got = OPS.scaled_dot_product_attention(q, k, v, None, True, window_left=0)
        torch.testing.assert_close(got, formula(q, k, v, is_causal=True, window_left=0))

    def test_private_operators_check_their_inputs(self):
        q, k, v = inputs(dtype=torch.float32)
        name = "attention::scaled_dot_product_attention: "
        self.check(TypeError, name + "expected Float, Double or BFloat16 on the CPU", lambda:
                   OPS._fused_attention_forward(q.half(), k.half(), v.half(), None, None, None,
                                                False))
        self.check(RuntimeError, name + "the fused CPU kernels take", lambda:
                   OPS._fused_attention_forward(q[:, :, :0], k, v, None, None, None, False))
        offsets = torch.tensor([0, 7])
        for cu_q, cu_k, caller, given in (
                (offsets, None, "attention::varlen_attention: ", "cu_seqlens_q alone"),
                (None, offsets, name, "cu_seqlens_k alone")):
            self.check(ValueError, caller + "expected both cu_seqlens_q and cu_seqlens_k or "
                       "neither, got " + given, lambda: OPS._fused_attention_forward(
                           q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1),
                           cu_q, cu_k, None, False))
        out, lse = OPS._fused_attention_forward(q, k, v, None, None, None, True)
        self.check(ValueError, name + "expected a log-sum-exp of shape", lambda:
                   OPS._fused_attention_backward(out, q, k, v, out, lse[..., :3], None, None,
                                                 None, True))
        self.check(TypeError, name + "expected the output of dtype", lambda:
                   OPS._fused_attention_backward(out, q, k, v, out, lse.double(), None, None,
                                                 None, True))


@unittest.skipUnless(TORCH2, "torch.compile and torch.export arrive in PyTorch 2")
class Compiled(unittest.TestCase):
    def test_compile_without_graph_breaks_outputs_and_gradients_equal_eager(self):
        import torch._dynamo
        torch._dynamo.reset()

        def attend(q, k, v, sinks):
            return attention_ops.scaled_dot_product_attention(
                q, k, v, is_causal=True, window_left=5, sinks=sinks).sin()

        compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
        q, k, v = inputs((1, 4, 33, 16), (1, 2, 33, 16), dtype=torch.float32, grad=True)
        sinks = torch.zeros(4, requires_grad=True)
        eager = attend(q, k, v, sinks)
        grads_eager = torch.autograd.grad(eager.sum(), (q, k, v, sinks))
        got = compiled(q, k, v, sinks)
        grads_got = torch.autograd.grad(got.sum(), (q, k, v, sinks))
        torch.testing.assert_close(got, eager, rtol=0, atol=0)
        for a, b in zip(grads_got, grads_eager):
            torch.testing.assert_close(a, b, rtol=0, atol=0)

    def test_export_holds_the_operator(self):
        model = attention_ops.MultiHeadAttention(32, 32, 16, 0.0, 4).eval()
        exported = torch.export.export(model, (torch.randn(2, 16, 32),))
        self.assertIn("attention.scaled_dot_product_attention", str(exported.graph))
        x = torch.randn(2, 16, 32)
        torch.testing.assert_close(exported.module()(x), model(x))

    @unittest.skipUnless(has_aot_inductor_packages(), "AOTInductor packages: 2.6 on")
    def test_aot_inductor_package_runs_the_operator(self):
        import tempfile
        torch.manual_seed(0)
        model = attention_ops.MultiHeadAttention(64, 64, 128, 0.0, 4).eval()
        x = torch.randn(2, 128, 64)
        exported = torch.export.export(model, (x,))
        with tempfile.TemporaryDirectory() as folder:
            path = torch._inductor.aoti_compile_and_package(
                exported, package_path=os.path.join(folder, "model.pt2"))
            # The package's C++ loader (AOTIModelPackageLoader) runs the operator through its
            # proxy executor, by the operator's schema.
            runner = torch._inductor.aoti_load_package(path)
            torch.testing.assert_close(runner(x), model(x), rtol=1e-5, atol=1e-6)

    @unittest.skipUnless(hasattr(torch.library, "opcheck"), "torch.library.opcheck: 2.4 on")
    def test_opcheck(self):
        q, k, v = inputs((1, 4, 9, 8), (1, 2, 9, 8), dtype=torch.float32, grad=True)
        cu = torch.tensor([0, 4, 9])
        cases = [
            (OPS.scaled_dot_product_attention.default, (q, k, v, None, True), {}),
            (OPS.scaled_dot_product_attention.default, (q, k, v),
             {"sinks": torch.zeros(4, requires_grad=True), "window_left": 2}),
            (OPS.scaled_dot_product_attention.default, (q, k, v), {"backend": "math"}),
            (OPS.varlen_attention.default,
             (q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), cu, cu, True),
             {}),
            (OPS.apply_rotary.default, (q, torch.arange(9)), {}),
        ]
        for op, args, kwargs in cases:
            with self.subTest(op=str(op), kwargs=sorted(kwargs)):
                torch.library.opcheck(op, args, kwargs)


if __name__ == "__main__":
    unittest.main()
