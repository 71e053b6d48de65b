// functional::sparse_attention: its checks, the gathering route in LibTorch ops (Backend::Math,
// every device) and the autograd function around the fused CPU kernel
// (kernels/cpu/sparse_attention.h).

#include <attention/sparse_attention.h>

#include "checks.h"
#include "functional/enum_checks.h"
#include "functional/last_path.h"
#include "kernels/cpu/sparse_attention.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace attention {
namespace functional {

namespace {

constexpr const char* kSparseAttentionName = "attention::functional::sparse_attention";
// Elements of gathered keys (or values) one block of queries makes on the Math route.
constexpr int64_t kGatherElements = int64_t{1} << 22;

using detail::shape_str;

// Every check, before anything is computed. Returns the indices as Long.
torch::Tensor check_arguments(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const torch::Tensor& indices,
                              const SparseAttentionOptions& options) {
  const char* caller = kSparseAttentionName;
  TORCH_CHECK_VALUE(q.defined() && k.defined() && v.defined() && indices.defined(), caller,
                    ": expected defined query, key, value and indices tensors");
  TORCH_CHECK_VALUE(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, caller,
                    ": expected query (B, H, T, d), key (B, H_kv, S, d) and value (B, H_kv, S, "
                    "d_v), got ",
                    shape_str(q.sizes()), ", ", shape_str(k.sizes()), ", ", shape_str(v.sizes()));
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), hkv = k.size(1), s = k.size(2);
  TORCH_CHECK_VALUE(k.size(0) == b && k.size(3) == q.size(3) && v.size(0) == b &&
                        v.size(1) == hkv && v.size(2) == s && hkv > 0 && h % hkv == 0,
                    caller,
                    ": expected key (B, H_kv, S, d) and value (B, H_kv, S, d_v) for query (B, H, "
                    "T, d) with H_kv dividing H, got query ",
                    shape_str(q.sizes()), ", key ", shape_str(k.sizes()), ", value ",
                    shape_str(v.sizes()));
  TORCH_CHECK_VALUE(indices.dim() == 3 && indices.size(0) == b && indices.size(1) == t, caller,
                    ": expected indices of shape (", b, ", ", t, ", K), got ",
                    shape_str(indices.sizes()));
  TORCH_CHECK_TYPE(indices.scalar_type() == at::kLong || indices.scalar_type() == at::kInt, caller,
                   ": expected Long or Int indices, got ", indices.scalar_type());
  const auto dtype = q.scalar_type();
  TORCH_CHECK_TYPE(k.scalar_type() == dtype && v.scalar_type() == dtype, caller,
                   ": expected query, key and value of one dtype, got ", dtype, ", ",
                   k.scalar_type(), ", ", v.scalar_type());
  TORCH_CHECK_TYPE(c10::isFloatingType(dtype), caller, ": expected a floating-point dtype, got ",
                   dtype);
  TORCH_CHECK_TYPE(!(q.device().is_cpu() && dtype == at::kHalf), caller,
                   ": expected Float, Double or BFloat16 on the CPU, got Half");
  for (const auto* tensor : {&k, &v, &indices}) {
    TORCH_CHECK(tensor->device() == q.device(), caller,
                ": expected query, key, value and indices on one device, got ", q.device(), " and ",
                tensor->device());
  }
  if (options.scale().has_value()) {
    TORCH_CHECK_VALUE(std::isfinite(*options.scale()), caller, ": expected a finite scale, got ",
                      *options.scale());
  }
  TORCH_CHECK_VALUE(options.dropout_p() >= 0.0 && options.dropout_p() < 1.0, caller,
                    ": expected dropout_p in [0, 1), got ", options.dropout_p());
  detail::check_backend(options.backend(), caller);
  TORCH_CHECK_VALUE(options.backend() != Backend::Native, caller,
                    ": Backend::Native has no sparse attention; use Auto, Chunked or Math");
  TORCH_CHECK_VALUE(
      options.backend() != Backend::Chunked || (q.device().is_cpu() && options.dropout_p() == 0.0),
      caller, ": Backend::Chunked runs on the CPU without dropout; use Auto or Math");
  // Indices are read before anything else: one out of range would read outside the keys.
  const auto as_long = indices.to(at::kLong);
  if (as_long.numel() > 0) {
    const int64_t lowest = as_long.min().item<int64_t>(), highest = as_long.max().item<int64_t>();
    TORCH_CHECK_VALUE(lowest >= -1 && highest < s, caller, ": expected indices in [-1, ", s,
                      ") (-1 for none; S = ", s, " keys), got values from ", lowest, " to ",
                      highest);
  }
  return as_long;
}

// One block of queries [t0, t1) over its gathered keys and values, in LibTorch ops.
torch::Tensor gathered_block(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& indices, double scale, double dropout_p) {
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), d = q.size(3), hkv = k.size(1),
                dv = v.size(3), n = indices.size(2);
  const auto valid = indices.ge(0);  // (B, Tb, K)
  const auto at = indices.clamp_min(0).reshape({b, 1, t * n, 1});
  const auto keys = k.gather(2, at.expand({b, hkv, t * n, d})).view({b, hkv, 1, t, n, d});
  const auto values = v.gather(2, at.expand({b, hkv, t * n, dv})).view({b, hkv, 1, t, n, dv});
  const auto queries = q.reshape({b, hkv, h / hkv, t, 1, d});
  auto scores = queries.matmul(keys.transpose(-1, -2)) * scale;  // (B, Hkv, G, Tb, 1, K)
  const auto hidden = valid.logical_not().view({b, 1, 1, t, 1, n});
  scores = scores.masked_fill(hidden, -std::numeric_limits<double>::infinity());
  auto weights = torch::softmax(scores, -1);
  // A query without keys: zeros, not the NaN of a softmax over nothing.
  const auto none = valid.any(-1).logical_not().view({b, 1, 1, t, 1, 1});
  weights = weights.masked_fill(none, 0.0);
  if (dropout_p > 0.0) weights = torch::dropout(weights, dropout_p, true);
  return weights.matmul(values).reshape({b, h, t, dv});
}

