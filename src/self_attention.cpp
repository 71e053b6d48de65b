#include <attention/self_attention.h>

#include <attention/functional.h>

#include "detail.h"

namespace attention {

namespace {
constexpr const char* kName = "attention::SelfAttention";
}

SelfAttentionImpl::SelfAttentionImpl(const SelfAttentionOptions& options_) : options(options_) {
  reset();
}

void SelfAttentionImpl::reset() {
  auto w = detail::register_qkv(*this, options.d_in(), options.d_in(), options.d_out_kq(),
                                options.d_out_v(), kName);
  W_query = w.W_query;
  W_key = w.W_key;
  W_value = w.W_value;
}

void SelfAttentionImpl::pretty_print(std::ostream& stream) const {
  stream << kName << "(d_in=" << options.d_in() << ", d_out_kq=" << options.d_out_kq()
         << ", d_out_v=" << options.d_out_v() << ")";
}

torch::Tensor SelfAttentionImpl::forward(const torch::Tensor& x) {
  detail::check_module_input(x, options.d_in(), W_query, kName, "input");
  auto keys = x.matmul(W_key);
  auto queries = x.matmul(W_query);
  auto values = x.matmul(W_value);
  return functional::scaled_dot_product_attention(queries, keys, values).output;
}

}  // namespace attention
