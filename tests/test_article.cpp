// The article's printed numbers, computed through the library's modules.

#include <attention/attention.h>

#include "demo/article.h"
#include "helpers.h"

#include <torch/torch.h>

namespace {

torch::Tensor embedded_sentence() {
  torch::manual_seed(123);
  torch::nn::Embedding embed(50000, 3);
  return embed(torch::tensor(article::kSentenceInt)).detach();
}

void require_article(const torch::Tensor& computed, const torch::Tensor& printed) {
  REQUIRE(computed.sizes() == printed.sizes());
  CHECK(article::count_matching(computed, printed) == printed.numel());
}

}  // namespace

TEST_CASE("article: the embedding of the sentence under seed 123", "[article]") {
  require_article(embedded_sentence(), article::embedded_sentence());
}

TEST_CASE("article: SelfAttention(3, 2, 4) output", "[article]") {
  auto x = embedded_sentence();
  torch::manual_seed(123);
  attention::SelfAttention sa(3, 2, 4);
  require_article(sa(x), article::self_attention_output());
}

TEST_CASE("article: row 2 of SelfAttention is context_vector_2", "[article]") {
  auto x = embedded_sentence();
  torch::manual_seed(123);
  attention::SelfAttention sa(3, 2, 4);
  require_article(sa(x)[1], article::context_vector_2());
}

TEST_CASE("article: attention scores and weights through the functional layer", "[article]") {
  auto x = embedded_sentence();
  torch::manual_seed(123);
  attention::SelfAttention sa(3, 2, 4);
  auto q = x.matmul(sa->W_query), k = x.matmul(sa->W_key), v = x.matmul(sa->W_value);
  require_article(q.matmul(k.t()), article::attn_scores());
  require_article(q[1].dot(k[4]), article::omega_24());
  auto plain = attention::functional::scaled_dot_product_attention(
      q, k, v, attention::functional::ScaledDotProductAttentionOptions().need_weights(true));
  require_article(plain.weights, article::attn_weights());
  require_article(plain.weights[1], article::attention_weights_2());
  auto causal = attention::functional::scaled_dot_product_attention(
      q, k, v,
      attention::functional::ScaledDotProductAttentionOptions().need_weights(true).is_causal(true));
  require_article(causal.weights, article::causal_weights());
}

TEST_CASE("article: both masking approaches give the same weights", "[article]") {
  auto x = embedded_sentence();
  torch::manual_seed(123);
  attention::SelfAttention sa(3, 2, 4);
  auto q = x.matmul(sa->W_query), k = x.matmul(sa->W_key), v = x.matmul(sa->W_value);
  auto weights =
      attention::functional::scaled_dot_product_attention(
          q, k, v, attention::functional::ScaledDotProductAttentionOptions().need_weights(true))
          .weights;
  auto masked_simple = weights * torch::ones({6, 6}).tril();
  require_article(masked_simple, article::masked_simple());
  auto renormalized = masked_simple / masked_simple.sum(1, true);
  auto causal =
      attention::functional::scaled_dot_product_attention(
          q, k, v,
          attention::functional::ScaledDotProductAttentionOptions().need_weights(true).is_causal(
              true))
          .weights;
  CHECK(test::max_abs_diff(renormalized, causal) < 1e-6);
}

TEST_CASE("article: CausalSelfAttention is the article's -inf masking followed by softmax",
          "[article]") {
  auto x = embedded_sentence();
  torch::manual_seed(123);
  attention::CausalSelfAttention causal(3, 2, 4);
  auto scores = x.matmul(causal->W_query).matmul(x.matmul(causal->W_key).t());
  auto mask = torch::triu(torch::ones({6, 6}), 1).to(torch::kBool);
  auto weights = torch::softmax(scores.masked_fill(mask, -INFINITY) / std::sqrt(2.0), 1);
  require_article(weights, article::causal_weights());
  CHECK(test::max_abs_diff(causal(x), weights.matmul(x.matmul(causal->W_value))) < 1e-6);
}

TEST_CASE("article: single head with d_out_v = 1 and the 4-head wrapper", "[article]") {
  auto x = embedded_sentence();
  torch::manual_seed(123);
  attention::SelfAttention single(3, 2, 1);
  require_article(single(x), article::single_head_output());
  torch::manual_seed(123);
  attention::MultiHeadAttentionWrapper mha(3, 2, 1, 4);
  require_article(mha(x), article::wrapper_output());
}

TEST_CASE("article: CrossAttention(3, 2, 4) with an 8-token second input", "[article]") {
  auto x = embedded_sentence();
  torch::manual_seed(123);
  attention::CrossAttention crossattn(3, 2, 4);
  auto second_input = torch::rand({8, 3});
  require_article(crossattn(x, second_input), article::cross_attention_output());
}