torch::Tensor gathered(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                       const torch::Tensor& indices, double scale, double dropout_p) {
  const int64_t t = q.size(2), n = std::max<int64_t>(1, indices.size(2));
  const int64_t width = std::max<int64_t>(1, k.size(1) * std::max(k.size(3), v.size(3)));
  const int64_t block = std::max<int64_t>(1, kGatherElements / (n * width) / q.size(0));
  std::vector<torch::Tensor> blocks;
  for (int64_t t0 = 0; t0 < t; t0 += block) {
    const int64_t len = std::min(block, t - t0);
    blocks.push_back(
        gathered_block(q.narrow(2, t0, len), k, v, indices.narrow(1, t0, len), scale, dropout_p));
  }
  if (blocks.empty()) return v.new_zeros({q.size(0), q.size(1), 0, v.size(3)});
  return blocks.size() == 1 ? blocks[0] : torch::cat(blocks, 2);
}

// The fused kernel with its backward; float or double, contiguous.
struct FusedSparseAttention : public torch::autograd::Function<FusedSparseAttention> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q,
                               const torch::Tensor& k, const torch::Tensor& v,
                               const torch::Tensor& indices, double scale) {
    auto lse = torch::empty({q.size(0), q.size(1), q.size(2)}, q.options());
    auto out = kernels::cpu::sparse_attention_forward(q, k, v, indices, scale, lse);
    ctx->save_for_backward({q, k, v, indices, out, lse});
    ctx->saved_data["scale"] = scale;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    detail::refuse_double_backward(kSparseAttentionName);
    const auto s = ctx->get_saved_variables();
    auto g = kernels::cpu::sparse_attention_backward(grads[0], s[0], s[1], s[2], s[3], s[4], s[5],
                                                     ctx->saved_data["scale"].toDouble());
    return {g.q, g.k, g.v, torch::Tensor(), torch::Tensor()};
  }
};

torch::Tensor fused(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                    const torch::Tensor& indices, double scale) {
  const auto qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  const auto ic = indices.contiguous();
  if (detail::records_grad(q, k, v)) return FusedSparseAttention::apply(qc, kc, vc, ic, scale);
  return kernels::cpu::sparse_attention_forward(qc, kc, vc, ic, scale, torch::Tensor());
}

}  // namespace

torch::Tensor sparse_attention(const torch::Tensor& query, const torch::Tensor& key,
                               const torch::Tensor& value, const torch::Tensor& indices,
                               const SparseAttentionOptions& options) {
  const auto index = check_arguments(query, key, value, indices, options);
  const double scale =
      options.scale().value_or(1.0 / std::sqrt(static_cast<double>(query.size(3))));
  const bool on_kernel =
      query.device().is_cpu() && options.backend() != Backend::Math && options.dropout_p() == 0.0;
  record_last_path(on_kernel ? Path::ChunkedFused : Path::Math);
  if (!on_kernel) return gathered(query, key, value, index, scale, options.dropout_p());
  if (query.scalar_type() == at::kFloat || query.scalar_type() == at::kDouble) {
    return fused(query, key, value, index, scale);
  }
  // BFloat16: computed in float, rounded once.
  const auto f = [](const torch::Tensor& x) { return x.to(at::kFloat); };
  return fused(f(query), f(key), f(value), index, scale).to(query.scalar_type());
}

}  // namespace functional
}  // namespace attention
