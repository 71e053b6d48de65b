#include <attention/causal_self_attention.h>

#include <attention/functional.h>

#include "modules/shared.h"

namespace attention {

namespace {
constexpr const char* kCausalSelfAttentionName = "attention::CausalSelfAttention";
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const CausalSelfAttentionOptions& options_)
    : options(options_) {
  reset();
}

void CausalSelfAttentionImpl::reset() {
  TORCH_CHECK_VALUE(options.dropout() >= 0.0 && options.dropout() < 1.0, kCausalSelfAttentionName,
                    ": expected dropout in [0, 1), got ", options.dropout());
  auto w = detail::register_qkv(*this, options.d_in(), options.d_in(), options.d_out_kq(),
                                options.d_out_v(), kCausalSelfAttentionName);
  W_query = w.W_query;
  W_key = w.W_key;
  W_value = w.W_value;
}

void CausalSelfAttentionImpl::pretty_print(std::ostream& stream) const {
  stream << kCausalSelfAttentionName << "(d_in=" << options.d_in()
         << ", d_out_kq=" << options.d_out_kq() << ", d_out_v=" << options.d_out_v()
         << ", dropout=" << options.dropout() << ")";
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  detail::check_module_input(x, options.d_in(), W_query, kCausalSelfAttentionName, "input");
  // SelfAttention with the positions after each token set to -inf before the softmax
  return functional::projected_attention(
      x, x, W_query, W_key, W_value,
      functional::ScaledDotProductAttentionOptions().is_causal(true).dropout_p(
          is_training() ? options.dropout() : 0.0));
}

}  // namespace attention
