#include <attention/format.h>

#include "helpers.h"

#include <torch/torch.h>

TEST_CASE("format: tensors print as PyTorch prints them", "[format]") {
  auto t = torch::tensor({0.3374f, -0.1778f, 1.8951f, 0.4954f}).view({2, 2});
  CHECK(fmt::format("{}", t) == "tensor([[ 0.3374, -0.1778],\n        [ 1.8951,  0.4954]])");
  CHECK(fmt::format("{:s}", t) == "torch.Size([2, 2])");
  CHECK(fmt::format("{}", torch::tensor(1.29031f)) == "tensor(1.2903)");
  CHECK(fmt::format("{}", torch::ones({2, 2}).tril()) == "tensor([[1., 0.],\n        [1., 1.]])");
  CHECK(fmt::format("{}", torch::tensor({0, 4, 5})) == "tensor([0, 4, 5])");
  CHECK(fmt::format("{}", torch::tensor({0.5f, -INFINITY})) == "tensor([0.5000,   -inf])");
  CHECK(fmt::format("{}", torch::tensor({1.5}, torch::kDouble)) ==
        "tensor([1.5000], dtype=torch.float64)");
  CHECK(fmt::format("{}", torch::zeros({1, 2, 1})) == "tensor([[[0.],\n         [0.]]])");
}
