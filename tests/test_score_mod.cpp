// Score modifications: a ScoreMod that soft-caps against the softcap option and one that adds a
// bias by distance against relative_bias (other features of the library, computed their own way),
// on Math and on the fused CPU kernels, forward and backward; a modification that depends on the
// scores, the positions, the head and the batch, fused against Math under every option, at 1 and
// 2 threads (golden::score_mod_of's, which Python's goldens also compute); MultiHeadAttention
// decoding through a cache as in one forward; extremes (-inf and NaN from the function); bad input
// refused by name. Python's numbers are in the goldens (blockmask_score_mod_*).

#include <attention/block_mask.h>
#include <attention/functional.h>
#include <attention/kv_cache.h>
#include <attention/multi_head_attention.h>
#include <attention/score_mod.h>
#include <attention/sliding_kv_cache.h>

#include "golden/harness.h"
#include "helpers.h"

#include <torch/torch.h>

#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <tuple>
#include <vector>

namespace score_mod_test {

namespace F = attention::functional;
using attention::ScoreMod;
using attention::ScoreTile;
using Options = F::ScaledDotProductAttentionOptions;

// softcap * tanh(s / softcap), and its derivative.
ScoreMod soft_cap(double cap) {
  return ScoreMod(
      [cap](const torch::Tensor& s, const ScoreTile&) { return s.div(cap).tanh_().mul_(cap); },
      [cap](const torch::Tensor& s, const torch::Tensor& g, const ScoreTile&) {
        return g.mul_(1 - s.div(cap).tanh_().square_());
      });
}

using golden::relative_positions;

// table[clamp(j - pos(i), -m, m) + m, head] added to each score: relative_bias with
// RelativeBuckets::distance(m), written as a modification.
ScoreMod distance_bias(const torch::Tensor& table, int64_t m) {
  return ScoreMod(
      [=](const torch::Tensor& s, const ScoreTile& t) {
        const auto rows = (relative_positions(s, t).clamp(-m, m) + m).flatten();
        return s.add_(table.select(1, t.head).index_select(0, rows).view(s.sizes()));
      },
      [](const torch::Tensor&, const torch::Tensor& g, const ScoreTile&) { return g; });
}

// Nonlinear in the scores, varying with the relative position, the head and the batch (a shift
// would not: a query's weights ignore it): the goldens' modification (blockmask_score_mod_*).
ScoreMod wavy() {
  return golden::score_mod_of("wavy");
}

// Output and the gradients of query, key and value (and of the sinks when given).
std::vector<torch::Tensor> run(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const Options& options,
                               const torch::Tensor& upstream) {
  auto q1 = q.detach().clone().requires_grad_(), k1 = k.detach().clone().requires_grad_(),
       v1 = v.detach().clone().requires_grad_();
  Options own = options;
  torch::Tensor sinks;
  if (options.sinks().defined()) {
    sinks = options.sinks().detach().clone().requires_grad_();
    own.sinks(sinks);
  }
  auto out = F::scaled_dot_product_attention(q1, k1, v1, own).output;
  out.backward(upstream);
  std::vector<torch::Tensor> r{out.detach(), q1.grad(), k1.grad(), v1.grad()};
  if (sinks.defined()) r.push_back(sinks.grad());
  return r;
}

}  // namespace score_mod_test

using namespace score_mod_test;

TEST_CASE("score_mod: soft-capping as a modification equals the softcap option",
          "[score_mod][chunked]") {
  torch::manual_seed(3);
  const auto opts = torch::TensorOptions().dtype(torch::kDouble);
  const auto q = torch::randn({2, 4, 150, 16}, opts) * 3, k = torch::randn({2, 2, 170, 16}, opts),
             v = torch::randn({2, 2, 170, 8}, opts), up = torch::randn({2, 4, 150, 8}, opts);
  for (const auto backend : {F::Backend::Math, F::Backend::Chunked}) {
    const auto base = Options().backend(backend).is_causal(true).block_size(32);
    const auto expected = run(q, k, v, Options(base).softcap(2.5), up);
    const auto got = run(q, k, v, Options(base).score_mod(soft_cap(2.5)), up);
    CHECK(F::last_path() == (backend == F::Backend::Math ? F::Path::Math : F::Path::ChunkedFused));
    CHECK(test::max_abs_diff(got, expected) < 1e-12);
  }
}

