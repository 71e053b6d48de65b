#include <attention/multi_head_attention.h>

#include "golden/harness.h"
#include "helpers.h"
#include "module_checks.h"

#include <torch/torch.h>

using attention::MultiHeadAttention;
using attention::MultiHeadAttentionForwardOptions;
using attention::MultiHeadAttentionOptions;

namespace {

torch::Tensor run(MultiHeadAttention& m, const torch::Tensor& x,
                  const MultiHeadAttentionForwardOptions& o = {}) {
  return m(x, o).output;
}

}  // namespace

TEST_CASE("MultiHeadAttention: submodules, names and shapes as in the book", "[mha]") {
  MultiHeadAttention mha(MultiHeadAttentionOptions(12, 16, 4).num_kv_heads(2).qkv_bias(true));
  auto params = mha->named_parameters();
  CHECK(params.size() == 8);
  CHECK(params["W_query.weight"].sizes() == torch::IntArrayRef({16, 12}));
  CHECK(params["W_key.weight"].sizes() == torch::IntArrayRef({8, 12}));
  CHECK(params["W_value.bias"].sizes() == torch::IntArrayRef({8}));
  CHECK(params["out_proj.weight"].sizes() == torch::IntArrayRef({16, 16}));
  CHECK(mha->named_buffers().size() == 0);
  MultiHeadAttention plain(8, 8, 2);
  CHECK_FALSE(plain->named_parameters().contains("W_query.bias"));
  CHECK(plain->named_parameters().contains("out_proj.bias"));
}

TEST_CASE("MultiHeadAttention: the book's weight file, mask buffer included, loads strictly",
          "[mha][weights]") {
  MultiHeadAttention mha(8, 8, 2);
  const auto report =
      attention::load_weights(*mha, golden::directory() + "/mha_causal_float32.state_dict.pt");
  CHECK(report.derived == std::vector<std::string>{"mask"});
  CHECK(report.loaded.size() == 5);
}

TEST_CASE("MultiHeadAttention: unbatched input equals a batch of one", "[mha]") {
  MultiHeadAttention mha(MultiHeadAttentionOptions(6, 8, 4).num_kv_heads(2));
  auto x = torch::randn({5, 6});
  auto out = mha(x, MultiHeadAttentionForwardOptions().need_weights(true));
  auto batched = mha(x.unsqueeze(0), MultiHeadAttentionForwardOptions().need_weights(true));
  CHECK(test::max_abs_diff(out.output, batched.output[0]) < 1e-6);
  CHECK(test::max_abs_diff(out.weights, batched.weights[0]) < 1e-6);
  check_batched_equals_stacked([&](const torch::Tensor& t) { return run(mha, t); }, 6);
}

TEST_CASE("MultiHeadAttention: inference without autograd equals the recorded forward", "[mha]") {
  // Without autograd the projections go to buffers of their own (huge-page memory from 8 MiB on
  // Linux); the numbers must not change. Sizes large enough for those buffers, with qkv bias.
  MultiHeadAttention mha(MultiHeadAttentionOptions(512, 512, 8).qkv_bias(true));
  auto x = torch::randn({2, 1100, 512});
  auto recorded = run(mha, x);
  REQUIRE(recorded.requires_grad());
  torch::Tensor inference;
  {
    torch::NoGradGuard no_grad;
    inference = run(mha, x);
  }
  CHECK_FALSE(inference.requires_grad());
  CHECK(test::max_abs_diff(inference, recorded.detach()) < 1e-6);
  // A context of a different length and a non-contiguous input take the same path.
  auto context = torch::randn({2, 1300, 512}).transpose(0, 1).contiguous().transpose(0, 1);
  CHECK(test::max_abs_diff(
            run(mha, x, MultiHeadAttentionForwardOptions().context(context)).detach(), [&] {
              torch::NoGradGuard no_grad;
              return run(mha, x, MultiHeadAttentionForwardOptions().context(context));
            }()) < 1e-6);
}

