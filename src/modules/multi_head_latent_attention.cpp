#include <attention/multi_head_latent_attention.h>

#include "modules/shared.h"

#include <torch/torch.h>

#include <cmath>

namespace attention {

namespace {
constexpr const char* kMultiHeadLatentAttentionName = "attention::MultiHeadLatentAttention";
}  // namespace

MultiHeadLatentAttentionImpl::MultiHeadLatentAttentionImpl(
    const MultiHeadLatentAttentionOptions& options_)
    : options(options_) {
  reset();
}

void MultiHeadLatentAttentionImpl::reset() {
  const auto& o = options;
  detail::check_head_sizes(o.d_in(), o.d_out(), o.num_heads(), o.dropout(),
                           kMultiHeadLatentAttentionName);
  detail::check_positive(o.latent_dim(), "latent_dim", kMultiHeadLatentAttentionName);
  using torch::nn::Linear;
  using torch::nn::LinearOptions;
  const auto projection = [&](int64_t from, int64_t to) {
    return Linear(LinearOptions(from, to).bias(o.qkv_bias()));
  };
  // The book's order, so that a seed gives its weights.
  W_query = register_module("W_query", projection(o.d_in(), o.d_out()));
  W_DKV = register_module("W_DKV", projection(o.d_in(), o.latent_dim()));
  W_UK = register_module("W_UK", projection(o.latent_dim(), o.d_out()));
  W_UV = register_module("W_UV", projection(o.latent_dim(), o.d_out()));
  out_proj = register_module("out_proj", Linear(LinearOptions(o.d_out(), o.d_out())));
}

void MultiHeadLatentAttentionImpl::pretty_print(std::ostream& stream) const {
  const auto& o = options;
  stream << kMultiHeadLatentAttentionName << "(d_in=" << o.d_in() << ", d_out=" << o.d_out()
         << ", num_heads=" << o.num_heads() << ", latent_dim=" << o.latent_dim()
         << ", qkv_bias=" << std::boolalpha << o.qkv_bias() << ", dropout=" << o.dropout() << ")";
}

torch::Tensor MultiHeadLatentAttentionImpl::forward(const torch::Tensor& x, LatentCache* cache) {
  detail::check_module_input(x, options.d_in(), W_query->weight, kMultiHeadLatentAttentionName,
                             "x");
  const auto batch = x.dim() == 2 ? x.unsqueeze(0) : x;
  const int64_t b = batch.size(0), t = batch.size(1);
  // 1) Each head's queries, and the latent of the new tokens.
  const auto queries = W_query(batch).view({b, t, options.num_heads(), head_dim()}).transpose(1, 2);
  const auto latent = W_DKV(batch);
  // 2) Attention over every latent: the cached ones first when there is a cache.
  // Dropout keeps the book's form: its weights no longer sum to 1, which the absorbed bias needs.
  const bool absorbed = cache != nullptr && attention_options().dropout_p() == 0.0;
  const auto all = cache != nullptr ? cache->append(latent) : latent;
  const auto context = absorbed ? attend_absorbed(queries, all) : attend_expanded(queries, all);
  // 3) The heads joined, then the output projection.
  const auto out = out_proj(context.transpose(1, 2).reshape({b, t, options.d_out()}));
  return x.dim() == 2 ? out.squeeze(0) : out;
}

functional::ScaledDotProductAttentionOptions MultiHeadLatentAttentionImpl::attention_options()
    const {
  return functional::ScaledDotProductAttentionOptions()
      .is_causal(true)
      .backend(options.backend())
      .dropout_p(is_training() ? options.dropout() : 0.0);
}

torch::Tensor MultiHeadLatentAttentionImpl::attend_expanded(const torch::Tensor& queries,
                                                            const torch::Tensor& latent) {
  const int64_t b = latent.size(0), t_k = latent.size(1);
  const auto heads = [&](const torch::Tensor& projected) {
    return projected.view({b, t_k, options.num_heads(), head_dim()}).transpose(1, 2);
  };
  return functional::scaled_dot_product_attention(queries, heads(W_UK(latent)), heads(W_UV(latent)),
                                                  attention_options())
      .output;
}

torch::Tensor MultiHeadLatentAttentionImpl::attend_absorbed(const torch::Tensor& queries,
                                                            const torch::Tensor& latent) {
  const int64_t h = options.num_heads(), hd = head_dim(), r = options.latent_dim();
  // Head h's key of token j is W_UK_h c_j (+ b_h), so q . k = (W_UK_hᵀ q) . c_j (+ q . b_h, the
  // same for every key: the softmax cancels it).
  const auto key_up = W_UK->weight.view({h, hd, r});
  const auto latent_queries = queries.matmul(key_up);  // (B, H, T, r)
  // One key and value head for all heads: the latent itself.
  const auto shared = latent.unsqueeze(1);
  auto attention = attention_options().scale(1.0 / std::sqrt(static_cast<double>(hd)));
  const auto latent_context =
      functional::scaled_dot_product_attention(latent_queries, shared, shared, attention).output;
  // Head h's value of token j is W_UV_h c_j + b_h, and the weights sum to 1.
  auto context = latent_context.matmul(W_UV->weight.view({h, hd, r}).transpose(1, 2));
  if (W_UV->bias.defined()) context = context + W_UV->bias.view({h, 1, hd});
  return context;
}

}  // namespace attention
