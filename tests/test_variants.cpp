// The attention variants of today's LLMs (sliding windows, causal alignment, soft-capping, ALiBi)
// in both Chunked kernels, the fused CPU one and the device-generic tiles, forward and backward,
// against the Math backend in double; Math itself is held to Python by the golden cases
// (models/golden, cases "variant_*"). Also what each backend refuses, and Auto's choice.

#include <attention/functional.h>

#include "chunked_kernels.h"
#include "helpers.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <random>

namespace F = attention::functional;
using F::Backend;
using Options = F::ScaledDotProductAttentionOptions;

using test::chunked_grads;
using test::math_grads;
using test::worst;

TEST_CASE("variants: both chunked kernels equal math in double, forward and backward",
          "[variants]") {
  std::mt19937 rng(61);
  torch::manual_seed(61);
  auto pick = [&](std::vector<int64_t> values) { return values[rng() % values.size()]; };
  const auto opts = torch::TensorOptions().dtype(torch::kDouble);
  const int before = at::get_num_threads();
  for (int trial = 0; trial < 48; ++trial) {
    at::set_num_threads(trial % 2 + 1);
    const int64_t kv = pick({1, 2}), group = pick({1, 3}), heads = kv * group;
    const int64_t t_q = pick({1, 17, 64, 100}), t_k = pick({1, 23, 64, 130});
    const int64_t d = pick({4, 8}), dv = pick({3, 8}), block = pick({7, 16, 32});
    auto q = torch::randn({2, t_q, heads, d}, opts).transpose(1, 2);  // strided heads
    auto k = torch::randn({2, kv, t_k, d}, opts) * 2;
    auto v = torch::randn({2, kv, t_k, dv}, opts);
    Options options;
    options.block_size(block).is_causal(trial % 2 == 0);
    if (trial % 4 >= 2) options.causal_alignment(F::CausalAlignment::TopLeft);
    if (trial % 3 != 0) options.window_left(pick({0, 3, 20}));
    if (trial % 5 == 1) options.window_right(pick({0, 5}));
    if (trial % 3 == 1) options.softcap(pick({2, 30}));
    if (trial % 7 < 3) options.alibi_slopes(F::alibi_slopes(heads));
    if (trial % 6 == 5) options.attn_mask(torch::rand({2, 1, 1, t_k}) < 0.2);
    INFO("trial " << trial << ": q " << q.sizes() << ", k " << k.sizes() << ", block " << block
                  << ", causal " << options.is_causal() << ", window "
                  << options.window_left().value_or(-1) << "/"
                  << options.window_right().value_or(-1) << ", softcap "
                  << options.softcap().value_or(0) << ", alibi "
                  << options.alibi_slopes().defined());
    const auto upstream = torch::randn({2, heads, t_q, dv}, opts);
    const auto truth = math_grads(q, k, v, options, upstream);
    CHECK(worst(chunked_grads(q, k, v, options, upstream, true), truth) < 1e-10);
    CHECK(worst(chunked_grads(q, k, v, options, upstream, false), truth) < 1e-10);
    // And through the public entry point, with autograd.
    auto q1 = q.detach().clone().requires_grad_();
    auto out = F::scaled_dot_product_attention(q1, k, v, Options(options).backend(Backend::Chunked))
                   .output;
    out.backward(upstream);
    CHECK(test::max_abs_diff(out, truth.out) < 1e-10);
    CHECK(test::max_abs_diff(q1.grad(), truth.q) < 1e-10);
  }
  at::set_num_threads(before);
}

