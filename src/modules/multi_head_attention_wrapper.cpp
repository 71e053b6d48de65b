#include <attention/multi_head_attention_wrapper.h>

#include "modules/shared.h"

#include <vector>

namespace attention {

namespace {
constexpr const char* kWrapperName = "attention::MultiHeadAttentionWrapper";
}

MultiHeadAttentionWrapperImpl::MultiHeadAttentionWrapperImpl(
    const MultiHeadAttentionWrapperOptions& options_)
    : options(options_) {
  reset();
}

void MultiHeadAttentionWrapperImpl::reset() {
  detail::check_positive(options.num_heads(), "num_heads", kWrapperName);
  TORCH_CHECK_VALUE(options.num_heads() <= kMaxWrapperHeads, kWrapperName,
                    ": expected num_heads <= ", kMaxWrapperHeads, " (one module each), got ",
                    options.num_heads());
  heads = register_module("heads", torch::nn::ModuleList());
  for (int64_t h = 0; h < options.num_heads(); ++h) {
    heads->push_back(SelfAttention(options.d_in(), options.d_out_kq(), options.d_out_v()));
  }
}

void MultiHeadAttentionWrapperImpl::pretty_print(std::ostream& stream) const {
  stream << kWrapperName << "(d_in=" << options.d_in() << ", d_out_kq=" << options.d_out_kq()
         << ", d_out_v=" << options.d_out_v() << ", num_heads=" << options.num_heads() << ")";
}

torch::Tensor MultiHeadAttentionWrapperImpl::forward(const torch::Tensor& x) {
  detail::check_module_input(x, options.d_in(), heads[0]->as<SelfAttentionImpl>()->W_query,
                             kWrapperName, "input");
  std::vector<torch::Tensor> outputs;
  outputs.reserve(heads->size());
  for (const auto& head : *heads) outputs.push_back(head->as<SelfAttentionImpl>()->forward(x));
  return torch::cat(outputs, -1);
}

}  // namespace attention
