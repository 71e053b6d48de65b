// The C++ port of the project's block, checked against the cases that Python recorded: one CTest
// test per case (attention_add_parity_test in CMakeLists.txt).

#include <attention/multi_head_attention.h>
#include <attention/testing.h>

#include <torch/torch.h>

// The Python Block of record_cases.py, with the same submodule and parameter names.
struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t d, int64_t heads)
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        att(register_module("att", attention::MultiHeadAttention(d, d, heads))) {}

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& key_padding_mask = {}) {
    auto options = attention::MultiHeadAttentionForwardOptions().key_padding_mask(key_padding_mask);
    return x + att(norm(x), options).output;
  }

  torch::nn::LayerNorm norm;
  attention::MultiHeadAttention att;
};
TORCH_MODULE(Block);

int main(int argc, char** argv) {
  return attention::testing::parity_main(argc, argv, [](const attention::testing::ParityCase& c) {
    Block block(32, 4);
    block->to(torch::kDouble);
    return attention::testing::check_parity(
        *block, c, [&](const std::vector<torch::Tensor>& inputs) {
          const torch::Tensor padding = inputs.size() > 1 ? inputs[1] : torch::Tensor();
          return std::vector<torch::Tensor>{block(inputs[0], padding)};
        });
  });
}
