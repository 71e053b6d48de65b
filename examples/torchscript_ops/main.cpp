// A C++ application runs a model that was written and scripted in Python on the library's
// operators (write_model.py): it registers the operators, loads the scripted model with
// torch::jit::load, and checks its output and its input gradient against Python's.
//
//   torchscript-ops DIR     (DIR as write_model.py wrote it; exits 1 on a difference)

#include <attention/operators.h>

#include <torch/script.h>
#include <torch/torch.h>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR (written by write_model.py)\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  // Before the load: the scripted model's calls of torch.ops.attention.* resolve against the
  // registered schemas.
  attention::register_operators();
  torch::jit::Module model = torch::jit::load(dir + "/model.pt");
  torch::jit::Module tensors = torch::jit::load(dir + "/tensors.pt");
  const auto x = tensors.attr("input").toTensor().clone().requires_grad_(true);
  const auto expected = tensors.attr("output").toTensor();
  const auto expected_grad = tensors.attr("input_grad").toTensor();

  const auto y = model.forward({x}).toTensor();
  y.square().sum().backward();  // the operator's fused backward, recorded by the scripted call
  const double output_error = (y - expected).abs().max().item<double>();
  const double grad_error = (x.grad() - expected_grad).abs().max().item<double>();
  std::printf(
      "torchscript-ops: output %s, largest difference from Python %.3g (output), %.3g "
      "(input gradient)\n",
      c10::str(y.sizes()).c_str(), output_error, grad_error);
  // float32 on the same kernels in both processes; the tolerance covers a different thread
  // count's summation order in LibTorch's own ops.
  const bool same = output_error <= 1e-5 && grad_error <= 1e-4;
  if (!same) std::fprintf(stderr, "torchscript-ops: differs from Python\n");
  return same ? 0 : 1;
}
