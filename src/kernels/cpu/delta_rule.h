#pragma once

// The gated delta rule on the CPU (functional::gated_delta_rule's fused route): one pass over the
// tokens per (batch, head) row with the row's d_k x d_v state kept in a buffer of its own, and a
// backward that runs the recurrence in reverse.
//
// Per token t of a row:
//   S <- exp(a_t) S;   u_t = beta_t * (v_t - Sᵀ k_t);   S <- S + k_t u_tᵀ;   y_t = Sᵀ q_t
//
// The backward needs each token's state before its update. Keeping all of them would cost T x
// d_k x d_v; instead the forward keeps the state at the start of every `interval` tokens (a
// checkpoint), and the backward replays one interval at a time from its checkpoint, newest
// first, so its workspace is one interval of states per thread.

#include <torch/types.h>

namespace attention {
namespace kernels {
namespace cpu {

/// What the forward returns. The inputs are float or double, contiguous, of rows R = B x H:
/// q, k (R, T, d_k); v, beta (R, T, d_v); log_decay (R, T); initial state (R, d_k, d_v).
struct DeltaRuleForward {
  /// y, (R, T, d_v).
  torch::Tensor output;
  /// The state after the last token, (R, d_k, d_v).
  torch::Tensor state;
  /// The state before tokens 0, interval, 2 interval, ...: (R, ceil(T / interval), d_k, d_v);
  /// undefined unless asked for.
  torch::Tensor checkpoints;
  /// Tokens between checkpoints.
  int64_t interval = 1;
};

/// The recurrence over every token; `checkpoints` asks for what the backward needs.
DeltaRuleForward delta_rule_forward(const torch::Tensor& q, const torch::Tensor& k,
                                    const torch::Tensor& v, const torch::Tensor& log_decay,
                                    const torch::Tensor& beta, const torch::Tensor& initial_state,
                                    bool checkpoints);

/// Gradients of the inputs, in the order q, k, v, log_decay, beta, initial state.
struct DeltaRuleGradients {
  torch::Tensor q, k, v, log_decay, beta, initial_state;
};

/// The backward from the gradients of the output (R, T, d_v) and of the final state (R, d_k, d_v;
/// undefined for none), with the forward's inputs and checkpoints.
DeltaRuleGradients delta_rule_backward(const torch::Tensor& grad_output,
                                       const torch::Tensor& grad_state, const torch::Tensor& q,
                                       const torch::Tensor& k, const torch::Tensor& v,
                                       const torch::Tensor& log_decay, const torch::Tensor& beta,
                                       const DeltaRuleForward& forward);

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
