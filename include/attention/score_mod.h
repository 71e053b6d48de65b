#pragma once

/// \file
/// Score modifications: a function of the user's applied to the scaled scores, a tile at a time
/// (FlexAttention's `score_mod`, called once per tile instead of once per score), with an
/// optional derivative for training. scaled_dot_product_attention and MultiHeadAttention take one
/// (ScaledDotProductAttentionOptions::score_mod).

#include <attention/export.h>

#include <torch/types.h>

#include <cstdint>
#include <functional>

namespace attention {

/// Where a tile of scores lies: row r, column c of the tile is the score of query
/// query_begin + r and key key_begin + c of query matrix (batch, head).
struct ScoreTile {
  /// The scores' leading dims before the heads, flattened ((B, H, Tq, Tk) scores: b). 0 at rank 2
  /// and 3.
  int64_t batch = 0;
  /// The query head.
  int64_t head = 0;
  /// The index of the tile's first query (its row 0).
  int64_t query_begin = 0;
  /// The index of the tile's first key (its column 0).
  int64_t key_begin = 0;
  /// Query i sits at position i + query_offset among the keys (the causal alignment's offset:
  /// Tk - Tq bottom-right, 0 top-left), so j - (i + query_offset) is key j's relative position.
  int64_t query_offset = 0;
};

/// The modification: given a tile of scaled scores (rows x cols, of the computation's dtype:
/// float for float and bfloat16 inputs on the fused CPU kernels) and where it lies, the modified
/// tile, of the same shape. It may modify `scores` in place and return it. Called from several
/// threads at once, on tiles of any size (the Math backend passes each query matrix whole).
using ScoreFunction = std::function<torch::Tensor(const torch::Tensor& scores, const ScoreTile&)>;

/// Its derivative: given the scores the modification was applied to and the gradient of the loss
/// with respect to the modified ones, the gradient with respect to the scores (same shape; may
/// modify `grad` in place and return it). Pairs that a mask hides are asked about too, with a
/// gradient of 0; their result is not used.
using ScoreDerivative = std::function<torch::Tensor(
    const torch::Tensor& scores, const torch::Tensor& grad, const ScoreTile& tile)>;

/// A score modification, applied to the scaled scores after soft-capping and ALiBi and before the
/// relative bias and the masks, so that a hidden key stays hidden whatever the function returns.
/// Without a derivative it serves inference only: a call that needs gradients (queries, keys or
/// values requiring grad) is refused by name.
///
/// Thread safety: the library calls the function and the derivative from several threads at once
/// (the workers of one call, and every call that shares the ScoreMod) and takes no lock around
/// them: what they touch besides their arguments must be safe for that (read-only captures are).
///
/// Example:
/// \code
/// // Scores divided by a per-head temperature, with its derivative.
/// const auto temperature = torch::tensor({1.0f, 2.0f});
/// attention::ScoreMod cooled(
///     [=](const torch::Tensor& s, const attention::ScoreTile& t) {
///       return s.div_(temperature[t.head].item<float>());
///     },
///     [=](const torch::Tensor&, const torch::Tensor& g, const attention::ScoreTile& t) {
///       return g.div_(temperature[t.head].item<float>());
///     });
/// auto q = torch::randn({1, 2, 512, 64}, torch::requires_grad());
/// auto out = attention::functional::scaled_dot_product_attention(
///     q, q, q, attention::functional::ScaledDotProductAttentionOptions().score_mod(cooled));
/// out.output.sum().backward();
/// \endcode
class ATTENTION_API ScoreMod {
 public:
  /// Throws c10::ValueError when `function` is empty.
  explicit ScoreMod(ScoreFunction function, ScoreDerivative derivative = nullptr);

  /// The modification.
  const ScoreFunction& function() const { return function_; }
  /// Its derivative; empty when none was given.
  const ScoreDerivative& derivative() const { return derivative_; }
  /// Whether a derivative was given: training is possible.
  bool differentiable() const { return static_cast<bool>(derivative_); }

  /// Applies the function to `scores` (a rows x cols floating tile, written in place with the
  /// result). Throws c10::ValueError for another tile or a null `caller`, and c10::Error naming
  /// `caller` and the tile when the function throws or returns anything but a tensor of the tile's
  /// shape; `scores` may then be half written.
  void apply(const torch::Tensor& scores, const ScoreTile& tile, const char* caller) const;

  /// Applies the derivative: `grad` (the gradient with respect to the modified scores) becomes
  /// the gradient with respect to `scores`. Errors as apply(), and c10::ValueError for a `grad`
  /// of another shape or dtype than `scores`.
  void apply_derivative(const torch::Tensor& scores, const torch::Tensor& grad,
                        const ScoreTile& tile, const char* caller) const;

 private:
  ScoreFunction function_;
  ScoreDerivative derivative_;
};

}  // namespace attention
