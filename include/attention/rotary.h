#pragma once

/// \file
/// Rotary position embeddings (RoPE, Su et al. 2021): each pair of a head's features is rotated
/// by an angle proportional to the token's position, so that a query-key product depends on
/// their distance only.

#include <attention/export.h>
#include <torch/arg.h>
#include <torch/types.h>

#include <c10/util/Optional.h>

#include <utility>

namespace attention {
namespace functional {

/// Which features form the rotated pairs.
enum class RotaryLayout {
  /// Feature i with feature i + rotary_dim / 2: Llama, GPT-NeoX, Qwen, Gemma (Hugging Face's
  /// `rotate_half`).
  HalfSplit,
  /// Features 2i and 2i + 1: GPT-J and Meta's original Llama code (complex multiplication).
  Interleaved,
};

/// Llama 3.1's frequency scaling (`rope_scaling` with `rope_type: "llama3"`): wavelengths longer
/// than original_context_length / low_freq_factor are divided by `factor`, those shorter than
/// original_context_length / high_freq_factor are kept, and those between blend the two.
struct Llama3RopeScaling {
  /// Scaling of the low frequencies (8 in Llama 3.1): finite and >= 1.
  TORCH_ARG(double, factor) = 8.0;
  /// Wavelengths above original_context_length / low_freq_factor are scaled (1 in Llama 3.1).
  TORCH_ARG(double, low_freq_factor) = 1.0;
  /// Wavelengths below original_context_length / high_freq_factor are kept (4 in Llama 3.1).
  TORCH_ARG(double, high_freq_factor) = 4.0;
  /// The context length the model was first trained at (8192 in Llama 3.1): 1 to INT64_MAX.
  TORCH_ARG(int64_t, original_context_length) = 8192;
};

/// YaRN's frequency scaling (Peng et al. 2023; `rope_scaling` with `rope_type: "yarn"`, OLMo 3):
/// with the wavelengths' count of turns within original_context_length, pairs that turn more
/// than beta_fast times keep their frequency, those that turn fewer than beta_slow times are
/// divided by `factor`, those between blend linearly; cos and sin are then multiplied by
/// attention_factor (so the scores by its square).
struct YarnRopeScaling {
  /// Scaling of the low frequencies: finite and >= 1.
  TORCH_ARG(double, factor) = 8.0;
  /// The context length the model was first trained at: 1 to INT64_MAX.
  TORCH_ARG(int64_t, original_context_length) = 8192;
  /// Turns above which a pair keeps its frequency (32 in YaRN and OLMo 3): finite, > beta_slow.
  TORCH_ARG(double, beta_fast) = 32.0;
  /// Turns below which a pair is scaled (1 in YaRN and OLMo 3): finite and > 0.
  TORCH_ARG(double, beta_slow) = 1.0;
  /// The factor on cos and sin; unset: 0.1 ln(factor) + 1, YaRN's (OLMo 3's configuration gives
  /// the same, 1.2079441541679836 at factor 8). Finite and > 0.
  TORCH_ARG(c10::optional<double>, attention_factor) = c10::nullopt;
};

/// Options of apply_rotary() and of MultiHeadAttentionOptions::rope.
struct RotaryOptions {
  /// The base of the frequencies, `rope_theta` in Hugging Face configurations: finite and > 1
  /// (at 1 every frequency would be 1; below 1 they would grow with the feature index).
  TORCH_ARG(double, theta) = 10000.0;
  /// How many leading features of each head are rotated (partial rotary, as GPT-NeoX's
  /// `rotary_pct` and Phi's `partial_rotary_factor`); the rest pass unchanged. 0: all of them.
  /// Must be even and at most the head size.
  TORCH_ARG(int64_t, rotary_dim) = 0;
  /// Which features form the pairs.
  TORCH_ARG(RotaryLayout, layout) = RotaryLayout::HalfSplit;
  /// How many of the rotary_dim / 2 pairs turn, counted from the first; the others keep angle 0
  /// (cos 1, sin 0: unchanged), their frequencies still counted in the exponents. Gemma 4's
  /// "proportional" rotary on its full-attention layers turns a quarter of a head's pairs with
  /// the frequencies of the whole head (rotary_dim = head size). 0: all of them; at most
  /// rotary_dim / 2.
  TORCH_ARG(int64_t, rotated_pairs) = 0;
  /// Llama 3.1's frequency scaling; unset: none.
  TORCH_ARG(c10::optional<Llama3RopeScaling>, llama3_scaling) = c10::nullopt;
  /// YaRN's frequency scaling; unset: none. Not with llama3_scaling.
  TORCH_ARG(c10::optional<YarnRopeScaling>, yarn_scaling) = c10::nullopt;
};

/// The rotation frequencies theta^(-2i / rotary_dim), i < rotary_dim / 2, after scaling: float64,
/// (rotary_dim / 2,). `rotary_dim` must be resolved (> 0).
///
/// Throws c10::ValueError for a rotary_dim that is not even and > 0, a theta that is not finite
/// and > 1, rotated_pairs outside [0, rotary_dim / 2], or a scaling outside its bounds (see
/// Llama3RopeScaling and YarnRopeScaling; both at once are refused).
ATTENTION_API torch::Tensor rotary_frequencies(const RotaryOptions& options);

/// cos and sin of the angles position x frequency, (T, rotary_dim / 2) each, computed in float64
/// (times YaRN's attention factor with yarn_scaling) and rounded once to `dtype`. `positions`: (T,)
/// integers, any int64 value; each position is converted to float64 and multiplied by its frequency
/// there, so an angle carries a relative error of about 2^-53 (absolute error grows with the
/// position: about 1e-7 radians at 2^31).
///
/// Throws c10::TypeError for non-integer positions or a `dtype` that is not floating;
/// c10::ValueError for positions that are not (T,) and for the options rotary_frequencies()
/// refuses.
ATTENTION_API std::pair<torch::Tensor, torch::Tensor> rotary_tables(const torch::Tensor& positions,
                                                                    const RotaryOptions& options,
                                                                    at::ScalarType dtype);

/// Rotates `x` (..., T, d), the queries or keys of one or more heads, by its tokens' `positions`
/// (T,) integers (e.g. `torch::arange(past, past + T)` after `past` cached tokens). The first
/// rotary_dim features of each position are rotated in pairs (see RotaryLayout); the others are
/// kept. bfloat16 and half are computed in float and rounded once. Differentiable.
///
/// Throws c10::ValueError for an odd rotary_dim, one above d, positions of the wrong shape or a
/// theta that is not finite and > 1; c10::TypeError for non-floating x or non-integer positions.
///
/// Thread safety: any number of calls may run at once (this function, rotary_tables() and
/// rotary_frequencies() compute from their arguments alone and keep nothing).
///
/// Example:
/// \code
/// namespace F = attention::functional;
/// torch::Tensor q = torch::randn({1, 8, 16, 64});  // (B, H, T, head_dim)
/// torch::Tensor positions = torch::arange(16);
/// torch::Tensor rotated = F::apply_rotary(q, positions, F::RotaryOptions().theta(500000.0));
/// \endcode
ATTENTION_API torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& positions,
                                         const RotaryOptions& options = {});

}  // namespace functional
}  // namespace attention
