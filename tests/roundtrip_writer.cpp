// Writes seeded modules with save_weights, as a state dict and as safetensors, for
// scripts/check_roundtrip.py to read in Python: `attention-tests --roundtrip-writer DIR`.
// Each module's weights are its seeded ones plus 0.5, so that they match no freshly seeded module
// by accident; the Python side applies the same shift to its own seeded module and compares.

#include "helper_programs.h"

#include <attention/attention.h>

#include <torch/torch.h>

#include <string>

namespace {

void write_shifted(torch::nn::Module& module, const std::string& path) {
  {
    torch::NoGradGuard no_grad;
    for (auto& p : module.parameters()) p.add_(0.5);
  }
  attention::save_weights(module, path + ".pt");
  attention::save_weights(module, path + ".safetensors");
}

}  // namespace

int roundtrip_writer_main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string dir = argv[1];
  torch::manual_seed(1);
  attention::SelfAttention self(5, 3, 4);
  write_shifted(*self, dir + "/SelfAttention");
  torch::manual_seed(2);
  attention::MultiHeadAttentionWrapper wrapper(4, 2, 3, 3);
  write_shifted(*wrapper, dir + "/MultiHeadAttentionWrapper");
  torch::manual_seed(3);
  attention::CausalSelfAttention causal(6, 4, 2);
  write_shifted(*causal, dir + "/CausalSelfAttention");
  torch::manual_seed(4);
  attention::CrossAttention cross(attention::CrossAttentionOptions(3, 2, 5).d_in_kv(7));
  write_shifted(*cross, dir + "/CrossAttention");
  return 0;
}
