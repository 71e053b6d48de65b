#include <attention/multi_head_latent_attention.h>

#include <attention/rotary.h>

#include "modules/shared.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>

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
  TORCH_CHECK_VALUE(o.rope_dim() >= 0 && o.rope_dim() % 2 == 0, kMultiHeadLatentAttentionName,
                    ": expected rope_dim even and >= 0 (0: no rotary part), got ", o.rope_dim());
  TORCH_CHECK_VALUE(o.rope_dim() <= std::numeric_limits<int64_t>::max() / o.num_heads(),
                    kMultiHeadLatentAttentionName, ": expected num_heads x rope_dim within int64, ",
                    "got num_heads ", o.num_heads(), " and rope_dim ", o.rope_dim());
  TORCH_CHECK_VALUE(std::isfinite(o.rope_theta()) && o.rope_theta() > 1.0,
                    kMultiHeadLatentAttentionName, ": expected a finite rope_theta > 1, got ",
                    o.rope_theta());
  TORCH_CHECK_VALUE(o.q_latent_dim() >= 0, kMultiHeadLatentAttentionName,
                    ": expected q_latent_dim >= 0 (0: no query latent), got ", o.q_latent_dim());
  using torch::nn::Linear;
  using torch::nn::LinearOptions;
  const auto projection = [&](int64_t from, int64_t to) {
    return Linear(LinearOptions(from, to).bias(o.qkv_bias()));
  };
  const auto norm = [](int64_t size) { return RMSNorm(RMSNormOptions(size).eps(1e-6)); };
  // The book's order, so that a seed gives its weights; DeepSeek's parts where they belong.
  int64_t query_source = o.d_in();
  if (o.q_latent_dim() > 0) {
    W_DQ = register_module("W_DQ", projection(o.d_in(), o.q_latent_dim()));
    if (o.latent_norm()) q_norm = register_module("q_norm", norm(o.q_latent_dim()));
    W_UQ = register_module("W_UQ", projection(o.q_latent_dim(), o.d_out()));
    query_source = o.q_latent_dim();
  } else {
    W_query = register_module("W_query", projection(o.d_in(), o.d_out()));
  }
  if (o.rope_dim() > 0) {
    W_QR = register_module("W_QR", projection(query_source, o.num_heads() * o.rope_dim()));
  }
  W_DKV = register_module("W_DKV", projection(o.d_in(), o.latent_dim()));
  if (o.latent_norm()) kv_norm = register_module("kv_norm", norm(o.latent_dim()));
  if (o.rope_dim() > 0) W_KR = register_module("W_KR", projection(o.d_in(), o.rope_dim()));
  W_UK = register_module("W_UK", projection(o.latent_dim(), o.d_out()));
  W_UV = register_module("W_UV", projection(o.latent_dim(), o.d_out()));
  out_proj = register_module("out_proj", Linear(LinearOptions(o.d_out(), o.d_out())));
}

void MultiHeadLatentAttentionImpl::pretty_print(std::ostream& stream) const {
  const auto& o = options;
  stream << kMultiHeadLatentAttentionName << "(d_in=" << o.d_in() << ", d_out=" << o.d_out()
         << ", num_heads=" << o.num_heads() << ", latent_dim=" << o.latent_dim()
         << ", qkv_bias=" << std::boolalpha << o.qkv_bias() << ", dropout=" << o.dropout();
  if (o.rope_dim() > 0)
    stream << ", rope_dim=" << o.rope_dim() << ", rope_theta=" << o.rope_theta();
  if (o.q_latent_dim() > 0) stream << ", q_latent_dim=" << o.q_latent_dim();
  if (o.latent_norm()) stream << ", latent_norm=true";
  stream << ")";
}

