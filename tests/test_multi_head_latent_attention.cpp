// MultiHeadLatentAttention's two forms and its LatentCache. Python's numbers for the book's
// class and DeepSeek's parts are the golden cases mla_* (test_golden.cpp); here the absorbed form
// against the book's form on the same weights, with and without DeepSeek's parts, gradients
// through the cache, and what the cache keeps.

#include <attention/multi_head_attention.h>
#include <attention/multi_head_latent_attention.h>
#include <attention/rotary.h>

#include "helpers.h"

#include <torch/torch.h>

#include <limits>
#include <string>
#include <vector>

namespace {

using attention::LatentCache;
using attention::MultiHeadLatentAttention;
using attention::MultiHeadLatentAttentionOptions;
using test::max_abs_diff;

// The outputs of `x` fed through a fresh cache in chunks of `chunks` tokens, joined.
torch::Tensor decoded(MultiHeadLatentAttention& mla, const torch::Tensor& x,
                      const std::vector<int64_t>& chunks) {
  LatentCache cache(x.size(1));
  auto out =
      test::in_chunks(x, chunks, [&](const torch::Tensor& part) { return mla(part, &cache); });
  REQUIRE(cache.length() == x.size(1));
  return out;
}

// The book's module, and DeepSeek's parts: the rotary part alone, and with compressed queries
// and the latents' norms.
std::vector<MultiHeadLatentAttentionOptions> with_deepseek_parts(
    const MultiHeadLatentAttentionOptions& book) {
  auto rope = book;
  rope.rope_dim(4);
  auto all = rope;
  all.q_latent_dim(5).latent_norm(true).rope_theta(300.0);
  return {book, rope, all};
}

}  // namespace

TEST_CASE("MLA: the absorbed form over a cache equals the book's form, biases included", "[mla]") {
  torch::manual_seed(5);
  for (const bool bias : {false, true}) {
    INFO("qkv_bias " << bias);
    for (const auto& options : with_deepseek_parts(
             MultiHeadLatentAttentionOptions(12, 24, 3).latent_dim(7).qkv_bias(bias))) {
      INFO("rope_dim " << options.rope_dim() << ", q_latent_dim " << options.q_latent_dim());
      MultiHeadLatentAttention mla(options);
      mla->to(torch::kDouble);
      const auto x = torch::randn({2, 29, 12}, torch::kDouble);
      const auto book = mla(x);
      // One chunk (a prompt), token by token, and uneven chunks.
      CHECK(max_abs_diff(decoded(mla, x, {29}), book) < 1e-12);
      CHECK(max_abs_diff(decoded(mla, x, std::vector<int64_t>(29, 1)), book) < 1e-12);
      CHECK(max_abs_diff(decoded(mla, x, {1, 10, 2, 16}), book) < 1e-12);
    }
  }
}

TEST_CASE("MLA: the fused kernel decodes the latent as Math does", "[mla]") {
  torch::manual_seed(6);
  for (auto options :
       with_deepseek_parts(MultiHeadLatentAttentionOptions(32, 64, 8).latent_dim(16))) {
    INFO("rope_dim " << options.rope_dim() << ", q_latent_dim " << options.q_latent_dim());
    MultiHeadLatentAttention chunked(options.backend(attention::functional::Backend::Chunked));
    MultiHeadLatentAttention math(options.backend(attention::functional::Backend::Math));
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < chunked->parameters().size(); ++i) {
      math->parameters()[i].copy_(chunked->parameters()[i]);
    }
    const auto x = torch::randn({3, 300, 32});
    const auto want = math(x);
    CHECK(max_abs_diff(chunked(x), want) < 1e-5);
    CHECK(max_abs_diff(decoded(chunked, x, {200, 1, 1, 98}), want) < 1e-5);
    CHECK(attention::functional::last_path() == attention::functional::Path::ChunkedFused);
  }
}

TEST_CASE("MLA: gradients through a cache are the book's form's gradients", "[mla]") {
  torch::manual_seed(7);
  for (const auto& options :
       with_deepseek_parts(MultiHeadLatentAttentionOptions(6, 8, 2).latent_dim(4).qkv_bias(true))) {
    INFO("rope_dim " << options.rope_dim() << ", q_latent_dim " << options.q_latent_dim());
    MultiHeadLatentAttention mla(options);
    mla->to(torch::kDouble);
    const auto x = torch::randn({2, 9, 6}, torch::kDouble);
    const auto upstream = torch::randn({2, 9, 8}, torch::kDouble);
    const auto gradients = [&](bool through_cache) {
      mla->zero_grad();
      auto input = x.clone().requires_grad_();
      const auto out = through_cache ? decoded(mla, input, {9}) : mla(input);
      out.backward(upstream);
      std::vector<torch::Tensor> grads = {input.grad().clone()};
      for (const auto& p : mla->named_parameters()) {
        // W_UK's bias adds the same amount to every score of a query: its gradient is 0 in both
        // forms, rounding apart.
        if (p.key() != "W_UK.bias") grads.push_back(p.value().grad().clone());
      }
      return grads;
    };
    const auto book = gradients(false), absorbed = gradients(true);
    REQUIRE(book.size() == absorbed.size());
    for (size_t i = 0; i < book.size(); ++i) {
      INFO("gradient " << i);
      CHECK(max_abs_diff(absorbed[i], book[i]) < 1e-12);
    }
  }
}

