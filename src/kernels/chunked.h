#pragma once

// Shared by the two halves of the chunked backend: the device-generic tiles made of LibTorch
// ops (chunked.cpp, forward and backward) and the fused CPU forward (chunked_cpu.cpp).

#include <torch/torch.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace attention {
namespace kernels {

// The shapes of one call. Queries are (..., H, Tq, d) with H = Hkv x G; flattened, they are
// N x G query heads where N counts the key/value heads (..., Hkv) of keys (..., Hkv, Tk, d) and
// values (..., Hkv, Tk, dv): query head h reads key/value head h / G.
struct Problem {
  int64_t n, g, t_q, t_k, d, dv, block;
  bool causal;
  std::vector<int64_t> lead;  // (..., H): the leading dims of the scores
  torch::Tensor mask;         // undefined, or expanded to (..., H, Tq, Tk)
};

// Where causal attention of query block [i0, i0 + bq) ends among the keys (queries are the last
// Tq of the Tk positions).
inline int64_t keys_end(const Problem& p, int64_t i0, int64_t bq) {
  if (!p.causal) return p.t_k;
  return std::clamp<int64_t>(i0 + bq + (p.t_k - p.t_q), 0, p.t_k);
}

/// Whether the fused CPU forward takes these queries: CPU, float or double.
bool cpu_forward_applies(const torch::Tensor& query);

/// The fused CPU forward. Inputs keep their shapes (..., H, T, d) and may be strided views.
/// Returns the output, shaped like the queries with dv features and laid out in memory like them
/// (so that a module's transpose back to (B, T, H, dv) is a view), and the log-sum-exp of every
/// query's scaled scores (N, G, Tq), +inf for a query whose keys are all masked.
std::pair<torch::Tensor, torch::Tensor> cpu_forward(const Problem& p, const torch::Tensor& query,
                                                    const torch::Tensor& key,
                                                    const torch::Tensor& value, double scale);

}  // namespace kernels
}  // namespace attention
