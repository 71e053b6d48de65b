// Packed variable-length attention (functional::varlen_attention): every sequence's rows equal
// scaled_dot_product_attention of that sequence alone, on every backend, forward and backward,
// with every option; empty sequences; dtypes; strided inputs; the path each backend takes. Python
// holds the reference to the book's attention (models/golden, cases "varlen_*").

#include <attention/functional.h>

#include "chunked_kernels.h"
#include "helpers.h"
#include "kernels/chunked.h"
#include "kernels/problem.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <vector>

namespace {

namespace F = attention::functional;
using F::Backend;
using Options = F::ScaledDotProductAttentionOptions;
using torch::Tensor;

Tensor offsets_of(const std::vector<int64_t>& lengths, torch::Dtype dtype = torch::kLong) {
  std::vector<int64_t> offsets{0};
  for (const int64_t n : lengths) offsets.push_back(offsets.back() + n);
  return torch::tensor(offsets, torch::kLong).to(dtype);
}

int64_t total(const std::vector<int64_t>& lengths) {
  return std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
}

// Output and gradients of a packed call: query, key, value, and the sinks when there are any.
struct PackedResult {
  Tensor out, q, k, v, sinks;
};

Tensor grad_or_zeros(const Tensor& t) {
  return t.grad().defined() ? t.grad() : torch::zeros_like(t);
}

// Each sequence alone through scaled_dot_product_attention on Math in float64, joined in the
// packed layout: what every backend of varlen_attention must give.
PackedResult alone(const Tensor& q, const Tensor& k, const Tensor& v,
                   const std::vector<int64_t>& lq, const std::vector<int64_t>& lk, Options options,
                   const Tensor& upstream, torch::ScalarType dtype = torch::kDouble) {
  auto q1 = q.detach().to(dtype).requires_grad_();
  auto k1 = k.detach().to(dtype).requires_grad_();
  auto v1 = v.detach().to(dtype).requires_grad_();
  Tensor sinks;
  if (options.sinks().defined()) {
    sinks = options.sinks().detach().to(dtype).requires_grad_();
    options.sinks(sinks);
  }
  std::vector<Tensor> parts;
  int64_t qb = 0, kb = 0;
  for (size_t s = 0; s < lq.size(); ++s) {
    const auto qs = q1.narrow(0, qb, lq[s]).transpose(0, 1);
    const auto ks = k1.narrow(0, kb, lk[s]).transpose(0, 1);
    const auto vs = v1.narrow(0, kb, lk[s]).transpose(0, 1);
    parts.push_back(
        F::scaled_dot_product_attention(qs, ks, vs, Options(options).backend(Backend::Math))
            .output.transpose(0, 1));
    qb += lq[s];
    kb += lk[s];
  }
  auto out =
      parts.empty() ? torch::zeros({0, q.size(1), v.size(2)}, q1.options()) : torch::cat(parts, 0);
  if (out.requires_grad()) out.backward(upstream.to(dtype));
  return {out.detach(), grad_or_zeros(q1), grad_or_zeros(k1), grad_or_zeros(v1),
          sinks.defined() ? grad_or_zeros(sinks) : Tensor()};
}

PackedResult packed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_q,
                    const Tensor& cu_k, Options options, const Tensor& upstream) {
  auto q1 = q.detach().clone().requires_grad_(), k1 = k.detach().clone().requires_grad_(),
       v1 = v.detach().clone().requires_grad_();
  Tensor sinks;
  if (options.sinks().defined()) {
    sinks = options.sinks().detach().clone().requires_grad_();
    options.sinks(sinks);
  }
  auto out = F::varlen_attention(q1, k1, v1, cu_q, cu_k, options);
  if (out.requires_grad()) out.backward(upstream);
  return {out.detach(), grad_or_zeros(q1), grad_or_zeros(k1), grad_or_zeros(v1),
          sinks.defined() ? grad_or_zeros(sinks) : Tensor()};
}

double worst(const PackedResult& a, const PackedResult& b) {
  double w = std::max({test::max_abs_diff(a.out, b.out), test::max_abs_diff(a.q, b.q),
                       test::max_abs_diff(a.k, b.k), test::max_abs_diff(a.v, b.v)});
  if (a.sinks.defined() || b.sinks.defined()) {
    w = std::max(w, test::max_abs_diff(a.sinks, b.sinks));
  }
  return w;
}

