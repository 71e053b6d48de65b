#include <attention/score_mod.h>

#include "checks.h"

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <exception>
#include <sstream>
#include <string>
#include <utility>

namespace attention {
namespace {

std::string tile_failed(const char* caller, const char* which, const torch::Tensor& scores,
                        const ScoreTile& tile, const std::string& what) {
  std::ostringstream message;
  message << caller << ": the score_mod " << which << " failed on the tile of batch " << tile.batch
          << ", head " << tile.head << ", queries [" << tile.query_begin << ", "
          << tile.query_begin + scores.size(0) << ") and keys [" << tile.key_begin << ", "
          << tile.key_begin + scores.size(1) << "): " << what;
  return message.str();
}

// Calls `compute` (the function or the derivative) and writes what it returns over `target`.
// The user's code runs without autograd: a tensor it captures that requires grad (a learned
// parameter) records nothing here.
template <typename Compute>
void write_result(const Compute& compute, const torch::Tensor& target,
                  const torch::Tensor& shape_of, const ScoreTile& tile, const char* caller,
                  const char* which) {
  torch::Tensor result;
  try {
    torch::NoGradGuard no_grad;
    result = compute();
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, tile_failed(caller, which, shape_of, tile, e.msg()));
  } catch (const std::exception& e) {
    TORCH_CHECK(false, tile_failed(caller, which, shape_of, tile, e.what()));
  } catch (...) {
    // Whatever the user's code throws leaves as the documented c10::Error.
    TORCH_CHECK(false, tile_failed(caller, which, shape_of, tile,
                                   "an exception of a type not derived from std::exception"));
  }
  TORCH_CHECK(
      result.defined() && result.is_floating_point() && result.sizes() == target.sizes(),
      tile_failed(caller, which, shape_of, tile,
                  "expected a floating tensor of the tile's shape " +
                      detail::shape_str(target.sizes()) + ", got " +
                      (result.defined() ? std::string(c10::toString(result.scalar_type())) +
                                              " of shape " + detail::shape_str(result.sizes())
                                        : std::string("an undefined tensor"))));
  if (result.data_ptr() == target.data_ptr() && result.strides() == target.strides() &&
      result.scalar_type() == target.scalar_type()) {
    return;  // modified in place
  }
  target.copy_(result);
}

constexpr const char* kScoreModName = "attention::ScoreMod";

// What apply() and apply_derivative() take: a caller to name, a 2-D floating tile of scores and,
// for the derivative, a gradient of its shape.
void check_tile(const torch::Tensor& scores, const torch::Tensor* grad, const char* caller) {
  TORCH_CHECK_VALUE(caller != nullptr, kScoreModName,
                    ": expected the caller's name to put in messages, got a null pointer");
  TORCH_CHECK_VALUE(scores.defined() && scores.dim() == 2 && scores.is_floating_point(), caller,
                    ": expected a score_mod's tile of scores (rows, cols) floating, got ",
                    scores.defined() ? std::string(c10::toString(scores.scalar_type())) + " " +
                                           detail::shape_str(scores.sizes())
                                     : std::string("an undefined tensor"));
  if (grad == nullptr) return;
  TORCH_CHECK_VALUE(
      grad->defined() && grad->sizes() == scores.sizes() &&
          grad->scalar_type() == scores.scalar_type(),
      caller, ": expected a score_mod's gradient of the scores' shape ",
      detail::shape_str(scores.sizes()), " and dtype ", scores.scalar_type(), ", got ",
      grad->defined()
          ? std::string(c10::toString(grad->scalar_type())) + " " + detail::shape_str(grad->sizes())
          : std::string("an undefined tensor"));
}

}  // namespace

ScoreMod::ScoreMod(ScoreFunction function, ScoreDerivative derivative)
    : function_(std::move(function)), derivative_(std::move(derivative)) {
  TORCH_CHECK_VALUE(static_cast<bool>(function_),
                    "attention::ScoreMod: expected a score function, got an empty std::function");
}

void ScoreMod::apply(const torch::Tensor& scores, const ScoreTile& tile, const char* caller) const {
  check_tile(scores, nullptr, caller);
  write_result([&] { return function_(scores, tile); }, scores, scores, tile, caller, "function");
}

void ScoreMod::apply_derivative(const torch::Tensor& scores, const torch::Tensor& grad,
                                const ScoreTile& tile, const char* caller) const {
  check_tile(scores, &grad, caller);
  TORCH_CHECK(differentiable(), caller, ": the score_mod has no derivative");
  write_result([&] { return derivative_(scores, grad, tile); }, grad, scores, tile, caller,
               "derivative");
}

}  // namespace attention
