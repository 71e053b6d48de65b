#pragma once

/// \file
/// The gated delta rule (Gated DeltaNet's linear attention): a d_k x d_v state per head in place
/// of T x T scores.

#include <attention/export.h>
#include <attention/functional.h>

#include <torch/arg.h>
#include <torch/types.h>

namespace attention {
namespace functional {

/// Options of gated_delta_rule().
struct GatedDeltaRuleOptions {
  /// The state before the first token, (B, H, d_k, d_v): the `state` of an earlier call, to go on
  /// where it stopped. Undefined (the default) starts from zeros.
  TORCH_ARG(torch::Tensor, initial_state) = {};
  /// Auto and Chunked take the fused CPU kernel for CPU tensors; Math (and Auto on other
  /// devices) runs the recurrence token by token in LibTorch ops, as the book writes it. Native
  /// has no such kernel and is refused.
  TORCH_ARG(Backend, backend) = Backend::Auto;
};

/// What gated_delta_rule() returns.
struct GatedDeltaRuleOutput {
  /// The output y, (B, H, T, d_v).
  torch::Tensor output;
  /// The state after the last token, (B, H, d_k, d_v): the next call's initial_state.
  torch::Tensor state;
};

/// The gated delta rule of Gated DeltaNet (Yang et al. 2024; Qwen3-Next, Kimi Linear), as the
/// bonus material of Raschka's book writes it (chapter 4, `08_deltanet`). For each batch row and
/// head, token after token, with S the d_k x d_v state:
///
///     S <- exp(log_decay_t) S
///     u_t = beta_t * (v_t - Sᵀ k_t)      (the delta: what S does not yet recall of v_t)
///     S <- S + k_t u_tᵀ
///     y_t = Sᵀ q_t
///
/// Memory is constant in T and the work linear: there are no T x T scores. Queries and keys are
/// used as given; Gated DeltaNet normalizes them first (see GatedDeltaNet).
///
/// Arguments, all of one floating dtype (Float, Double or BFloat16 on the CPU) and device:
/// - query, key: (B, H, T, d_k)
/// - value: (B, H, T, d_v)
/// - log_decay: (B, H, T), the log of each token's decay (<= 0 keeps the state bounded)
/// - beta: (B, H, T, d_v), the update gate per value feature as the book has it, or (B, H, T),
///   one per token and head as in the paper
///
/// The fused CPU kernel keeps each head's state in a buffer of its own (BFloat16 computed in
/// float) and is differentiable: its backward runs the recurrence in reverse from a checkpoint of
/// the state every 64 tokens (fewer for states over 32 KiB), so training stores about one more
/// query's worth of memory, not T states. Any split of the tokens into calls, each given the
/// previous call's state, equals one call.
///
/// Thread safety: any number of calls may run at once; the inputs, initial_state included, are
/// only read.
///
/// Example:
/// \code
/// namespace F = attention::functional;
/// auto q = torch::nn::functional::normalize(torch::randn({2, 4, 16, 32}),
///                                           torch::nn::functional::NormalizeFuncOptions().dim(-1));
/// auto k = torch::nn::functional::normalize(torch::randn({2, 4, 16, 32}),
///                                           torch::nn::functional::NormalizeFuncOptions().dim(-1));
/// auto v = torch::randn({2, 4, 16, 32});
/// auto log_decay = -torch::rand({2, 4, 16});
/// auto beta = torch::rand({2, 4, 16});
/// F::GatedDeltaRuleOutput all = F::gated_delta_rule(q, k, v, log_decay, beta);
///
/// // The same in two calls: the second starts from the first one's state.
/// auto first = F::gated_delta_rule(q.narrow(2, 0, 10), k.narrow(2, 0, 10), v.narrow(2, 0, 10),
///                                  log_decay.narrow(2, 0, 10), beta.narrow(2, 0, 10));
/// auto rest = F::gated_delta_rule(q.narrow(2, 10, 6), k.narrow(2, 10, 6), v.narrow(2, 10, 6),
///                                 log_decay.narrow(2, 10, 6), beta.narrow(2, 10, 6),
///                                 F::GatedDeltaRuleOptions().initial_state(first.state));
/// \endcode
ATTENTION_API GatedDeltaRuleOutput gated_delta_rule(const torch::Tensor& query,
                                                    const torch::Tensor& key,
                                                    const torch::Tensor& value,
                                                    const torch::Tensor& log_decay,
                                                    const torch::Tensor& beta,
                                                    const GatedDeltaRuleOptions& options = {});

}  // namespace functional
}  // namespace attention