TEST_CASE("variants: the window hides exactly the keys outside it, in each alignment",
          "[variants]") {
  // Math's weights show what each query sees: with Tq = 3 and Tk = 6, bottom-right puts query i
  // at position i + 3, top-left at i.
  auto q = torch::zeros({1, 3, 2}, torch::kDouble), k = torch::zeros({1, 6, 2}, torch::kDouble);
  const auto weights = [&](Options o) {
    return F::scaled_dot_product_attention(q, k, k, o.need_weights(true)).weights[0];
  };
  auto seen = [](const torch::Tensor& w) { return (w > 0).to(torch::kInt); };
  const auto bottom = seen(weights(Options().is_causal(true).window_left(1)));
  CHECK(torch::equal(
      bottom,
      torch::tensor({{0, 0, 1, 1, 0, 0}, {0, 0, 0, 1, 1, 0}, {0, 0, 0, 0, 1, 1}}, torch::kInt)));
  const auto top = seen(weights(
      Options().is_causal(true).window_left(1).causal_alignment(F::CausalAlignment::TopLeft)));
  CHECK(torch::equal(
      top,
      torch::tensor({{1, 0, 0, 0, 0, 0}, {1, 1, 0, 0, 0, 0}, {0, 1, 1, 0, 0, 0}}, torch::kInt)));
  const auto both = seen(weights(Options().window_left(0).window_right(1)));
  CHECK(torch::equal(
      both,
      torch::tensor({{0, 0, 0, 1, 1, 0}, {0, 0, 0, 0, 1, 1}, {0, 0, 0, 0, 0, 1}}, torch::kInt)));
}

TEST_CASE("variants: top-left alignment equals LibTorch's is_causal with Tq != Tk", "[variants]") {
  torch::manual_seed(67);
  auto q = torch::randn({2, 3, 5, 8}), k = torch::randn({2, 3, 9, 8}),
       v = torch::randn({2, 3, 9, 4});
  const auto options = Options().is_causal(true).causal_alignment(F::CausalAlignment::TopLeft);
  const auto native =
      F::scaled_dot_product_attention(q, k, v, Options(options).backend(Backend::Native));
  CHECK(F::last_path() == F::Path::Native);
  for (Backend backend : {Backend::Math, Backend::Chunked}) {
    CHECK(test::max_abs_diff(
              F::scaled_dot_product_attention(q, k, v, Options(options).backend(backend)).output,
              native.output) < 1e-5);
  }
}

TEST_CASE("variants: a window costs O(T * w): the chunked kernels skip the tiles outside it",
          "[variants]") {
  // Keys far outside every query's window hold NaN: a kernel that read their tiles would turn
  // the outputs (or the gradients) NaN, since NaN * 0 is NaN in the products.
  const int64_t t = 1024, w = 100;
  torch::manual_seed(71);
  auto q = torch::randn({1, 1, t, 8}), k = torch::randn({1, 1, t, 8}),
       v = torch::randn({1, 1, t, 8});
  const auto options = Options().is_causal(true).window_left(w).block_size(64);
  auto k_poisoned = k.clone(), v_poisoned = v.clone();
  // Queries 896.. see keys from 796 on; blocks of 64 start at 768 at the earliest.
  k_poisoned.narrow(2, 0, 700).fill_(NAN);
  v_poisoned.narrow(2, 0, 700).fill_(NAN);
  auto q_tail = q.narrow(2, 896, 128);
  const auto upstream = torch::randn({1, 1, 128, 8});
  for (bool fused : {true, false}) {
    INFO((fused ? "fused" : "tiles"));
    auto r = chunked_grads(q_tail, k_poisoned, v_poisoned, options, upstream, fused);
    CHECK(torch::isfinite(r.out).all().item<bool>());
    CHECK(torch::isfinite(r.q).all().item<bool>());
    CHECK(torch::isfinite(r.k.narrow(2, 700, t - 700)).all().item<bool>());
    CHECK(r.k.narrow(2, 0, 700).abs().max().item<float>() == 0.0f);
  }
}

TEST_CASE("variants: bfloat16 on the fused kernels is as accurate as float32 rounded",
          "[variants]") {
  torch::manual_seed(73);
  auto q = torch::randn({1, 4, 300, 16}), k = torch::randn({1, 2, 300, 16}),
       v = torch::randn({1, 2, 300, 16});
  const auto options =
      Options().is_causal(true).window_left(64).softcap(20.0).alibi_slopes(F::alibi_slopes(4));
  const auto bf = [](const torch::Tensor& t) { return t.to(torch::kBFloat16); };
  const auto truth = F::scaled_dot_product_attention(
      bf(q).to(torch::kDouble), bf(k).to(torch::kDouble), bf(v).to(torch::kDouble),
      Options(options).backend(Backend::Math));
  const auto out = F::scaled_dot_product_attention(bf(q), bf(k), bf(v),
                                                   Options(options).backend(Backend::Chunked));
  CHECK(F::last_path() == F::Path::ChunkedFused);
  CHECK(test::max_abs_diff(out.output.to(torch::kDouble), truth.output) < 2e-2);
}

