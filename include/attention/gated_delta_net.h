#pragma once

/// \file
/// Gated DeltaNet (Qwen3-Next, Kimi Linear): linear attention whose memory is a d x d state per
/// head, updated by the gated delta rule.

#include <attention/export.h>
#include <attention/functional.h>
#include <attention/gated_delta_rule.h>
#include <attention/rms_norm.h>

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <ostream>

namespace attention {

/// Options of GatedDeltaNet.
struct GatedDeltaNetOptions {
  /// The three sizes.
  GatedDeltaNetOptions(int64_t d_in, int64_t d_out, int64_t num_heads)
      : d_in_(d_in), d_out_(d_out), num_heads_(num_heads) {}
  /// Feature size of the input x.
  TORCH_ARG(int64_t, d_in);
  /// Feature size of the output; a multiple of num_heads (head_dim = d_out / num_heads).
  TORCH_ARG(int64_t, d_out);
  /// Number of heads, each with a head_dim x head_dim state.
  TORCH_ARG(int64_t, num_heads);
  /// Bias in W_query, W_key and W_value (the gates have none; out_proj always has one).
  TORCH_ARG(bool, qkv_bias) = false;
  /// Dropout on the normalized, gated context before out_proj, in training mode only.
  TORCH_ARG(double, dropout) = 0.0;
  /// The delta rule's kernel (see functional::gated_delta_rule).
  TORCH_ARG(functional::Backend, backend) = functional::Backend::Auto;
};

/// The state a GatedDeltaNet carries from call to call while decoding: one head_dim x head_dim
/// matrix per batch row and head, whatever the number of tokens seen. Empty until the first call
/// that uses it; a refused call leaves it as it was.
///
/// Thread safety: none inside. One thread at a time uses a state (forward() replaces its tensor);
/// state() returns a reference to it, so copy the tensor to read it on another thread.
///
/// Example:
/// \code
/// attention::GatedDeltaNet net(64, 64, 4);
/// attention::GatedDeltaNetState state;
/// torch::Tensor y = net(torch::randn({1, 10, 64}), &state);  // state.state(): (1, 4, 16, 16)
/// y = net(torch::randn({1, 1, 64}), &state);                  // goes on from token 10
/// \endcode
class GatedDeltaNetState {
 public:
  /// The state, (B, H, head_dim, head_dim); undefined before the first call.
  const torch::Tensor& state() const { return state_; }
  /// Number of tokens the state has seen.
  int64_t length() const { return length_; }
  /// Forgets every token: the next call starts from zeros.
  void reset() {
    state_ = torch::Tensor();
    length_ = 0;
  }
  /// Bytes of the state of one batch row (all heads); 0 before the first call. Constant in the
  /// number of tokens, where a KV cache grows with each one.
  int64_t bytes_per_sequence() const {
    return state_.defined() ? state_[0].numel() * static_cast<int64_t>(state_.element_size()) : 0;
  }

 private:
  friend class GatedDeltaNetImpl;
  torch::Tensor state_;
  int64_t length_ = 0;
};

/// Gated DeltaNet as in the bonus material of Raschka's book (chapter 4, `08_deltanet`, the
/// book's simplified form without the short convolutions):
/// 1. queries, keys and values per head (W_query, W_key, W_value); queries and keys L2-normalized
///    (eps 1e-6), queries scaled by 1 / sqrt(head_dim);
/// 2. the update gate beta = sigmoid(W_beta x), one per value feature, and the decay
///    log_decay = -exp(A_log) softplus(W_alpha x + dt_bias), one per head;
/// 3. the gated delta rule over the tokens (functional::gated_delta_rule): no T x T scores;
/// 4. each head's output RMS-normalized (`norm`, over head_dim, eps 1e-6), times SiLU(W_gate x),
///    then dropout and out_proj.
///
/// Parameters, created in the book's order with LibTorch's initialization (the same seed gives
/// the book's weights, and its state dicts load by name): `W_query`, `W_key`, `W_value` (d_in ->
/// d_out), `W_gate`, `W_beta` (d_in -> d_out, no bias), `W_alpha` (d_in -> num_heads, no bias),
/// `dt_bias` (ones), `A_log` (log of U(0, 16), as the book since its commit 7d92267),
/// `norm.weight` (ones), `out_proj` (d_out -> d_out).
///
/// Input (B, T, d_in) or (T, d_in); output of the same rank with d_out features. Causal by
/// construction: a token's output depends on the tokens before it only.
///
/// Thread safety: forward() keeps nothing in the module, so one instance may serve several
/// threads at once, each with its own GatedDeltaNetState; eval(), train(), to(), reset() and
/// load_weights() need the module to themselves (docs/THREADS.md).
///
/// Example:
/// \code
/// attention::GatedDeltaNet net(attention::GatedDeltaNetOptions(/*d_in=*/64, /*d_out=*/64,
///                                                              /*num_heads=*/4));
/// torch::Tensor x = torch::randn({2, 10, 64});
/// torch::Tensor y = net(x);  // (2, 10, 64)
///
/// // Decoding: the state holds 4 x 16 x 16 numbers per sequence, for any length.
/// attention::GatedDeltaNetState state;
/// torch::Tensor first = net(x.slice(1, 0, 9), &state);
/// torch::Tensor last = net(x.slice(1, 9, 10), &state);  // y's last token, within rounding
/// \endcode
class ATTENTION_API GatedDeltaNetImpl : public torch::nn::Cloneable<GatedDeltaNetImpl> {
 public:
  /// Builds the module from its sizes; see the class for parameters and initialization.
  GatedDeltaNetImpl(int64_t d_in, int64_t d_out, int64_t num_heads)
      : GatedDeltaNetImpl(GatedDeltaNetOptions(d_in, d_out, num_heads)) {}
  /// Builds the module from options.
  explicit GatedDeltaNetImpl(const GatedDeltaNetOptions& options_);

  /// (Re)creates the parameters from the options, initialized as described above.
  void reset() override;
  /// Prints the module's name and options.
  void pretty_print(std::ostream& stream) const override;

  /// x's tokens after those `state` has seen, when one is given (which then moves past them).
  /// Throws c10::ValueError for a wrong shape of x or a state of another batch size,
  /// c10::TypeError for a wrong dtype and c10::Error for another device.
  torch::Tensor forward(const torch::Tensor& x, GatedDeltaNetState* state = nullptr);

  /// Size of each head's queries, keys and values: d_out / num_heads.
  int64_t head_dim() const { return options.d_out() / options.num_heads(); }

  /// The options the module was built with.
  GatedDeltaNetOptions options;
  /// Query projection, d_in -> d_out.
  torch::nn::Linear W_query{nullptr};
  /// Key projection, d_in -> d_out.
  torch::nn::Linear W_key{nullptr};
  /// Value projection, d_in -> d_out.
  torch::nn::Linear W_value{nullptr};
  /// Output gate, d_in -> d_out (SiLU).
  torch::nn::Linear W_gate{nullptr};
  /// Update gate, d_in -> d_out (sigmoid).
  torch::nn::Linear W_beta{nullptr};
  /// Decay gate, d_in -> num_heads.
  torch::nn::Linear W_alpha{nullptr};
  /// The decay gate's bias (num_heads), before the softplus.
  torch::Tensor dt_bias;
  /// Log of each head's decay rate (num_heads).
  torch::Tensor A_log;
  /// RMS normalization of each head's output, over head_dim.
  RMSNorm norm{nullptr};
  /// Output projection, d_out -> d_out.
  torch::nn::Linear out_proj{nullptr};
};

TORCH_MODULE(GatedDeltaNet);

}  // namespace attention
