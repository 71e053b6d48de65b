#include <attention/cross_attention.h>

#include <attention/functional.h>

#include "modules/shared.h"

namespace attention {

namespace {
constexpr const char* kCrossAttentionName = "attention::CrossAttention";
}

CrossAttentionImpl::CrossAttentionImpl(const CrossAttentionOptions& options_) : options(options_) {
  reset();
}

void CrossAttentionImpl::reset() {
  auto w = detail::register_qkv(*this, options.d_in(), options.d_in_kv(), options.d_out_kq(),
                                options.d_out_v(), kCrossAttentionName);
  W_query = w.W_query;
  W_key = w.W_key;
  W_value = w.W_value;
}

void CrossAttentionImpl::pretty_print(std::ostream& stream) const {
  stream << kCrossAttentionName << "(d_in=" << options.d_in() << ", d_out_kq=" << options.d_out_kq()
         << ", d_out_v=" << options.d_out_v() << ", d_in_kv=" << options.d_in_kv() << ")";
}

torch::Tensor CrossAttentionImpl::forward(const torch::Tensor& x_1, const torch::Tensor& x_2) {
  detail::check_module_input(x_1, options.d_in(), W_query, kCrossAttentionName, "x_1");
  detail::check_module_input(x_2, options.d_in_kv(), W_key, kCrossAttentionName, "x_2");
  detail::check_same_batch(x_1, x_2, kCrossAttentionName, "x_1", "x_2");
  // queries from x_1, keys and values from x_2
  return functional::projected_attention(x_1, x_2, W_query, W_key, W_value);
}

}  // namespace attention
