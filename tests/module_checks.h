#pragma once

// Properties every attention module must have, written once and checked for each module.

#include "helpers.h"

#include <torch/nn/module.h>
#include <torch/types.h>

#include <functional>
#include <vector>

// forward on a (B, T, d_in) batch equals forward on each (T, d_in) item, stacked.
inline void check_batched_equals_stacked(
    const std::function<torch::Tensor(const torch::Tensor&)>& forward, int64_t d_in) {
  auto batch = torch::randn({3, 5, d_in});
  auto batched = forward(batch);
  std::vector<torch::Tensor> items;
  for (int64_t b = 0; b < batch.size(0); ++b) items.push_back(forward(batch[b]));
  CHECK(test::max_abs_diff(batched, torch::stack(items)) < 1e-6);
}

// A backward pass from the module's output gives every parameter a finite, non-zero gradient.
inline void check_gradients_reach_parameters(torch::nn::Module& module,
                                             const std::function<torch::Tensor()>& forward) {
  for (auto& p : module.parameters()) p.mutable_grad() = torch::Tensor();
  auto out = forward();
  (out * torch::randn_like(out)).sum().backward();
  for (const auto& item : module.named_parameters()) {
    INFO(item.key());
    REQUIRE(item.value().grad().defined());
    CHECK(torch::isfinite(item.value().grad()).all().item<bool>());
    CHECK(item.value().grad().abs().sum().item<double>() > 0.0);
  }
}