TEST_CASE("score_mod: a bias by distance as a modification equals relative_bias",
          "[score_mod][chunked]") {
  torch::manual_seed(4);
  const int64_t m = 40;
  for (const auto alignment : {F::CausalAlignment::BottomRight, F::CausalAlignment::TopLeft}) {
    for (const auto backend : {F::Backend::Math, F::Backend::Chunked}) {
      INFO("backend " << static_cast<int>(backend) << ", alignment "
                      << static_cast<int>(alignment));
      const auto opts = torch::TensorOptions().dtype(torch::kDouble);
      const auto q = torch::randn({1, 3, 97, 16}, opts), k = torch::randn({1, 3, 211, 16}, opts),
                 up = torch::randn({1, 3, 97, 16}, opts);
      const auto table = torch::randn({2 * m + 1, 3}, opts);
      const auto base = Options().backend(backend).causal_alignment(alignment).block_size(64);
      const auto expected = run(
          q, k, k,
          Options(base).relative_bias(table).relative_buckets(F::RelativeBuckets::distance(m)), up);
      const auto got = run(q, k, k, Options(base).score_mod(distance_bias(table, m)), up);
      CHECK(test::max_abs_diff(got, expected) < 1e-12);
    }
  }
}

TEST_CASE("score_mod: the fused kernels equal Math with every option", "[score_mod][chunked]") {
  std::mt19937 rng(2026);
  torch::manual_seed(2026);
  auto pick = [&](std::vector<int64_t> values) { return values[rng() % values.size()]; };
  for (int threads : {1, 2}) {
    test::with_threads(threads, [&] {
      for (int trial = 0; trial < 27; ++trial) {
        const auto [batch, kv_heads, heads, t_q, t_k, d, dv] = test::random_sizes(rng);
        const auto dtype = trial % 4 == 3 ? torch::kFloat : torch::kDouble;
        const auto opts = torch::TensorOptions().dtype(dtype);
        auto q = torch::randn({batch, heads, t_q, d}, opts) * 2;
        auto k = torch::randn({batch, kv_heads, t_k, d}, opts);
        auto v = torch::randn({batch, kv_heads, t_k, dv}, opts);
        auto up = torch::randn({batch, heads, t_q, dv}, opts);
        Options options;
        options.block_size(pick({16, 32, 64})).score_mod(wavy());
        const int option = trial % 9;
        test::add_option(options, option, batch, heads, t_k, dtype, pick);
        if (option == 7) {
          options.block_mask(attention::BlockMask::from_function(
              [](int64_t, int64_t h, int64_t i, int64_t j) { return (i + j + h) % 5 != 0; }, 1,
              heads, t_q, t_k, pick({8, 32})));
        }
        if (option == 8) {
          options.relative_bias(torch::randn({21, heads}, opts))
              .relative_buckets(F::RelativeBuckets::distance(10));
        }
        if (trial % 3 == 0) options.causal_alignment(F::CausalAlignment::TopLeft);
        if (trial % 5 == 4) {  // one head, rank 2
          q = q[0][0], k = k[0][0], v = v[0][0], up = up[0][0];
          options.sinks({}).alibi_slopes({}).attn_mask({}).block_mask(c10::nullopt);
          if (option == 8) options.relative_bias(torch::randn({21, 1}, opts));
        }
        INFO("threads " << threads << ", trial " << trial << ": q " << q.sizes() << ", k "
                        << k.sizes() << ", option " << option);
        const auto expected = run(q, k, v, Options(options).backend(F::Backend::Math), up);
        const auto got = run(q, k, v, Options(options).backend(F::Backend::Chunked), up);
        CHECK(F::last_path() == F::Path::ChunkedFused);
        CHECK(test::max_abs_diff(got, expected) < (dtype == torch::kDouble ? 1e-10 : 1e-4));
        // Inference takes the forward without the log-sum-exp.
        torch::NoGradGuard no_grad;
        const auto inference =
            F::scaled_dot_product_attention(q, k, v, Options(options).backend(F::Backend::Chunked));
        CHECK(test::max_abs_diff(inference.output, expected[0]) <
              (dtype == torch::kDouble ? 1e-10 : 1e-4));
      }
    });
  }
}

