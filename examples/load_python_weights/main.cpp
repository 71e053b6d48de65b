// Loads weights that Python saved and runs a forward pass.
//
// Python side:
//     mha = MultiHeadAttentionWrapper(d_in=8, d_out_kq=4, d_out_v=3, num_heads=3)
//     torch.save(mha.state_dict(), "mha.pt")   # or torch.jit.save(torch.jit.script(mha), p)
//
// usage: load-python-weights WEIGHTS_FILE

#include <attention/attention.h>

#include <fmt/core.h>
#include <torch/torch.h>

int main(int argc, char** argv) {
  if (argc != 2) {
    fmt::print(stderr, "usage: {} WEIGHTS_FILE\n", argv[0]);
    return 2;
  }
  attention::MultiHeadAttentionWrapper mha(/*d_in=*/8, /*d_out_kq=*/4, /*d_out_v=*/3,
                                           /*num_heads=*/3);
  try {
    const auto report = attention::load_weights(*mha, argv[1]);
    fmt::print("loaded {} tensors ({})\n", report.loaded.size(), report.format);
  } catch (const c10::Error& e) {
    fmt::print(stderr, "{}\n", e.what_without_backtrace());
    return 1;
  }
  mha->eval();
  torch::NoGradGuard no_grad;
  const auto x = torch::rand({2, 5, 8});  // (B, T, d_in)
  fmt::print("output {:s}\n", mha(x));
  return 0;
}
