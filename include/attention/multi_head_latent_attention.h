#pragma once

/// \file
/// Multi-head latent attention (DeepSeek V2 and V3): keys and values made from one small latent
/// vector per token, which is all the cache keeps.

#include <attention/export.h>
#include <attention/functional.h>
#include <attention/latent_cache.h>
#include <attention/rms_norm.h>

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <ostream>

namespace attention {

/// Options of MultiHeadLatentAttention.
struct MultiHeadLatentAttentionOptions {
  /// The three sizes; latent_dim starts at the book's default, max(16, d_out / 8).
  MultiHeadLatentAttentionOptions(int64_t d_in, int64_t d_out, int64_t num_heads)
      : d_in_(d_in), d_out_(d_out), num_heads_(num_heads), latent_dim_(default_latent_dim(d_out)) {}
  /// Feature size of the input x.
  TORCH_ARG(int64_t, d_in);
  /// Feature size of the output; a multiple of num_heads (head_dim = d_out / num_heads).
  TORCH_ARG(int64_t, d_out);
  /// Number of heads.
  TORCH_ARG(int64_t, num_heads);
  /// Size of each token's latent vector, what the cache keeps (DeepSeek's kv_lora_rank).
  TORCH_ARG(int64_t, latent_dim);
  /// Bias in W_query, W_DKV, W_UK and W_UV (out_proj always has one, as in the book).
  TORCH_ARG(bool, qkv_bias) = false;
  /// Dropout on the attention weights, in training mode only.
  TORCH_ARG(double, dropout) = 0.0;
  /// The kernel of the attention (see functional::scaled_dot_product_attention).
  TORCH_ARG(functional::Backend, backend) = functional::Backend::Auto;

  /// DeepSeek's decoupled rotary part (DeepSeek-V2's qk_rope_head_dim; 0, the book's: none).
  /// Each head's queries get rope_dim more features (`W_QR`), every token one rope_dim key for
  /// all heads (`W_KR`), both rotated by position (RoPE, half-split pairs); the cache keeps that
  /// key beside the latent. Scores are scaled by 1 / sqrt(head_dim + rope_dim). Even, >= 0.
  TORCH_ARG(int64_t, rope_dim) = 0;
  /// The base of the rotary part's frequencies: finite and > 1.
  TORCH_ARG(double, rope_theta) = 10000.0;
  /// DeepSeek's compressed queries (q_lora_rank; 0, the book's: none): the queries come from a
  /// latent of their own, x -> `W_DQ` -> q_latent_dim features -> `W_UQ` (and `W_QR`), in place
  /// of `W_query`. >= 0.
  TORCH_ARG(int64_t, q_latent_dim) = 0;
  /// An RMSNorm (eps 1e-6) on each latent before its up-projections, as DeepSeek's released
  /// models have (`kv_norm`; `q_norm` with q_latent_dim); the cache keeps the normalized latent.
  TORCH_ARG(bool, latent_norm) = false;

