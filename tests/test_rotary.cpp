// Rotary position embeddings: the properties that define them (a query-key product depends on
// the distance only; a rotation keeps lengths; its gradient is the inverse rotation), the two
// layouts and partial rotary against each other, and the module's decoding through a KV cache.
// Their numbers against Python are the golden cases "rope_*" (models/golden).

#include <attention/multi_head_attention.h>
#include <attention/rotary.h>
#include <attention/sliding_kv_cache.h>

#include "helpers.h"

#include <torch/torch.h>

namespace F = attention::functional;
using F::RotaryLayout;
using F::RotaryOptions;

TEST_CASE("rotary: a query-key product depends only on the distance", "[rotary]") {
  torch::manual_seed(81);
  const auto opts = torch::TensorOptions().dtype(torch::kDouble);
  const auto q = torch::randn({1, 16}, opts).expand({40, 16}).contiguous();
  const auto k = torch::randn({1, 16}, opts).expand({40, 16}).contiguous();
  const auto positions = torch::arange(40);
  for (auto layout : {RotaryLayout::HalfSplit, RotaryLayout::Interleaved}) {
    for (int64_t dim : {16, 6}) {
      const auto options = RotaryOptions().layout(layout).rotary_dim(dim).llama3_scaling(
          F::Llama3RopeScaling().original_context_length(32));
      const auto rq = F::apply_rotary(q, positions, options);
      const auto rk = F::apply_rotary(k, positions, options);
      INFO("interleaved " << (layout == RotaryLayout::Interleaved) << ", rotary_dim " << dim);
      const double near = (rq[7] * rk[3]).sum().item<double>();
      CHECK(std::abs((rq[30] * rk[26]).sum().item<double>() - near) < 1e-12);
      CHECK(std::abs((rq[4] * rk[0]).sum().item<double>() - near) < 1e-12);
      // Lengths are kept, and the features past rotary_dim pass unchanged.
      CHECK(test::max_abs_diff(rq.norm(2, -1), q.norm(2, -1)) < 1e-12);
      if (dim < 16) CHECK(torch::equal(rq.narrow(-1, dim, 16 - dim), q.narrow(-1, dim, 16 - dim)));
      // Position 0 is the identity.
      CHECK(test::max_abs_diff(rq[0], q[0]) < 1e-15);
    }
  }
}

TEST_CASE("rotary: the two layouts are one rotation of permuted features", "[rotary]") {
  // Interleaved pairs (2i, 2i + 1) are half-split pairs (i, i + d/2) after moving feature 2i to
  // i and 2i + 1 to i + d/2.
  torch::manual_seed(83);
  const auto x = torch::randn({2, 3, 10, 8});
  const auto positions = torch::arange(5, 15);
  const auto perm = torch::tensor({0, 2, 4, 6, 1, 3, 5, 7});
  const auto half = F::apply_rotary(x.index_select(-1, perm), positions);
  const auto interleaved =
      F::apply_rotary(x, positions, RotaryOptions().layout(RotaryLayout::Interleaved));
  CHECK(test::max_abs_diff(interleaved.index_select(-1, perm), half) < 1e-6);
}

TEST_CASE("rotary: the gradient is the inverse rotation", "[rotary]") {
  torch::manual_seed(85);
  const auto opts = torch::TensorOptions().dtype(torch::kDouble);
  auto x = torch::randn({2, 12, 8}, opts).requires_grad_();
  const auto upstream = torch::randn({2, 12, 8}, opts);
  const auto positions = torch::arange(3, 15);
  const auto options = RotaryOptions().theta(500.0).rotary_dim(6);
  F::apply_rotary(x, positions, options).backward(upstream);
  CHECK(test::max_abs_diff(x.grad(), F::apply_rotary(upstream, -positions, options)) < 1e-12);
}

TEST_CASE("rotary: bfloat16 is computed in float and rounded once", "[rotary]") {
  torch::manual_seed(87);
  const auto x = torch::randn({4, 2048, 64}).to(torch::kBFloat16);
  const auto positions = torch::arange(2048);
  const auto out = F::apply_rotary(x, positions);
  CHECK(out.scalar_type() == torch::kBFloat16);
  const auto truth = F::apply_rotary(x.to(torch::kDouble), positions);
  // One rounding to bfloat16's 8-bit significand: relative error at most 2^-8 (the float
  // arithmetic before it adds about 1e-7).
  const auto excess = (out.to(torch::kDouble) - truth).abs() - truth.abs() * std::ldexp(1.0, -8);
  CHECK(excess.max().item<double>() <= 1e-6);
}

TEST_CASE("rotary: the module decoding through a KV cache equals one forward", "[rotary]") {
  torch::manual_seed(89);
  auto options = attention::MultiHeadAttentionOptions(16, 32, 4)
                     .num_kv_heads(2)
                     .rope(RotaryOptions().theta(10000.0).rotary_dim(6))
                     .sliding_window(5);
  attention::MultiHeadAttention mha(options);
  const auto x = torch::randn({2, 23, 16});
  torch::NoGradGuard no_grad;
  const auto whole = mha(x).output;
  attention::KVCache cache(23);
  std::vector<torch::Tensor> steps;
  int64_t start = 0;
  for (int64_t n : {1, 1, 6, 9, 1, 5}) {
    steps.push_back(
        mha(x.narrow(1, start, n), attention::MultiHeadAttentionForwardOptions().kv_cache(&cache))
            .output);
    start += n;
  }
  CHECK(test::max_abs_diff(torch::cat(steps, 1), whole) < 1e-5);
  // The tables grow with the positions asked for; a clone computes the same.
  auto copy = std::dynamic_pointer_cast<attention::MultiHeadAttentionImpl>(mha->clone());
  CHECK(test::max_abs_diff(copy->forward(x).output, whole) == 0.0);
  std::ostringstream printed;
  printed << *mha;
  const std::string expected =
      "attention::MultiHeadAttention(d_in=16, d_out=32, num_heads=4, num_kv_heads=2, "
      "context_length=0, dropout=0, qkv_bias=false, out_bias=true, causal=true, d_in_kv=16, "
      "sliding_window=5, rope(theta=10000, rotary_dim=6, layout=HalfSplit))(\n";
  CHECK(printed.str().substr(0, expected.size()) == expected);
}

TEST_CASE("rotary: positions beyond the kept tables rotate as those within", "[rotary]") {
  // The module keeps cos and sin for 64 Ki positions and computes rows beyond per call: a
  // sequence crossing that bound, in one forward and in chunks through a sliding cache, agrees.
  torch::manual_seed(95);
  const int64_t t = 65600;
  attention::MultiHeadAttention mha(
      attention::MultiHeadAttentionOptions(4, 8, 2).sliding_window(4).rope(
          RotaryOptions().theta(10000.0)));
  const auto x = torch::randn({1, t, 4});
  torch::NoGradGuard no_grad;
  const auto whole = mha(x).output;
  attention::SlidingKVCache cache(4);
  std::vector<torch::Tensor> parts;
  int64_t start = 0;
  for (int64_t n : {65530, 3, 4, 63}) {
    parts.push_back(mha(x.narrow(1, start, n),
                        attention::MultiHeadAttentionForwardOptions().sliding_kv_cache(&cache))
                        .output);
    start += n;
  }
  CHECK(test::max_abs_diff(torch::cat(parts, 1), whole) < 1e-5);
}