TEST_CASE("score_mod: bfloat16 on the fused kernels at T = 1100 under a block mask",
          "[score_mod][block_mask]") {
  torch::manual_seed(6);
  const int64_t t = 1100;
  std::vector<int64_t> ids(t);
  for (int64_t i = 0; i < t; ++i) ids[i] = i < 600 ? 0 : 1;
  const auto mask =
      attention::BlockMask::document(torch::tensor(ids)) & attention::BlockMask::causal(t, t);
  const auto opts = torch::TensorOptions().dtype(torch::kBFloat16);
  const auto q = torch::randn({1, 4, t, 32}, opts), k = torch::randn({1, 2, t, 32}, opts),
             v = torch::randn({1, 2, t, 32}, opts), up = torch::randn({1, 4, t, 32}, opts);
  const auto wide = [](const torch::Tensor& x) { return x.to(torch::kDouble); };
  const auto truth = run(
      wide(q), wide(k), wide(v),
      Options().backend(F::Backend::Math).attn_mask(mask.to_attn_mask()[0][0]).score_mod(wavy()),
      wide(up));
  const auto got =
      run(q, k, v, Options().backend(F::Backend::Chunked).block_mask(mask).score_mod(wavy()), up);
  CHECK(F::last_path() == F::Path::ChunkedFused);
  CHECK(test::max_abs_diff(got[0].to(torch::kDouble), truth[0]) < 0.05);
  CHECK(test::max_abs_diff(got, truth) < 0.5);
}

TEST_CASE("score_mod: what the function returns at the extremes", "[score_mod]") {
  torch::manual_seed(8);
  const auto q = torch::randn({1, 2, 70, 8}, torch::kDouble), k = torch::randn_like(q),
             up = torch::randn_like(q);
  // Every score -inf: every query sees no key, and gets zeros (as a mask hiding everything).
  const ScoreMod hide_all(
      [](const torch::Tensor& s, const ScoreTile&) {
        return s.fill_(-std::numeric_limits<double>::infinity());
      },
      [](const torch::Tensor&, const torch::Tensor& g, const ScoreTile&) { return g.zero_(); });
  // Hides the keys after each query: causal attention, written as a modification.
  const ScoreMod causal(
      [](const torch::Tensor& s, const ScoreTile& t) {
        return s.masked_fill(relative_positions(s, t) > 0,
                             -std::numeric_limits<double>::infinity());
      },
      [](const torch::Tensor&, const torch::Tensor& g, const ScoreTile&) { return g; });
  // NaN from the function at every score: NaN out, as Math gives.
  const ScoreMod nan([](const torch::Tensor& s, const ScoreTile&) {
    return s.fill_(std::numeric_limits<double>::quiet_NaN());
  });
  const auto causal_truth = run(q, k, k, Options().backend(F::Backend::Math).is_causal(true), up);
  // No query, no key, no feature: nothing to ask the function about (it would throw).
  const ScoreMod never([](const torch::Tensor&, const ScoreTile&) -> torch::Tensor {
    throw std::runtime_error("called on an empty problem");
  });
  for (const auto& [t_q, t_k, d] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{0, 5, 8}, {5, 0, 8}, {0, 0, 8}}) {
    const auto q0 = torch::randn({1, 2, t_q, d}), k0 = torch::randn({1, 2, t_k, d});
    for (const auto backend : {F::Backend::Math, F::Backend::Chunked}) {
      torch::NoGradGuard no_grad;
      const auto out =
          F::scaled_dot_product_attention(q0, k0, k0, Options().backend(backend).score_mod(never))
              .output;
      CHECK(out.sizes() == torch::IntArrayRef({1, 2, t_q, d}));
      CHECK(torch::equal(out, torch::zeros_like(out)));
    }
  }
  for (const auto backend : {F::Backend::Math, F::Backend::Chunked}) {
    INFO("backend " << static_cast<int>(backend));
    const auto base = Options().backend(backend).block_size(32);
    for (const auto& g : run(q, k, k, Options(base).score_mod(hide_all), up)) {
      CHECK(torch::equal(g, torch::zeros_like(g)));
    }
    CHECK(test::max_abs_diff(run(q, k, k, Options(base).score_mod(causal), up), causal_truth) <
          1e-12);
    torch::NoGradGuard no_grad;
    CHECK(
        torch::isnan(F::scaled_dot_product_attention(q, k, k, Options(base).score_mod(nan)).output)
            .all()
            .item<bool>());
  }
}