  /// The book's latent size for `d_out` when none is given: max(16, d_out / 8).
  static int64_t default_latent_dim(int64_t d_out) { return d_out / 8 > 16 ? d_out / 8 : 16; }
};

/// Multi-head latent attention as in the bonus material of Raschka's book (chapter 4,
/// `MultiHeadLatentAttention`): each token's input is projected down to a latent vector c
/// (`W_DKV`), and every head's keys and values are projections of it (`W_UK`, `W_UV`). Causal;
/// the queries have their own projection (`W_query`), the heads' outputs go through `out_proj`.
///
/// Submodules `W_query` (d_in -> d_out), `W_DKV` (d_in -> latent_dim), `W_UK` and `W_UV`
/// (latent_dim -> d_out) and `out_proj` (d_out -> d_out, with bias), created in that order with
/// LibTorch's Linear initialization: the same seed gives the book's weights, and its files load by
/// name.
///
/// DeepSeek-V2's full form, as its paper writes it, with options the book's class lacks: the
/// decoupled rotary part (`rope_dim`: `W_QR`, d_in or q_latent_dim -> num_heads x rope_dim, made
/// after the queries' projections, and `W_KR`, d_in -> rope_dim, made after W_DKV), compressed
/// queries (`q_latent_dim`: `W_DQ`, d_in -> q_latent_dim, and `W_UQ`, q_latent_dim -> d_out, in
/// W_query's place), and an RMSNorm on each latent (`latent_norm`: `kv_norm`, `q_norm`).
///
/// Two forms of one computation:
/// - Without a cache, as the book writes it: keys and values up-projected from the latent of
///   every token, then causal attention per head.
/// - With a LatentCache (decoding), absorbed: head h's key projection moves into its query
///   (q_h W_UK_h, latent_dim features) and its value projection behind the attention, so every
///   head attends straight to the cached latent, one key and value "head" shared by all heads
///   (multi-query attention of width latent_dim). A step reads each cached latent once and
///   up-projects nothing. W_UK's bias adds the same q_h . b to every score of a query, which the
///   softmax cancels; W_UV's bias is added after, since the weights sum to 1.
///
/// Input (B, T, d_in) or (T, d_in); output of the same rank with d_out features.
///
/// Thread safety: forward() keeps nothing in the module, so one instance may serve several
/// threads at once, each with its own LatentCache; eval(), train(), to(), reset() and
/// load_weights() need the module to themselves (docs/THREADS.md).
///
/// Example:
/// \code
/// attention::MultiHeadLatentAttention mla(
///     attention::MultiHeadLatentAttentionOptions(/*d_in=*/64, /*d_out=*/64, /*num_heads=*/4)
///         .latent_dim(16));
/// torch::Tensor x = torch::randn({2, 10, 64});
/// torch::Tensor y = mla(x);  // (2, 10, 64)
///
/// // Decoding: the cache keeps 16 numbers per token, where MHA's would keep 2 x 64.
/// attention::LatentCache cache(/*max_length=*/10);
/// torch::Tensor prompt = mla(x.slice(1, 0, 9), &cache);    // the first nine tokens
/// torch::Tensor last = mla(x.slice(1, 9, 10), &cache);     // y's last token, within rounding
/// \endcode
class ATTENTION_API MultiHeadLatentAttentionImpl
    : public torch::nn::Cloneable<MultiHeadLatentAttentionImpl> {
 public:
  /// Builds the module from its sizes; see the class for parameters and initialization.
  MultiHeadLatentAttentionImpl(int64_t d_in, int64_t d_out, int64_t num_heads)
      : MultiHeadLatentAttentionImpl(MultiHeadLatentAttentionOptions(d_in, d_out, num_heads)) {}
  /// Builds the module from options.
  explicit MultiHeadLatentAttentionImpl(const MultiHeadLatentAttentionOptions& options_);

  /// (Re)creates the parameters from the options, initialized as described above.
  void reset() override;
  /// Prints the module's name and options.
  void pretty_print(std::ostream& stream) const override;

  /// Causal attention of x's tokens, after the cache's when one is given (whose latent they join;
  /// with rope_dim each cached row is the latent and then the rotary key, latent_dim + rope_dim
  /// features, and x's positions go on from the cache's length). Throws c10::ValueError for a wrong
  /// shape and c10::TypeError for a wrong dtype of x, c10::Error for another device, and the
  /// cache's errors for a latent it refuses (before it changes).
  torch::Tensor forward(const torch::Tensor& x, LatentCache* cache = nullptr);

  /// Size of each head's queries, keys and values: d_out / num_heads.
  int64_t head_dim() const { return options.d_out() / options.num_heads(); }

  /// The options the module was built with.
  MultiHeadLatentAttentionOptions options;
  /// Query projection, d_in -> d_out.
  torch::nn::Linear W_query{nullptr};
  /// Down-projection to the latent, d_in -> latent_dim.
  torch::nn::Linear W_DKV{nullptr};
  /// Key up-projection, latent_dim -> d_out.
  torch::nn::Linear W_UK{nullptr};
  /// Value up-projection, latent_dim -> d_out.
  torch::nn::Linear W_UV{nullptr};
  /// Output projection, d_out -> d_out.
  torch::nn::Linear out_proj{nullptr};
  /// Query down-projection, d_in -> q_latent_dim (with q_latent_dim; W_query is empty then).
  torch::nn::Linear W_DQ{nullptr};
  /// Query up-projection, q_latent_dim -> d_out (with q_latent_dim).
  torch::nn::Linear W_UQ{nullptr};
  /// Rotary queries, d_in (or q_latent_dim) -> num_heads x rope_dim (with rope_dim).
  torch::nn::Linear W_QR{nullptr};
  /// Rotary key shared by the heads, d_in -> rope_dim (with rope_dim).
  torch::nn::Linear W_KR{nullptr};
  /// RMSNorm of the query latent (with latent_norm and q_latent_dim).
  RMSNorm q_norm{nullptr};
  /// RMSNorm of the key/value latent (with latent_norm).
  RMSNorm kv_norm{nullptr};

 private:
  /// The book's form: (B, H, T, head_dim) queries (and their rotary part, (B, H, T, rope_dim),
  /// undefined without one) against keys and values of every cached row, (B, Tk, latent_dim +
  /// rope_dim): the latent, then the rotary key.
  torch::Tensor attend_expanded(const torch::Tensor& queries, const torch::Tensor& rotary_queries,
                                const torch::Tensor& cached);
  /// The absorbed form over the same rows; the same result.
  torch::Tensor attend_absorbed(const torch::Tensor& queries, const torch::Tensor& rotary_queries,
                                const torch::Tensor& cached);
  /// The attention options: causal, the backend, dropout in training.
  functional::ScaledDotProductAttentionOptions attention_options() const;
};

TORCH_MODULE(MultiHeadLatentAttention);

}  // namespace attention