std::string describe_packed(const std::vector<int64_t>& lq, const std::vector<int64_t>& lk,
                            const Options& o) {
  std::ostringstream text;
  text << "queries";
  for (const auto n : lq) text << " " << n;
  text << ", keys";
  for (const auto n : lk) text << " " << n;
  text << ", causal " << o.is_causal() << ", top-left "
       << (o.causal_alignment() == F::CausalAlignment::TopLeft) << ", window "
       << o.window_left().value_or(-1) << "/" << o.window_right().value_or(-1) << ", softcap "
       << o.softcap().value_or(0) << ", alibi " << o.alibi_slopes().defined() << ", sinks "
       << o.sinks().defined() << ", block " << o.block_size();
  return text.str();
}

}  // namespace

TEST_CASE("varlen: every backend gives each sequence's attention alone, forward and backward",
          "[varlen]") {
  std::mt19937 rng(41);
  torch::manual_seed(41);
  auto pick = [&](std::vector<int64_t> values) { return values[rng() % values.size()]; };
  const auto opts = torch::TensorOptions().dtype(torch::kDouble);
  const int before = at::get_num_threads();
  for (int trial = 0; trial < 40; ++trial) {
    at::set_num_threads(trial % 2 + 1);
    const int64_t sequences = pick({1, 2, 3, 5});
    std::vector<int64_t> lq, lk;
    const bool self = trial % 3 != 2;  // else cross-attention lengths: Tq_s != Tk_s
    for (int64_t s = 0; s < sequences; ++s) {
      lq.push_back(pick({0, 1, 5, 17, 40, 100}));
      lk.push_back(self ? lq.back() : pick({0, 1, 9, 33, 64, 130}));
    }
    const int64_t kv = pick({1, 2}), heads = kv * pick({1, 3});
    const int64_t d = pick({4, 8}), dv = pick({3, 8});
    // Strided queries: the (total, H, d) view of a wider projection.
    auto q = torch::randn({total(lq), heads, d + 2}, opts).narrow(2, 1, d);
    auto k = torch::randn({total(lk), kv, d}, opts) * 2;
    auto v = torch::randn({total(lk), kv, dv}, opts);
    Options options;
    options.block_size(pick({7, 16, 64, 256})).is_causal(trial % 2 == 0);
    if (trial % 4 >= 2) options.causal_alignment(F::CausalAlignment::TopLeft);
    if (trial % 3 != 0) options.window_left(pick({0, 3, 20}));
    if (trial % 5 == 1) options.window_right(pick({0, 5}));
    if (trial % 3 == 1) options.softcap(pick({2, 30}));
    if (trial % 7 < 3) options.alibi_slopes(F::alibi_slopes(heads));
    if (trial % 4 == 1) options.sinks(torch::randn({heads}, opts));
    if (trial % 6 == 5) options.scale(0.3);
    INFO("trial " << trial << ": " << describe_packed(lq, lk, options));
    const auto upstream = torch::randn({total(lq), heads, dv}, opts);
    const auto truth = alone(q, k, v, lq, lk, options, upstream);
    const auto offsets_dtype = trial % 2 ? torch::kInt : torch::kLong;
    const auto cu_q = offsets_of(lq, offsets_dtype), cu_k = offsets_of(lk, offsets_dtype);
    for (const auto backend : {Backend::Math, Backend::Chunked, Backend::Auto, Backend::Native}) {
      INFO("backend " << static_cast<int>(backend));
      if (backend == Backend::Native &&
          (options.softcap() || options.alibi_slopes().defined() || options.sinks().defined())) {
        continue;  // refused by name (test_bad_input)
      }
      const auto got = packed(q, k, v, cu_q, cu_k, Options(options).backend(backend), upstream);
      CHECK(got.out.sizes() == truth.out.sizes());
      CHECK(worst(got, truth) < 1e-10);
    }
  }
  at::set_num_threads(before);
}