TEST_CASE("variants: Auto never gives them to Native, and Native refuses what it cannot do",
          "[variants]") {
  auto q = torch::randn({1, 2, 8, 4}), k = torch::randn({1, 2, 8, 4});
  for (const auto& options : {Options().softcap(5.0), Options().alibi_slopes(F::alibi_slopes(2)),
                              Options().sinks(torch::zeros({2}))}) {
    CHECK_THROWS_WITH(
        F::scaled_dot_product_attention(q, k, k, Options(options).backend(Backend::Native)),
        test::contains("the Native backend computes neither soft-capping, ALiBi nor attention "
                       "sinks; use Backend::Math, Chunked or Auto"));
  }
  // A window is a mask LibTorch can take: Native computes it, as Math does.
  const auto window = Options().is_causal(true).window_left(2);
  CHECK(
      test::max_abs_diff(
          F::scaled_dot_product_attention(q, k, k, Options(window).backend(Backend::Native)).output,
          F::scaled_dot_product_attention(q, k, k, Options(window).backend(Backend::Math)).output) <
      1e-5);
  auto big_q = torch::randn({1, 4, 1024, 8});
  F::scaled_dot_product_attention(big_q, big_q, big_q, Options().softcap(5.0).is_causal(true));
  CHECK(F::last_path() == F::Path::ChunkedFused);
}

TEST_CASE("variants: attention sinks in Chunked equal Math's, with their gradient", "[variants]") {
  // Through the public entry point (the sinks are applied around the kernels, through the
  // log-sum-exp): outputs and the gradients of q, k, v and the sinks, in double; some queries see
  // no key at all (all their keys masked), where the sink takes everything and the output is 0.
  std::mt19937 rng(79);
  torch::manual_seed(79);
  auto pick = [&](std::vector<int64_t> values) { return values[rng() % values.size()]; };
  const auto opts = torch::TensorOptions().dtype(torch::kDouble);
  for (int trial = 0; trial < 16; ++trial) {
    const int64_t kv = pick({1, 2}), heads = kv * pick({1, 2}), t_q = pick({1, 30, 70});
    const int64_t t_k = pick({1, 40, 90});
    auto q = torch::randn({2, heads, t_q, 8}, opts), k = torch::randn({2, kv, t_k, 8}, opts),
         v = torch::randn({2, kv, t_k, 4}, opts), sinks = torch::randn({heads}, opts) * 2;
    Options options;
    options.block_size(pick({16, 32})).is_causal(trial % 2 == 0);
    if (trial % 3 == 0) options.window_left(10).softcap(3.0);
    if (trial % 4 == 1) options.attn_mask(torch::rand({2, 1, t_q, t_k}) < 0.5);
    const auto upstream = torch::randn({2, heads, t_q, 4}, opts);
    std::vector<std::vector<torch::Tensor>> results;
    for (Backend backend : {Backend::Math, Backend::Chunked}) {
      std::vector<torch::Tensor> leaves;
      for (const auto& t : {q, k, v, sinks}) leaves.push_back(t.clone().requires_grad_());
      auto out = F::scaled_dot_product_attention(leaves[0], leaves[1], leaves[2],
                                                 Options(options).sinks(leaves[3]).backend(backend))
                     .output;
      out.backward(upstream);
      results.push_back(
          {out.detach(), leaves[0].grad(), leaves[1].grad(), leaves[2].grad(), leaves[3].grad()});
    }
    INFO("trial " << trial << ": q " << q.sizes() << ", k " << k.sizes());
    for (size_t i = 0; i < results[0].size(); ++i) {
      INFO("tensor " << i);
      CHECK(test::max_abs_diff(results[1][i], results[0][i]) < 1e-10);
    }
    CHECK(F::last_path() == F::Path::ChunkedFused);
  }
  // The sink shrinks every output: a single key with a sink of the same logit gives half of it.
  auto one = torch::ones({1, 1, 1, 1}, opts);
  for (Backend backend : {Backend::Math, Backend::Chunked}) {
    auto out = F::scaled_dot_product_attention(
                   one * 0, one, one * 4, Options().sinks(torch::zeros({1}, opts)).backend(backend))
                   .output;
    CHECK(out.item<double>() == 2.0);
  }
}