TEST_CASE("score_mod: MultiHeadAttention decodes through a cache as in one forward",
          "[score_mod][multi_head_attention]") {
  torch::manual_seed(10);
  attention::MultiHeadAttention mha(
      attention::MultiHeadAttentionOptions(32, 32, 4).num_kv_heads(2).context_length(90));
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({2, 90, 32});
  const auto with_mod = attention::MultiHeadAttentionForwardOptions().score_mod(wavy());
  const auto whole = mha->forward(x, with_mod).output;
  CHECK(test::max_abs_diff(whole, mha->forward(x).output) > 1e-3);  // it changes something
  attention::KVCache cache(90);
  std::vector<torch::Tensor> steps;
  for (const auto& [start, n] :
       std::vector<std::pair<int64_t, int64_t>>{{0, 75}, {75, 1}, {76, 14}}) {
    steps.push_back(
        mha->forward(x.narrow(1, start, n),
                     attention::MultiHeadAttentionForwardOptions(with_mod).kv_cache(&cache))
            .output);
  }
  CHECK(test::max_abs_diff(torch::cat(steps, 1), whole) < 1e-5);
}

TEST_CASE("score_mod: bad input is refused by name", "[score_mod][bad_input]") {
  CHECK_THROWS_C10(ScoreMod(nullptr), c10::ValueError,
                   "attention::ScoreMod: expected a score function, got an empty std::function");
  torch::manual_seed(11);
  const auto q = torch::randn({2, 2, 40, 8}), k = torch::randn({2, 2, 50, 8});
  const auto sdpa = [&](const ScoreMod& mod, F::Backend backend) {
    return F::scaled_dot_product_attention(
        q, k, k, Options().score_mod(mod).backend(backend).block_size(16));
  };
  // The function throws, or returns something else than its tile: the tile is named.
  const ScoreMod throws([](const torch::Tensor& s, const ScoreTile& t) {
    // Math's one tile per matrix, and the kernels' tile of queries [0, 16), keys [16, 32).
    const bool at = t.query_begin == 0 && t.key_begin <= 16 && t.key_begin + s.size(1) > 16;
    if (t.head == 1 && at) throw std::runtime_error("no such head");
    return s;
  });
  CHECK_THROWS_C10(sdpa(throws, F::Backend::Chunked), c10::Error,
                   "attention::functional::scaled_dot_product_attention: the score_mod function "
                   "failed on the tile of batch ");
  CHECK_THROWS_C10(sdpa(throws, F::Backend::Chunked), c10::Error,
                   ", head 1, queries [0, 16) and keys [16, 32): no such head");
  CHECK_THROWS_C10(sdpa(throws, F::Backend::Math), c10::Error,
                   "the score_mod function failed on the tile of batch 0, head 1, queries [0, 40) "
                   "and keys [0, 50): no such head");
  const ScoreMod transposed([](const torch::Tensor& s, const ScoreTile&) { return s.t(); });
  CHECK_THROWS_C10(sdpa(transposed, F::Backend::Math), c10::Error,
                   "queries [0, 40) and keys [0, 50): expected a floating tensor of the tile's "
                   "shape (40, 50), got Float of shape (50, 40)");
  const ScoreMod undefined([](const torch::Tensor&, const ScoreTile&) { return torch::Tensor(); });
  CHECK_THROWS_C10(sdpa(undefined, F::Backend::Chunked), c10::Error,
                   "expected a floating tensor of the tile's shape (16, 16), got an undefined "
                   "tensor");
  const ScoreMod boolean([](const torch::Tensor& s, const ScoreTile&) { return s > 0; });
  CHECK_THROWS_C10(sdpa(boolean, F::Backend::Math), c10::Error, "got Bool of shape (40, 50)");
  // Whatever the function throws leaves as a c10::Error naming the tile, on every route and
  // thread: an int is no std::exception.
  const ScoreMod throws_int([](const torch::Tensor& s, const ScoreTile& t) {
    if (t.head == 1) throw 42;
    return s;
  });
  for (const auto backend : {F::Backend::Chunked, F::Backend::Math}) {
    CHECK_THROWS_C10(sdpa(throws_int, backend), c10::Error,
                     ": an exception of a type not derived from std::exception");
    test::with_threads(2, [&] {
      CHECK_THROWS_C10(sdpa(throws_int, backend), c10::Error,
                       "the score_mod function failed on the tile of batch ");
    });
  }
  // A derivative that throws, in backward: a std::exception, or anything else (an int).
  const auto identity = [](const torch::Tensor& s, const ScoreTile&) { return s; };
  const ScoreMod bad_derivative(
      identity, [](const torch::Tensor&, const torch::Tensor&, const ScoreTile&) -> torch::Tensor {
        throw std::runtime_error("not differentiable here");
      });
  const ScoreMod int_derivative(
      identity, [](const torch::Tensor&, const torch::Tensor&, const ScoreTile&) -> torch::Tensor {
        throw 42;
      });
  for (const auto& [mod, says] : {std::pair{bad_derivative, "not differentiable here"},
                                  {int_derivative, "not derived from std::exception"}}) {
    for (const auto backend : {F::Backend::Math, F::Backend::Chunked}) {
      const auto backward = [&, mod = mod, backend = backend] {
        auto leaf = q.clone().requires_grad_();
        F::scaled_dot_product_attention(leaf, k, k, Options().score_mod(mod).backend(backend))
            .output.sum()
            .backward();
      };
      CHECK_THROWS_C10(backward(), c10::Error,
                       "the score_mod derivative failed on the tile of batch ");
      CHECK_THROWS_C10(backward(), c10::Error, says);
    }
  }
  // Training without a derivative.
  const ScoreMod forward_only([](const torch::Tensor& s, const ScoreTile&) { return s; });
  const auto leaf = q.clone().requires_grad_();
  CHECK_THROWS_C10(
      F::scaled_dot_product_attention(leaf, k, k, Options().score_mod(forward_only)),
      c10::ValueError,
      "attention::functional::scaled_dot_product_attention: the score_mod has no derivative, and "
      "this call needs gradients (an input requires grad under grad mode): give the ScoreMod a "
      "derivative, or call under torch::NoGradGuard");
  {
    torch::NoGradGuard no_grad;  // inference needs none
    CHECK(F::scaled_dot_product_attention(leaf, k, k, Options().score_mod(forward_only))
              .output.defined());
  }
  CHECK_THROWS_C10(sdpa(forward_only, F::Backend::Native), c10::Error,
                   "attention::functional::scaled_dot_product_attention: the Native backend "
                   "cannot apply a score_mod; use Backend::Math, Chunked or Auto");
  // Packed calls: training needs the derivative there too.
  const auto packed = torch::randn({10, 2, 8}, torch::requires_grad());
  const auto offsets = torch::tensor({0, 4, 10}, torch::kLong);
  CHECK_THROWS_C10(F::varlen_attention(packed, packed, packed, offsets, offsets,
                                       Options().score_mod(forward_only)),
                   c10::ValueError,
                   "attention::functional::varlen_attention: the score_mod has no derivative");
  // The module: with a sliding cache, refused; a failing call leaves the cache as it was.
  attention::MultiHeadAttention mha(attention::MultiHeadAttentionOptions(8, 8, 2));
  torch::NoGradGuard no_grad;
  attention::SlidingKVCache sliding(16);
  CHECK_THROWS_C10(
      mha->forward(torch::randn({1, 3, 8}), attention::MultiHeadAttentionForwardOptions()
                                                .score_mod(forward_only)
                                                .sliding_kv_cache(&sliding)),
      c10::ValueError, "attention::MultiHeadAttention: takes no score_mod with a sliding_kv_cache");
  attention::KVCache cache(16);
  mha->forward(torch::randn({1, 3, 8}),
               attention::MultiHeadAttentionForwardOptions().kv_cache(&cache));
  const auto before = cache.keys().clone();
  CHECK_THROWS_C10(
      mha->forward(torch::randn({1, 2, 8}), attention::MultiHeadAttentionForwardOptions()
                                                .score_mod(transposed)
                                                .kv_cache(&cache)
                                                .backend(F::Backend::Math)),
      c10::Error, "expected a floating tensor of the tile's shape (2, 5)");
  CHECK(cache.length() == 3);
  CHECK(torch::equal(cache.keys(), before));
  // The tiles of other devices do not apply it.
  if (!torch::cuda::is_available()) {
    WARN("score_mod on CUDA: skipped, no CUDA device");
    return;
  }
  const auto cuda = q.to(torch::kCUDA);
  CHECK_THROWS_C10(
      F::scaled_dot_product_attention(
          cuda, cuda, cuda, Options().score_mod(forward_only).backend(F::Backend::Chunked)),
      c10::Error,
      "the Chunked backend applies a score_mod on the fused CPU kernels only (float, double or "
      "bfloat16 on the CPU); use Backend::Math (or Auto)");
  CHECK(F::scaled_dot_product_attention(cuda, cuda, cuda, Options().score_mod(forward_only))
            .output.is_cuda());
}

