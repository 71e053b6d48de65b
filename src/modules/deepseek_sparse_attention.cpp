#include <attention/deepseek_sparse_attention.h>

#include "modules/shared.h"

#include <torch/torch.h>

namespace attention {

namespace {
constexpr const char* kDeepSeekSparseAttentionName = "attention::DeepSeekSparseAttention";
}  // namespace

DeepSeekSparseAttentionImpl::DeepSeekSparseAttentionImpl(
    const DeepSeekSparseAttentionOptions& options_)
    : options(options_) {
  reset();
}

void DeepSeekSparseAttentionImpl::reset() {
  const auto& o = options;
  detail::check_head_sizes(o.d_in(), o.d_out(), o.num_heads(), o.dropout(),
                           kDeepSeekSparseAttentionName);
  detail::check_positive(o.topk(), "topk", kDeepSeekSparseAttentionName);
  detail::check_not_native(o.backend(), "sparse attention", kDeepSeekSparseAttentionName);
  using torch::nn::Linear;
  using torch::nn::LinearOptions;
  const auto projection = [&](int64_t from, int64_t to) {
    return Linear(LinearOptions(from, to).bias(o.qkv_bias()));
  };
  // The book's order, so that a seed gives its weights.
  W_query = register_module("W_query", projection(o.d_in(), o.d_out()));
  W_key = register_module("W_key", projection(o.d_in(), o.d_out()));
  W_value = register_module("W_value", projection(o.d_in(), o.d_out()));
  out_proj = register_module("out_proj", Linear(LinearOptions(o.d_out(), o.d_out())));
  indexer = register_module("indexer", LightningIndexer(LightningIndexerOptions(o.d_in())
                                                            .index_n_heads(o.index_n_heads())
                                                            .index_head_dim(o.index_head_dim())));
}

void DeepSeekSparseAttentionImpl::pretty_print(std::ostream& stream) const {
  const auto& o = options;
  stream << kDeepSeekSparseAttentionName << "(d_in=" << o.d_in() << ", d_out=" << o.d_out()
         << ", num_heads=" << o.num_heads() << ", topk=" << o.topk()
         << ", index_n_heads=" << o.index_n_heads() << ", index_head_dim=" << o.index_head_dim()
         << ", qkv_bias=" << std::boolalpha << o.qkv_bias() << ", dropout=" << o.dropout() << ")";
}

torch::Tensor DeepSeekSparseAttentionImpl::forward(const torch::Tensor& x,
                                                   SparseAttentionCache* cache) {
  detail::check_module_input(x, options.d_in(), W_query->weight, kDeepSeekSparseAttentionName, "x");
  const auto batch = x.dim() == 2 ? x.unsqueeze(0) : x;
  const int64_t b = batch.size(0), t = batch.size(1);
  const auto heads = [&](const torch::Tensor& p) {
    return p.view({b, t, options.num_heads(), head_dim()}).transpose(1, 2);
  };
  // 1) Queries, keys and values per head, and each new token's index key.
  const auto queries = heads(W_query(batch));
  SparseAttentionCache::Cached all{heads(W_key(batch)), heads(W_value(batch)),
                                   indexer->keys(batch)};
  // A forward refused after the append (dropout on the Chunked backend, say) puts it back.
  detail::CacheRestore<SparseAttentionCache> restore(cache);
  if (cache != nullptr) all = cache->append(all.keys, all.values, all.index_keys);
  // 2) The indexer picks each query's keys among itself and the tokens before it.
  const auto chosen = indexer(batch, all.index_keys, options.topk());
  // 3) Attention over those keys only, the heads joined, the output projection.
  const auto context =
      functional::sparse_attention(queries, all.keys, all.values, chosen,
                                   functional::SparseAttentionOptions()
                                       .backend(options.backend())
                                       .dropout_p(is_training() ? options.dropout() : 0.0));
  const auto out = out_proj(context.transpose(1, 2).reshape({b, t, options.d_out()}));
  restore.keep();
  return x.dim() == 2 ? out.squeeze(0) : out;
}

}  // namespace attention
