#include <attention/self_attention.h>

#include <attention/functional.h>

#include "modules/shared.h"

namespace attention {

namespace {
constexpr const char* kSelfAttentionName = "attention::SelfAttention";
}

SelfAttentionImpl::SelfAttentionImpl(const SelfAttentionOptions& options_) : options(options_) {
  reset();
}

void SelfAttentionImpl::reset() {
  auto w = detail::register_qkv(*this, options.d_in(), options.d_in(), options.d_out_kq(),
                                options.d_out_v(), kSelfAttentionName);
  W_query = w.W_query;
  W_key = w.W_key;
  W_value = w.W_value;
}

void SelfAttentionImpl::pretty_print(std::ostream& stream) const {
  stream << kSelfAttentionName << "(d_in=" << options.d_in() << ", d_out_kq=" << options.d_out_kq()
         << ", d_out_v=" << options.d_out_v() << ")";
}

torch::Tensor SelfAttentionImpl::forward(const torch::Tensor& x) {
  detail::check_module_input(x, options.d_in(), W_query, kSelfAttentionName, "input");
  // keys = x W_key, queries = x W_query, values = x W_value; softmax(Q Kᵀ / sqrt(d_out_kq)) V
  return functional::projected_attention(x, x, W_query, W_key, W_value);
}

}  // namespace attention