TEST_CASE("score_mod: apply() and apply_derivative() check their tile before the user's code",
          "[score_mod][bad_input]") {
  int calls = 0;
  const ScoreMod counted(
      [&calls](const torch::Tensor& s, const ScoreTile&) {
        ++calls;
        return s;
      },
      [&calls](const torch::Tensor&, const torch::Tensor& g, const ScoreTile&) {
        ++calls;
        return g;
      });
  const ScoreTile tile;
  constexpr const char* kCaller = "caller";
  CHECK_THROWS_C10(counted.apply(torch::randn({4}), tile, kCaller), c10::ValueError,
                   "caller: expected a score_mod's tile of scores (rows, cols) floating, got Float "
                   "(4,)");
  CHECK_THROWS_C10(counted.apply(torch::randn({}), tile, kCaller), c10::ValueError, "got Float ()");
  CHECK_THROWS_C10(counted.apply(torch::Tensor(), tile, kCaller), c10::ValueError,
                   "got an undefined tensor");
  CHECK_THROWS_C10(counted.apply(torch::ones({2, 2}, torch::kLong), tile, kCaller), c10::ValueError,
                   "got Long (2, 2)");
  CHECK_THROWS_C10(counted.apply(torch::randn({2, 2}), tile, nullptr), c10::ValueError,
                   "attention::ScoreMod: expected the caller's name to put in messages, got a null "
                   "pointer");
  CHECK_THROWS_C10(
      counted.apply_derivative(torch::randn({2, 3}), torch::randn({3, 2}), tile, kCaller),
      c10::ValueError,
      "caller: expected a score_mod's gradient of the scores' shape (2, 3) and dtype "
      "Float, got Float (3, 2)");
  CHECK_THROWS_C10(counted.apply_derivative(torch::randn({2, 3}),
                                            torch::randn({2, 3}, torch::kDouble), tile, kCaller),
                   c10::ValueError, "got Double (2, 3)");
  CHECK(calls == 0);
  counted.apply_derivative(torch::randn({2, 3}), torch::randn({2, 3}), tile, kCaller);
  CHECK(calls == 1);
}
