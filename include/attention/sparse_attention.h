#pragma once

/// \file
/// Attention over selected keys: each query attends to the keys its indices name and to no other
/// (DeepSeek sparse attention's top-k attention).

#include <attention/export.h>
#include <attention/functional.h>

#include <torch/arg.h>
#include <torch/types.h>

#include <c10/util/Optional.h>

namespace attention {
namespace functional {

/// Options of sparse_attention().
struct SparseAttentionOptions {
  /// The scores' scale; 1 / sqrt(d) when unset.
  TORCH_ARG(c10::optional<double>, scale) = c10::nullopt;
  /// Dropout on the attention weights (Math only; Auto takes Math when it is positive).
  TORCH_ARG(double, dropout_p) = 0.0;
  /// Auto and Chunked take the fused CPU kernel for CPU tensors without dropout; Math (and Auto
  /// on other devices) gathers the selected keys and values in LibTorch ops, a block of queries
  /// at a time. Native is refused.
  TORCH_ARG(Backend, backend) = Backend::Auto;
};

/// softmax over the selected keys of (q · k) · scale, times their values: for batch row b, head
/// h and query t, the keys j = indices[b, t, :] of h's key/value head (-1 names none).
///
/// - query: (B, H, T, d); key: (B, H_kv, S, d); value: (B, H_kv, S, d_v), H_kv dividing H
///   (grouped heads as in scaled_dot_product_attention); one floating dtype and device.
/// - indices: (B, T, K), Long or Int, each in [-1, S). A token's indices serve all its heads, as
///   DeepSeek's lightning indexer makes them (see LightningIndexer). Causality is the indices':
///   nothing here hides a later key that an index names. A key named twice counts twice.
///
/// Returns (B, H, T, d_v). A query with no index (all -1) gets zeros. The work is T x K per head,
/// not T x S: only selected keys are read, and no T x S scores are made. Differentiable in query,
/// key and value on every route (the fused CPU backward recomputes each selected score).
///
/// Thread safety: any number of calls may run at once (inputs are only read; no shared state but
/// the process's caches).
///
/// Example:
/// \code
/// namespace F = attention::functional;
/// auto q = torch::randn({1, 4, 6, 16}), k = torch::randn({1, 4, 6, 16}),
///      v = torch::randn({1, 4, 6, 16});
/// // Token t attends to itself and to token 0 (token 0: to itself only).
/// auto indices = torch::tensor({{0, -1}, {0, 1}, {0, 2}, {0, 3}, {0, 4}, {0, 5}}).unsqueeze(0);
/// torch::Tensor out = F::sparse_attention(q, k, v, indices);  // (1, 4, 6, 16)
/// \endcode
ATTENTION_API torch::Tensor sparse_attention(const torch::Tensor& query, const torch::Tensor& key,
                                             const torch::Tensor& value,
                                             const torch::Tensor& indices,
                                             const SparseAttentionOptions& options = {});

}  // namespace functional
}  // namespace attention
