#pragma once

// Small helpers shared by the test files.

#include <attention/functional.h>

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>
#include <torch/types.h>
#include "catch_compat.h"
#include "source_paths.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

namespace test {

inline double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.numel() == 0 && b.numel() == 0) return 0.0;
  return (a.detach().to(torch::kDouble) - b.detach().to(torch::kDouble)).abs().max().item<double>();
}

// The largest difference between two lists of results, element by element; infinite when a pair
// differs in shape (a broadcast would hide it).
inline double max_abs_diff(const std::vector<torch::Tensor>& a,
                           const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].sizes() != b[i].sizes()) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, max_abs_diff(a[i], b[i]));
  }
  return worst;
}

// Runs `body` with LibTorch's intra-op pool at `threads` threads, then restores it.
template <typename Body>
void with_threads(int threads, Body body) {
  const int before = at::get_num_threads();
  at::set_num_threads(threads);
  try {
    body();
  } catch (...) {
    at::set_num_threads(before);
    throw;
  }
  at::set_num_threads(before);
}

// The sizes of a random attention problem of the differential tests: batch 1 or 2, 1 or 2
// key/value heads shared by 1 or 3 query heads, Tq and Tk from 1 to 130, head sizes 16 and 8.
struct RandomSizes {
  int64_t batch, kv_heads, heads, t_q, t_k, d = 16, dv = 8;
};

template <typename Rng>
RandomSizes random_sizes(Rng& rng) {
  const auto pick = [&](std::vector<int64_t> values) { return values[rng() % values.size()]; };
  RandomSizes r{};
  r.batch = pick({1, 2});
  r.kv_heads = pick({1, 2});
  r.heads = r.kv_heads * pick({1, 3});
  r.t_q = pick({1, 40, 130});
  r.t_k = pick({1, 57, 130});
  r.d = 16;
  r.dv = 8;
  return r;
}

// Option `option` of those the differential tests take in turn, added to `o` for scores (batch,
// heads, ., t_k) of `dtype`: 1 causal, 2 causal with a window of 0 or 20 keys (from `pick`), 3
// soft-capping, 4 ALiBi, 5 sinks, 6 a key padding mask; any other adds nothing.
template <typename Pick>
void add_option(attention::functional::ScaledDotProductAttentionOptions& o, int option,
                int64_t batch, int64_t heads, int64_t t_k, torch::Dtype dtype, Pick& pick) {
  namespace F = attention::functional;
  if (option == 1) o.is_causal(true);
  if (option == 2) o.is_causal(true).window_left(pick({0, 20}));
  if (option == 3) o.softcap(3.0);
  if (option == 4) o.alibi_slopes(F::alibi_slopes(heads).to(dtype));
  if (option == 5) o.sinks(torch::randn({heads}, torch::TensorOptions().dtype(dtype)));
  if (option == 6) o.attn_mask(torch::rand({batch, 1, 1, t_k}) < 0.2);
}

// Copies of a module's parameters, to check later that something left them as they were.
/// x fed to `step` in chunks of the sizes `chunks` along `dim`, the outputs joined along it: a
/// module decoding through a cache or state, which must equal one call over x.
template <typename Step>
torch::Tensor in_chunks(const torch::Tensor& x, const std::vector<int64_t>& chunks, Step step,
                        int64_t dim = 1) {
  std::vector<torch::Tensor> outputs;
  int64_t start = 0;
  for (const int64_t n : chunks) {
    outputs.push_back(step(x.narrow(dim, start, n)));
    start += n;
  }
  return torch::cat(outputs, dim);
}

inline std::vector<torch::Tensor> snapshot(const torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

inline bool unchanged(const torch::nn::Module& m, const std::vector<torch::Tensor>& before) {
  const auto now = snapshot(m);
  for (size_t i = 0; i < now.size(); ++i) {
    if (!torch::equal(now[i], before[i])) return false;
  }
  return true;
}

// The whole of a file.
inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The message of a c10 error without LibTorch's backtrace.
inline std::string message(const c10::Error& e) {
  return e.what_without_backtrace();
}

}  // namespace test

// Checks that `expr` throws `Type` (a c10::Error subclass) whose message contains `fragment`.
#define CHECK_THROWS_C10(expr, Type, fragment)                 \
  do {                                                         \
    bool thrown_ = false;                                      \
    try {                                                      \
      (void)(expr);                                            \
    } catch (const Type& e_) {                                 \
      thrown_ = true;                                          \
      CHECK_THAT(test::message(e_), test::contains(fragment)); \
    }                                                          \
    CHECK(thrown_);                                            \
  } while (false)