TEST_CASE("varlen: float32 and bfloat16 hold to float64's sequences alone", "[varlen]") {
  torch::manual_seed(7);
  const std::vector<int64_t> lq = {37, 0, 300, 1, 90}, lk = lq;
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const double tol = dtype == torch::kFloat ? 2e-5 : 3e-2;
    auto q = torch::randn({total(lq), 4, 16}).to(dtype),
         k = torch::randn({total(lk), 2, 16}).to(dtype),
         v = torch::randn({total(lk), 2, 8}).to(dtype);
    const auto upstream = torch::randn({total(lq), 4, 8}).to(dtype);
    const auto options = Options().is_causal(true).window_left(50).block_size(64);
    const auto truth = alone(q, k, v, lq, lk, options, upstream);
    // Math is LibTorch's arithmetic, whose bfloat16 matmul sums in bfloat16 on processors without
    // AVX-512's (LibTorch 1.13 on AVX2: ~10% off float64 at 300 terms). Packed, it is held to the
    // same arithmetic on each sequence alone; Chunked, which sums in float, to float64.
    const auto math_truth =
        dtype == torch::kBFloat16
            ? alone(q, k, v, lq, lk, Options(options).backend(Backend::Math), upstream, dtype)
            : truth;
    for (const auto backend : {Backend::Math, Backend::Chunked}) {
      INFO(dtype << " backend " << static_cast<int>(backend));
      const auto got = packed(q, k, v, offsets_of(lq), offsets_of(lk),
                              Options(options).backend(backend), upstream);
      CHECK(got.out.scalar_type() == dtype);
      const auto& expected = backend == Backend::Math ? math_truth : truth;
      const auto close = [&](const Tensor& a, const Tensor& reference) {
        const auto a64 = a.to(torch::kDouble), b = reference.to(torch::kDouble);
        return ((a64 - b).abs() - tol * b.abs()).max().item<double>() < tol;
      };
      CHECK(close(got.out, expected.out));
      CHECK(close(got.q, expected.q));
      CHECK(close(got.k, expected.k));
      CHECK(close(got.v, expected.v));
    }
  }
}

TEST_CASE("varlen: empty batches and sequences without queries or keys", "[varlen]") {
  const auto opts = torch::TensorOptions().dtype(torch::kDouble);
  for (const auto backend : {Backend::Math, Backend::Chunked, Backend::Auto}) {
    INFO("backend " << static_cast<int>(backend));
    const auto options = Options().is_causal(true).backend(backend);
    // No sequence at all: offsets {0}.
    auto none =
        F::varlen_attention(torch::zeros({0, 2, 4}, opts), torch::zeros({0, 1, 4}, opts),
                            torch::zeros({0, 1, 3}, opts), offsets_of({}), offsets_of({}), options);
    CHECK(none.sizes() == torch::IntArrayRef({0, 2, 3}));
    // Queries without keys see nothing: zeros, and zero gradients; keys without queries get
    // zero gradients.
    const std::vector<int64_t> lq = {3, 0, 2}, lk = {0, 4, 5};
    auto q = torch::randn({5, 2, 4}, opts).requires_grad_();
    auto k = torch::randn({9, 1, 4}, opts).requires_grad_();
    auto v = torch::randn({9, 1, 3}, opts).requires_grad_();
    auto out = F::varlen_attention(q, k, v, offsets_of(lq), offsets_of(lk),
                                   Options(options).is_causal(false));
    CHECK(torch::equal(out.narrow(0, 0, 3), torch::zeros({3, 2, 3}, opts)));
    CHECK(torch::isfinite(out).all().item<bool>());
    out.sum().backward();
    CHECK(torch::equal(q.grad().narrow(0, 0, 3), torch::zeros({3, 2, 4}, opts)));
    CHECK(torch::equal(k.grad().narrow(0, 0, 4), torch::zeros({4, 1, 4}, opts)));
    CHECK(torch::equal(v.grad().narrow(0, 0, 4), torch::zeros({4, 1, 3}, opts)));
    CHECK(v.grad().narrow(0, 4, 5).abs().sum().item<double>() > 0);
    // Every sequence's queries empty.
    auto q0 = torch::zeros({0, 2, 4}, opts);
    CHECK(F::varlen_attention(q0, k, v, offsets_of({0, 0, 0}), offsets_of(lk), options).sizes() ==
          torch::IntArrayRef({0, 2, 3}));
  }
}