TEST_CASE("MultiHeadAttention: causal row t ignores later tokens, not causal it does not",
          "[mha]") {
  MultiHeadAttention causal(8, 8, 2);
  auto x = torch::randn({2, 6, 8});
  auto changed = x.clone();
  changed.slice(1, 4) += 1.0;
  CHECK(test::max_abs_diff(run(causal, x).slice(1, 0, 4), run(causal, changed).slice(1, 0, 4)) ==
        0.0);
  MultiHeadAttention full(MultiHeadAttentionOptions(8, 8, 2).causal(false));
  CHECK(test::max_abs_diff(run(full, x).slice(1, 0, 4), run(full, changed).slice(1, 0, 4)) > 1e-4);
}

TEST_CASE("MultiHeadAttention: padded keys are ignored, as if the sequence were shorter", "[mha]") {
  MultiHeadAttention mha(MultiHeadAttentionOptions(8, 8, 2).causal(false));
  auto x = torch::randn({1, 7, 8});
  auto padding = torch::zeros({1, 7}, torch::kBool);
  padding.slice(1, 5).fill_(true);
  auto padded = run(mha, x, MultiHeadAttentionForwardOptions().key_padding_mask(padding));
  CHECK(test::max_abs_diff(padded.slice(1, 0, 5), run(mha, x.slice(1, 0, 5))) < 1e-6);
}

TEST_CASE("MultiHeadAttention: attention weights per head and averaged", "[mha]") {
  MultiHeadAttention mha(MultiHeadAttentionOptions(8, 12, 3).num_kv_heads(1));
  auto x = torch::randn({2, 5, 8});
  auto per_head =
      mha(x, MultiHeadAttentionForwardOptions().need_weights(true).average_attn_weights(false));
  auto averaged = mha(x, MultiHeadAttentionForwardOptions().need_weights(true));
  REQUIRE(per_head.weights.sizes() == torch::IntArrayRef({2, 3, 5, 5}));
  CHECK(test::max_abs_diff(averaged.weights, per_head.weights.mean(1)) < 1e-7);
  CHECK(test::max_abs_diff(per_head.weights.sum(-1), torch::ones({2, 3, 5})) < 1e-6);
  CHECK(per_head.weights.triu(1).abs().sum().item<double>() == 0.0);
  CHECK_FALSE(mha(x).weights.defined());
}

TEST_CASE("MultiHeadAttention: gradients reach every parameter, float64, dropout in training",
          "[mha]") {
  MultiHeadAttention mha(MultiHeadAttentionOptions(8, 8, 2).qkv_bias(true).dropout(0.5));
  mha->eval();
  check_gradients_reach_parameters(*mha, [&] { return run(mha, torch::randn({2, 5, 8})); });
  auto x = torch::randn({2, 5, 8});
  CHECK(torch::equal(run(mha, x), run(mha, x)));
  mha->train();
  CHECK(test::max_abs_diff(run(mha, x), run(mha, x)) > 1e-4);
  mha->eval();
  mha->to(torch::kDouble);
  CHECK(run(mha, x.to(torch::kDouble)).scalar_type() == torch::kDouble);
}

TEST_CASE("MultiHeadAttention: bfloat16 on CPU follows float32 within bfloat16's precision",
          "[mha][bfloat16]") {
  // bfloat16 keeps 8 significant bits (relative spacing 2^-8 = 0.0039). The weights, the input
  // and every intermediate are rounded; the softmax is accumulated in float32. Outputs here are
  // of order 1, so 8 roundings' worth, 0.03, bounds the difference.
  torch::manual_seed(5);
  MultiHeadAttention mha(MultiHeadAttentionOptions(16, 16, 4).num_kv_heads(2));
  auto x = torch::randn({2, 9, 16});
  auto reference = mha(x, MultiHeadAttentionForwardOptions().need_weights(true));
  auto low = mha->clone();
  low->to(torch::kBFloat16);
  auto out = std::dynamic_pointer_cast<attention::MultiHeadAttentionImpl>(low)->forward(
      x.to(torch::kBFloat16), MultiHeadAttentionForwardOptions().need_weights(true));
  REQUIRE(out.output.scalar_type() == torch::kBFloat16);
  CHECK(test::max_abs_diff(out.output, reference.output) < 0.03);
  CHECK(test::max_abs_diff(out.weights, reference.weights) < 0.03);
}