TEST_CASE(
    "MLA: DeepSeek's parts: their parameters by name, the rotary key cached, positions "
    "going on from the cache",
    "[mla]") {
  torch::manual_seed(9);
  MultiHeadLatentAttention mla(MultiHeadLatentAttentionOptions(8, 16, 2)
                                   .latent_dim(6)
                                   .rope_dim(4)
                                   .q_latent_dim(5)
                                   .latent_norm(true));
  std::vector<std::string> names;
  for (const auto& p : mla->named_parameters()) names.push_back(p.key());
  CHECK(names == std::vector<std::string>{"W_DQ.weight", "q_norm.weight", "W_UQ.weight",
                                          "W_QR.weight", "W_DKV.weight", "kv_norm.weight",
                                          "W_KR.weight", "W_UK.weight", "W_UV.weight",
                                          "out_proj.weight", "out_proj.bias"});
  CHECK(mla->W_QR->weight.sizes() == torch::IntArrayRef({2 * 4, 5}));
  CHECK(mla->W_KR->weight.sizes() == torch::IntArrayRef({4, 8}));
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({1, 6, 8});
  LatentCache cache(8);
  mla(x, &cache);
  CHECK(cache.latent().sizes() == torch::IntArrayRef({1, 6, 6 + 4}));
  CHECK(cache.bytes_per_token() == (6 + 4) * 4);
  // The rotary key of token j is W_KR x_j rotated by j, whichever call brought it.
  const auto rotated = attention::functional::apply_rotary(mla->W_KR(x), torch::arange(6));
  CHECK(max_abs_diff(cache.latent().narrow(-1, 6, 4), rotated) < 1e-6);
  // A later call goes on at position 6.
  const auto next = torch::randn({1, 1, 8});
  mla(next, &cache);
  CHECK(max_abs_diff(cache.latent().narrow(1, 6, 1).narrow(-1, 6, 4),
                     attention::functional::apply_rotary(
                         mla->W_KR(next), torch::full({1}, 6, torch::kLong))) < 1e-6);
}

TEST_CASE("MLA: an unbatched input gives the batched row; dropout trains through the cache",
          "[mla]") {
  torch::manual_seed(8);
  MultiHeadLatentAttention mla(MultiHeadLatentAttentionOptions(8, 16, 4).dropout(0.5));
  mla->eval();
  const auto x = torch::randn({1, 7, 8});
  CHECK(max_abs_diff(mla(x[0]), mla(x)[0]) < 1e-6);
  LatentCache cache(7);
  CHECK(mla(x[0], &cache).sizes() == torch::IntArrayRef({7, 16}));
  CHECK(cache.latent().sizes() == torch::IntArrayRef({1, 7, 16}));
  // In training the weights are dropped, so the book's form runs over the cache's latent.
  mla->train();
  cache.reset();
  const auto trained = mla(x, &cache);
  CHECK(trained.sizes() == torch::IntArrayRef({1, 7, 16}));
  CHECK(torch::isfinite(trained).all().item<bool>());
}

TEST_CASE("LatentCache: latent_dim numbers per token, views in inference, refusals change nothing",
          "[mla]") {
  torch::manual_seed(9);
  MultiHeadLatentAttention mla(MultiHeadLatentAttentionOptions(64, 64, 4));
  CHECK(mla->options.latent_dim() == 16);  // the book's max(16, d_out / 8)
  CHECK(MultiHeadLatentAttentionOptions(8, 512, 4).latent_dim() == 64);
  LatentCache cache(8);
  CHECK(cache.bytes_per_token() == 0);
  {
    torch::NoGradGuard no_grad;
    mla(torch::randn({2, 5, 64}), &cache);
  }
  // 16 floats per token, where a KVCache of the same heads keeps 2 x 64.
  CHECK(cache.bytes_per_token() == 16 * 4);
  const auto kept = cache.latent().clone();
  CHECK_THROWS_C10(mla(torch::randn({2, 4, 64}), &cache), c10::ValueError,
                   "attention::LatentCache: cannot append 4 token(s) to the 5 cached: max_length "
                   "is 8 (reset() the cache or make a longer one)");
  CHECK_THROWS_C10(mla(torch::randn({3, 1, 64}), &cache), c10::ValueError,
                   "attention::LatentCache: expected a latent (2, T, 16) like the cached one, got "
                   "(3, 1, 16)");
  CHECK(cache.length() == 5);
  CHECK(torch::equal(cache.latent(), kept));
  // What append returns in inference is the storage itself.
  torch::NoGradGuard no_grad;
  const auto all = cache.append(torch::randn({2, 1, 16}));
  CHECK(all.data_ptr() == cache.latent().data_ptr());
  cache.truncate(2);
  CHECK(cache.length() == 2);
}
