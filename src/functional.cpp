#include <attention/functional.h>

#include "detail.h"
#include "kernels/kernels.h"

#include <algorithm>

namespace attention {
namespace functional {
namespace {

constexpr const char* kName = "attention::functional::scaled_dot_product_attention";

void check_inputs(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                  const ScaledDotProductAttentionOptions& options) {
  using detail::shape_str;
  TORCH_CHECK_VALUE(q.defined() && k.defined() && v.defined(), kName,
                    ": expected defined query, key and value tensors");
  TORCH_CHECK_VALUE(q.dim() >= 2 && q.dim() == k.dim() && q.dim() == v.dim(), kName,
                    ": expected query, key and value of the same rank >= 2, got query ",
                    shape_str(q.sizes()), ", key ", shape_str(k.sizes()), ", value ",
                    shape_str(v.sizes()));
  TORCH_CHECK_TYPE(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(), kName,
                   ": expected query, key and value of one dtype, got ", q.scalar_type(), ", ",
                   k.scalar_type(), ", ", v.scalar_type());
  TORCH_CHECK_TYPE(c10::isFloatingType(q.scalar_type()), kName,
                   ": expected a floating-point dtype, got ", q.scalar_type());
  TORCH_CHECK(q.device() == k.device() && q.device() == v.device(), kName,
              ": expected query, key and value on one device, got ", q.device(), ", ", k.device(),
              ", ", v.device());
  TORCH_CHECK_VALUE(q.size(-1) == k.size(-1), kName,
                    ": expected query and key with the same feature size, got query ",
                    shape_str(q.sizes()), " and key ", shape_str(k.sizes()));
  TORCH_CHECK_VALUE(k.sizes().slice(0, k.dim() - 1) == v.sizes().slice(0, v.dim() - 1), kName,
                    ": expected key and value that differ only in the last dimension, got key ",
                    shape_str(k.sizes()), " and value ", shape_str(v.sizes()));
  const int64_t lead = q.dim() - 2;
  const bool heads_ok =
      lead == 0 || (q.sizes().slice(0, lead - 1) == k.sizes().slice(0, lead - 1) &&
                    q.size(-3) % k.size(-3) == 0);
  TORCH_CHECK_VALUE(heads_ok, kName,
                    ": expected query (..., H, Tq, d) and key (..., Hkv, Tk, d) with equal leading "
                    "dimensions and H a multiple of Hkv, got query ",
                    shape_str(q.sizes()), " and key ", shape_str(k.sizes()));
  TORCH_CHECK_VALUE(options.dropout_p() >= 0.0 && options.dropout_p() < 1.0, kName,
                    ": expected dropout_p in [0, 1), got ", options.dropout_p());
  TORCH_CHECK_VALUE(options.block_size() > 0, kName, ": expected block_size > 0, got ",
                    options.block_size());

  const torch::Tensor& mask = options.attn_mask();
  if (!mask.defined()) return;
  TORCH_CHECK_TYPE(mask.scalar_type() == at::kBool || mask.scalar_type() == q.scalar_type(), kName,
                   ": expected attn_mask of dtype bool (true = masked out) or ", q.scalar_type(),
                   " (additive), got ", mask.scalar_type());
  TORCH_CHECK(mask.device() == q.device(), kName, ": expected attn_mask on device ", q.device(),
              ", got ", mask.device());
  auto scores = q.sizes().vec();
  scores.back() = k.size(-2);
  TORCH_CHECK_VALUE(detail::broadcastable_to(mask.sizes(), scores), kName,
                    ": expected attn_mask broadcastable to the scores ", shape_str(scores),
                    ", got ", shape_str(mask.sizes()));
}

bool uses_chunked(const torch::Tensor& q, const torch::Tensor& k,
                  const ScaledDotProductAttentionOptions& options) {
  if (options.need_weights() || options.dropout_p() > 0.0) return false;
  const int64_t scores = q.numel() / std::max<int64_t>(q.size(-1), 1) * k.size(-2);
  return scores >= kAutoChunkedScores;
}

}  // namespace

AttentionOutput scaled_dot_product_attention(const torch::Tensor& query, const torch::Tensor& key,
                                             const torch::Tensor& value,
                                             const ScaledDotProductAttentionOptions& options) {
  check_inputs(query, key, value, options);
  switch (options.backend()) {
    case Backend::Auto:
      if (!uses_chunked(query, key, options)) return kernels::math(query, key, value, options);
      // LibTorch 2's fused kernel has a fused backward, faster than recomputing tiles; forward
      // only, the chunked kernel is level with it (long context too), and Native falls back to
      // whole matrices when given a mask.
      if (kernels::native_is_fused() && detail::records_grad({query, key, value}) &&
          !options.attn_mask().defined()) {
        return kernels::native(query, key, value, options);
      }
      return kernels::chunked(query, key, value, options, options.block_size());
    case Backend::Math:
      return kernels::math(query, key, value, options);
    case Backend::Chunked:
      return kernels::chunked(query, key, value, options, options.block_size());
    case Backend::Native:
      return kernels::native(query, key, value, options);
  }
  TORCH_CHECK(false, kName, ": unknown backend");
}

torch::Tensor projected_attention(const torch::Tensor& x_q, const torch::Tensor& x_kv,
                                  const torch::Tensor& W_query, const torch::Tensor& W_key,
                                  const torch::Tensor& W_value,
                                  const ScaledDotProductAttentionOptions& options) {
  const bool plain = !options.attn_mask().defined() && !options.scale() &&
                     options.dropout_p() == 0.0 && !options.need_weights() &&
                     options.backend() == Backend::Auto;
  if (plain && kernels::tiny_applies(x_q, x_kv, W_query, W_key, W_value)) {
    return kernels::tiny(x_q, x_kv, W_query, W_key, W_value, options.is_causal());
  }
  auto queries = x_q.matmul(W_query);
  auto keys = x_kv.matmul(W_key);
  auto values = x_kv.matmul(W_value);
  return scaled_dot_product_attention(queries, keys, values, options).output;
}

}  // namespace functional
}  // namespace attention