TEST_CASE("MultiHeadAttention: runs on CUDA when a GPU is present", "[mha][cuda]") {
  if (!torch::cuda::is_available()) {
    WARN("CUDA is not available: the CUDA test is skipped");
    return;
  }
  MultiHeadAttention mha(MultiHeadAttentionOptions(16, 16, 4).num_kv_heads(2));
  auto x = torch::randn({2, 9, 16});
  auto cpu = mha(x, MultiHeadAttentionForwardOptions().need_weights(true));
  mha->to(torch::kCUDA);
  attention::KVCache cache(16);
  auto gpu = mha(x.to(torch::kCUDA), MultiHeadAttentionForwardOptions().need_weights(true));
  CHECK(gpu.output.device().is_cuda());
  CHECK(test::max_abs_diff(gpu.output.cpu(), cpu.output) < 1e-4);
  CHECK(test::max_abs_diff(gpu.weights.cpu(), cpu.weights) < 1e-4);
  auto step =
      mha(x.slice(1, 0, 4).to(torch::kCUDA), MultiHeadAttentionForwardOptions().kv_cache(&cache));
  CHECK(test::max_abs_diff(step.output.cpu(), cpu.output.slice(1, 0, 4)) < 1e-4);
}

TEST_CASE("MultiHeadAttention: bad options and bad input", "[mha][errors]") {
  CHECK_THROWS_C10(
      MultiHeadAttention(8, 10, 3), c10::ValueError,
      "attention::MultiHeadAttention: expected num_heads to divide d_out, got d_out 10 "
      "and num_heads 3");
  CHECK_THROWS_C10(MultiHeadAttention(MultiHeadAttentionOptions(8, 12, 4).num_kv_heads(3)),
                   c10::ValueError, "expected num_kv_heads to divide num_heads");
  CHECK_THROWS_C10(MultiHeadAttention(MultiHeadAttentionOptions(8, 8, 2).dropout(-0.1)),
                   c10::ValueError, "expected dropout in [0, 1)");

  MultiHeadAttention mha(MultiHeadAttentionOptions(8, 8, 2).context_length(6));
  auto x = torch::randn({2, 5, 8});
  CHECK_THROWS_C10(run(mha, torch::randn({2, 7, 8})), c10::ValueError,
                   "expected at most context_length = 6 keys, got 7");
  CHECK_THROWS_C10(run(mha, torch::randn({2, 5, 7})), c10::ValueError,
                   "expected input (T, 8) or (B, T, 8), got (2, 5, 7)");
  CHECK_THROWS_C10(
      run(mha, x,
          MultiHeadAttentionForwardOptions().key_padding_mask(torch::zeros({2, 4}, torch::kBool))),
      c10::ValueError, "expected key_padding_mask (2, 5), got (2, 4)");
  CHECK_THROWS_C10(
      run(mha, x, MultiHeadAttentionForwardOptions().key_padding_mask(torch::zeros({2, 5}))),
      c10::TypeError, "expected key_padding_mask of dtype bool (true = padding), got Float");
  CHECK_THROWS_C10(
      run(mha, x, MultiHeadAttentionForwardOptions().attn_mask(torch::zeros({5, 4}, torch::kBool))),
      c10::ValueError, "expected attn_mask broadcastable to (2, 2, 5, 5), got (5, 4)");
  CHECK_THROWS_C10(run(mha, x, MultiHeadAttentionForwardOptions().context(torch::randn({3, 4, 8}))),
                   c10::ValueError, "expected x and context with the same batch size");
  CHECK_THROWS_C10(run(mha, x, MultiHeadAttentionForwardOptions().context(torch::randn({2, 4, 6}))),
                   c10::ValueError, "expected context (T, 8) or (B, T, 8), got (2, 4, 6)");
  CHECK_THROWS_C10(run(mha, x.to(torch::kDouble)), c10::TypeError, "got Double");
}