torch::Tensor MultiHeadLatentAttentionImpl::forward(const torch::Tensor& x, LatentCache* cache) {
  detail::check_module_input(x, options.d_in(), W_DKV->weight, kMultiHeadLatentAttentionName, "x");
  const auto batch = x.dim() == 2 ? x.unsqueeze(0) : x;
  const int64_t b = batch.size(0), t = batch.size(1), h = options.num_heads();
  // Each head's width named: a view with -1 cannot size an empty batch or sequence.
  const auto heads = [&](const torch::Tensor& y, int64_t width) {
    return y.view({b, t, h, width}).transpose(1, 2);
  };
  // 1) Each head's queries, and the latent of the new tokens (DeepSeek's options: the queries
  // from a latent of their own, each latent normalized).
  const auto normalized = [](RMSNorm& norm, const torch::Tensor& y) {
    return norm.is_empty() ? y : norm(y);
  };
  const auto query_source = W_DQ.is_empty() ? batch : normalized(q_norm, W_DQ(batch));
  const auto queries = heads((W_DQ.is_empty() ? W_query : W_UQ)(query_source), head_dim());
  auto latent = normalized(kv_norm, W_DKV(batch));
  // DeepSeek's rotary part: a rotated query part per head and one rotated key per token, which
  // the cache keeps beside the latent. The positions go on from the cache's.
  torch::Tensor rotary_queries;
  if (options.rope_dim() > 0) {
    const int64_t past = cache != nullptr ? cache->length() : 0;
    const auto positions = torch::arange(past, past + t, x.options().dtype(torch::kLong));
    const auto rope = functional::RotaryOptions().theta(options.rope_theta());
    rotary_queries =
        functional::apply_rotary(heads(W_QR(query_source), options.rope_dim()), positions, rope);
    latent = torch::cat({latent, functional::apply_rotary(W_KR(batch), positions, rope)}, -1);
  }
  // 2) Attention over every latent: the cached ones first when there is a cache.
  // Dropout keeps the book's form: its weights no longer sum to 1, which the absorbed bias needs.
  const bool absorbed = cache != nullptr && attention_options().dropout_p() == 0.0;
  // A forward refused after the append (dropout on the Chunked backend, say) puts it back.
  detail::CacheRestore<LatentCache> restore(cache);
  const auto all = cache != nullptr ? cache->append(latent) : latent;
  const auto context = absorbed ? attend_absorbed(queries, rotary_queries, all)
                                : attend_expanded(queries, rotary_queries, all);
  // 3) The heads joined, then the output projection.
  const auto out = out_proj(context.transpose(1, 2).reshape({b, t, options.d_out()}));
  restore.keep();
  return x.dim() == 2 ? out.squeeze(0) : out;
}

functional::ScaledDotProductAttentionOptions MultiHeadLatentAttentionImpl::attention_options()
    const {
  // The rotary part adds its features to every score.
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim() + options.rope_dim()));
  return functional::ScaledDotProductAttentionOptions()
      .is_causal(true)
      .scale(scale)
      .backend(options.backend())
      .dropout_p(is_training() ? options.dropout() : 0.0);
}

torch::Tensor MultiHeadLatentAttentionImpl::attend_expanded(const torch::Tensor& queries,
                                                            const torch::Tensor& rotary_queries,
                                                            const torch::Tensor& cached) {
  const int64_t b = cached.size(0), t_k = cached.size(1), h = options.num_heads();
  const auto heads = [&](const torch::Tensor& projected) {
    return projected.view({b, t_k, h, head_dim()}).transpose(1, 2);
  };
  const auto latent = cached.narrow(-1, 0, options.latent_dim());
  auto keys = heads(W_UK(latent));
  auto all_queries = queries;
  if (rotary_queries.defined()) {
    // Every head's key ends with the token's one rotary key.
    const auto rotary_keys = cached.narrow(-1, options.latent_dim(), options.rope_dim());
    keys = torch::cat({keys, rotary_keys.unsqueeze(1).expand({b, h, t_k, options.rope_dim()})}, -1);
    all_queries = torch::cat({queries, rotary_queries}, -1);
  }
  return functional::scaled_dot_product_attention(all_queries, keys, heads(W_UV(latent)),
                                                  attention_options())
      .output;
}

torch::Tensor MultiHeadLatentAttentionImpl::attend_absorbed(const torch::Tensor& queries,
                                                            const torch::Tensor& rotary_queries,
                                                            const torch::Tensor& cached) {
  const int64_t h = options.num_heads(), hd = head_dim(), r = options.latent_dim();
  // Head h's key of token j is W_UK_h c_j (+ b_h), so q . k = (W_UK_hᵀ q) . c_j (+ q . b_h, the
  // same for every key: the softmax cancels it).
  const auto key_up = W_UK->weight.view({h, hd, r});
  auto latent_queries = queries.matmul(key_up);  // (B, H, T, r)
  // One key head for all heads: the cached rows themselves, the rotary key included (which the
  // rotary queries meet as they are); the values are their latent part.
  const auto shared = cached.unsqueeze(1);
  if (rotary_queries.defined()) latent_queries = torch::cat({latent_queries, rotary_queries}, -1);
  const auto values = rotary_queries.defined() ? shared.narrow(-1, 0, r) : shared;
  const auto latent_context =
      functional::scaled_dot_product_attention(latent_queries, shared, values, attention_options())
          .output;
  // Head h's value of token j is W_UV_h c_j + b_h, and the weights sum to 1.
  auto context = latent_context.matmul(W_UV->weight.view({h, hd, r}).transpose(1, 2));
  if (W_UV->bias.defined()) context = context + W_UV->bias.view({h, 1, hd});
  return context;
}

}  // namespace attention
