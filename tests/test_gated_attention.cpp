// Gated attention: MultiHeadAttention with gate(true). Python's numbers for the book's
// GatedMultiHeadAttention are the golden cases gated_* (test_golden.cpp); here the gate's meaning
// on the module's own terms, and the serving path that the goldens do not take.

#include <attention/multi_head_attention.h>

#include "helpers.h"

#include <torch/torch.h>

#include <sstream>

namespace {

using attention::MultiHeadAttention;
using attention::MultiHeadAttentionOptions;
using test::max_abs_diff;

}  // namespace

TEST_CASE("gated attention: the heads' outputs times sigmoid(W_gate x), before out_proj",
          "[gated]") {
  torch::manual_seed(1);
  torch::NoGradGuard no_grad;
  MultiHeadAttention gated(MultiHeadAttentionOptions(8, 12, 3).gate(true));
  MultiHeadAttention plain(MultiHeadAttentionOptions(8, 12, 3));
  for (const char* name : {"W_query", "W_key", "W_value", "out_proj"}) {
    for (const auto& p : plain->named_children()[name]->named_parameters()) {
      p.value().copy_(gated->named_children()[name]->named_parameters()[p.key()]);
    }
  }
  CHECK(gated->named_parameters().contains("W_gate.weight"));
  CHECK_FALSE(gated->named_parameters().contains("W_gate.bias"));  // qkv_bias(false)
  CHECK_FALSE(plain->named_parameters().contains("W_gate.weight"));
  // A gate of zeros halves every feature: out_proj(c / 2) = (out_proj(c) - b) / 2 + b.
  gated->W_gate->weight.zero_();
  const auto x = torch::randn({2, 7, 8});
  const auto& bias = plain->out_proj->bias;
  CHECK(max_abs_diff(gated(x).output - bias, (plain(x).output - bias) * 0.5) < 1e-6);
  std::ostringstream printed;
  gated->pretty_print(printed);
  CHECK_THAT(printed.str(), test::contains(", gate=true"));
}

TEST_CASE("gated attention: serving steps and a KVCache give the forward's output", "[gated]") {
  torch::manual_seed(2);
  torch::NoGradGuard no_grad;
  MultiHeadAttention mha(
      MultiHeadAttentionOptions(16, 16, 4).num_kv_heads(2).gate(true).qkv_bias(true));
  const auto x = torch::randn({1, 9, 16});
  const auto whole = mha(x).output[0];
  attention::KVCache cache(9);
  const auto prompt =
      mha(x.narrow(1, 0, 8), attention::MultiHeadAttentionForwardOptions().kv_cache(&cache))
          .output[0];
  const auto last =
      mha(x.narrow(1, 8, 1), attention::MultiHeadAttentionForwardOptions().kv_cache(&cache))
          .output[0];
  CHECK(max_abs_diff(torch::cat({prompt, last}), whole) < 1e-5);
  attention::PagedKVCache pages(attention::PagedKVCacheOptions(4, 4, 2, 4));
  const int64_t s = pages.add_sequence();
  const auto first = mha->forward_paged(x[0].narrow(0, 0, 8), pages, pages.extend({s}, {8}));
  const auto next = mha->forward_paged(x[0].narrow(0, 8, 1), pages, pages.extend({s}, {1}));
  CHECK(max_abs_diff(torch::cat({first, next}), whole) < 1e-5);
}
