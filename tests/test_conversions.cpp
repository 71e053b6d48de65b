#include <attention/conversions.h>

#include "helpers.h"

#include <torch/torch.h>

using attention::MultiHeadAttention;
using attention::MultiHeadAttentionForwardOptions;
using attention::MultiHeadAttentionOptions;

namespace {

// torch::nn::MultiheadAttention takes (T, B, E). Its C++ implementation adds attn_mask to the
// scores whatever its dtype (a bool mask would add 0 and 1), so masks are passed to it additive.
torch::Tensor torch_forward(torch::nn::MultiheadAttention& m, const torch::Tensor& x,
                            const torch::Tensor& attn_mask = {},
                            const torch::Tensor& key_padding_mask = {}) {
  auto xt = x.transpose(0, 1);
  return std::get<0>(m(xt, xt, xt, key_padding_mask, /*need_weights=*/false, attn_mask))
      .transpose(0, 1);
}

}  // namespace

TEST_CASE("conversions: the wrapper and its fused equivalent give the same outputs",
          "[conversions]") {
  attention::MultiHeadAttentionWrapper wrapper(6, 3, 3, 4);
  auto fused = attention::to_fused(*wrapper);
  auto x = torch::randn({2, 7, 6});
  CHECK(test::max_abs_diff(fused(x).output, wrapper(x)) < 1e-5);
  wrapper->to(torch::kDouble);
  auto fused64 = attention::to_fused(*wrapper);
  CHECK(test::max_abs_diff(fused64(x.to(torch::kDouble)).output, wrapper(x.to(torch::kDouble))) <
        1e-12);
  attention::MultiHeadAttentionWrapper uneven(6, 2, 3, 4);
  CHECK_THROWS_C10(
      attention::to_fused(*uneven), c10::ValueError,
      "expected a wrapper with d_out_kq == d_out_v (one head size), got d_out_kq 2 and "
      "d_out_v 3");
}

TEST_CASE("conversions: fused module to and from torch::nn::MultiheadAttention", "[conversions]") {
  MultiHeadAttention fused(MultiHeadAttentionOptions(8, 8, 2).qkv_bias(true));
  auto x = torch::randn({3, 5, 8});
  auto padding = torch::zeros({3, 5}, torch::kBool);
  padding[1].slice(0, 3).fill_(true);
  auto causal_mask = torch::ones({5, 5}, torch::kBool).triu(1);
  auto causal_additive = torch::zeros({5, 5}).masked_fill(causal_mask, -INFINITY);

  auto torch_mha = attention::to_torch(*fused);
  CHECK(test::max_abs_diff(
            torch_forward(torch_mha, x, causal_additive, padding),
            fused(x, MultiHeadAttentionForwardOptions().key_padding_mask(padding)).output) < 1e-5);

  auto back = attention::from_torch(*torch_mha);
  CHECK_FALSE(back->options.causal());
  CHECK(back->options.qkv_bias());
  CHECK(
      test::max_abs_diff(back(x, MultiHeadAttentionForwardOptions().attn_mask(causal_mask)).output,
                         fused(x).output) < 1e-5);

  torch::nn::MultiheadAttention plain(torch::nn::MultiheadAttentionOptions(8, 4));
  auto from_plain = attention::from_torch(*plain);
  CHECK(test::max_abs_diff(from_plain(x).output, torch_forward(plain, x)) < 1e-5);

  MultiHeadAttention gqa(MultiHeadAttentionOptions(8, 8, 2).num_kv_heads(1));
  CHECK_THROWS_C10(
      attention::to_torch(*gqa), c10::ValueError,
      "torch::nn::MultiheadAttention needs d_in == d_in_kv == d_out and num_kv_heads == "
      "num_heads");
}
