#pragma once

/// \file
/// Relative position biases: a learned table of one bias per relative position bucket and query
/// head, added to the scaled scores (T5's relative attention bias). The buckets a table is
/// indexed by are described here; scaled_dot_product_attention takes the table
/// (ScaledDotProductAttentionOptions::relative_bias) and differentiates it.

#include <attention/export.h>

#include <torch/types.h>

#include <cstdint>

namespace attention {
namespace functional {

/// How the relative position r = j - pos(i) of key j to the query at position pos(i) picks a
/// row of a relative position bias table (num_buckets(), H).
///
/// Example:
/// \code
/// namespace F = attention::functional;
/// const auto buckets = F::RelativeBuckets::t5(32, 128);  // T5's encoder
/// torch::Tensor table = torch::zeros({buckets.num_buckets(), 8}, torch::requires_grad());
/// auto q = torch::randn({1, 8, 300, 64}), k = torch::randn_like(q);
/// auto out = F::scaled_dot_product_attention(
///     q, k, k,
///     F::ScaledDotProductAttentionOptions().relative_bias(table).relative_buckets(buckets));
/// out.output.sum().backward();  // table.grad(): the gradient of each bucket's bias
/// \endcode
struct ATTENTION_API RelativeBuckets {
  /// Which bucket function.
  enum class Kind {
    /// T5's buckets (`_relative_position_bucket` of T5 and of Hugging Face's T5Attention): exact
    /// for distances below half the buckets of a direction, logarithmic up to max_distance,
    /// the last bucket beyond; with `bidirectional` half the buckets for keys after the query.
    T5,
    /// One bucket per relative position in [-max_distance, max_distance], the ends taking
    /// everything beyond: 2 max_distance + 1 buckets, r + max_distance the bucket of r.
    Distance,
  };

  /// T5's buckets. Throws c10::ValueError unless num_buckets >= 4 (bidirectional) or >= 2 and
  /// max_distance is above the exact range (num_buckets / 4 or / 2) and at most 2^30.
  static RelativeBuckets t5(int64_t num_buckets = 32, int64_t max_distance = 128,
                            bool bidirectional = true);
  /// One bucket per relative position up to max_distance either way. Throws c10::ValueError
  /// unless 0 <= max_distance <= 2^30.
  static RelativeBuckets distance(int64_t max_distance);

  /// The rows of a table for these buckets.
  int64_t num_buckets() const { return buckets; }

  /// The bucket of every relative position in `relative` (int64, any shape), as T5 computes it
  /// (the logarithm in float32 with LibTorch's own ops, so that a position on a bucket's edge
  /// falls where Python puts it).
  torch::Tensor bucket(const torch::Tensor& relative) const;

  /// The bucket function (made by t5() or distance(), which check the values below).
  Kind kind = Kind::T5;
  /// The table's rows.
  int64_t buckets = 32;
  /// T5: where the logarithmic buckets end; Distance: the farthest distance with its own bucket.
  int64_t max_distance = 128;
  /// T5 only: keys before and after the query have buckets of their own.
  bool bidirectional = true;
};

}  // namespace functional
}  // namespace attention