TEST_CASE("varlen: the path each backend takes", "[varlen]") {
  const std::vector<int64_t> lengths = {100, 300, 7};
  auto q = torch::randn({407, 8, 16}), k = torch::randn({407, 8, 16}), v = torch::randn_like(k);
  const auto cu = offsets_of(lengths);
  const auto call = [&](Backend backend) {
    F::varlen_attention(q, k, v, cu, cu, Options().is_causal(true).backend(backend));
    return F::last_path();
  };
  CHECK(call(Backend::Math) == F::Path::Math);
  CHECK(call(Backend::Chunked) == F::Path::ChunkedFused);
  CHECK(call(Backend::Native) == F::Path::Native);
  // In inference Auto takes the fused CPU kernels at any size. In training it counts the scores of
  // the sequences, 8 x (100^2 + 300^2 + 7^2) < 2^20, not those of one sequence of 407 tokens,
  // 8 x 407^2 > 2^20: Math.
  CHECK(call(Backend::Auto) == F::Path::ChunkedFused);
  {
    const auto leaf = q.clone().requires_grad_();
    F::varlen_attention(leaf, k, v, cu, cu, Options().is_causal(true));
    CHECK(F::last_path() == F::Path::Math);
  }
  {
    torch::NoGradGuard no_grad;
    const auto tiny = torch::randn({3, 2, 4});
    F::varlen_attention(tiny, tiny, tiny, offsets_of({1, 2}), offsets_of({1, 2}));
    CHECK(F::last_path() == F::Path::ChunkedFused);
  }
  auto long_q = torch::randn({1100, 4, 16});
  F::varlen_attention(long_q, long_q, long_q, offsets_of({100, 1000}), offsets_of({100, 1000}));
  CHECK(F::last_path() == F::Path::ChunkedFused);
}

TEST_CASE("varlen: offsets of dtype int32 and int64 and an unsorted batch give one result",
          "[varlen]") {
  torch::manual_seed(3);
  const std::vector<int64_t> lengths = {5, 0, 12, 3};
  auto q = torch::randn({20, 2, 8}), k = torch::randn({20, 2, 8}), v = torch::randn({20, 2, 8});
  const auto options = Options().is_causal(true).backend(Backend::Chunked);
  const auto a = F::varlen_attention(q, k, v, offsets_of(lengths, torch::kInt),
                                     offsets_of(lengths, torch::kInt), options);
  const auto b = F::varlen_attention(q, k, v, offsets_of(lengths), offsets_of(lengths), options);
  CHECK(torch::equal(a, b));
  // A stride-2 view of the offsets is read as its values.
  const auto strided = torch::stack({offsets_of(lengths), offsets_of(lengths)}, 1).select(1, 0);
  CHECK(torch::equal(a, F::varlen_attention(q, k, v, strided, strided, options)));
}

TEST_CASE("varlen: windows and block sizes at their extremes", "[varlen]") {
  torch::manual_seed(5);
  const std::vector<int64_t> lq = {40, 1, 0, 70}, lk = {40, 9, 3, 70};
  const auto opts = torch::TensorOptions().dtype(torch::kDouble);
  const auto q = torch::randn({total(lq), 2, 8}, opts), k = torch::randn({total(lk), 1, 8}, opts),
             v = torch::randn({total(lk), 1, 4}, opts),
             upstream = torch::randn({total(lq), 2, 4}, opts);
  const auto cu_q = offsets_of(lq), cu_k = offsets_of(lk);
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (const auto backend : {Backend::Math, Backend::Chunked}) {
    INFO("backend " << static_cast<int>(backend));
    const auto base = Options().is_causal(true).backend(backend);
    const auto plain = F::varlen_attention(q, k, v, cu_q, cu_k, base);
    // A window wider than every sequence hides nothing: the same problem as none.
    for (const int64_t w : {int64_t{1} << 31, int64_t{1} << 53, kMax - 1, kMax}) {
      INFO("window " << w);
      CHECK(torch::equal(plain, F::varlen_attention(q, k, v, cu_q, cu_k,
                                                    Options(base).window_left(w).window_right(w))));
    }
    for (const int64_t block : {int64_t{1}, int64_t{2}, int64_t{1} << 31, int64_t{1} << 53, kMax}) {
      INFO("block_size " << block);
      CHECK(test::max_abs_diff(
                plain, F::varlen_attention(q, k, v, cu_q, cu_k, Options(base).block_size(block))) <
            1e-12);
    }
    // The narrowest windows, on either side, forward and backward against each sequence alone.
    for (const int64_t w : {int64_t{0}, int64_t{1}}) {
      INFO("window " << w);
      const auto narrow = Options(base).is_causal(false).window_left(w).window_right(w);
      CHECK(worst(packed(q, k, v, cu_q, cu_k, narrow, upstream),
                  alone(q, k, v, lq, lk, narrow, upstream)) < 1e-10);
    }
  }
}
