// Causal attention over a sequence split across processes, checked against one process.
//
//   torchrun --standalone --nproc_per_node=2 --no_python ./ring-attention [--length T]
//            [--forward-only] [--heads-parallel]
//
// Every rank draws the same inputs from the same seed, keeps its shard of the sequence (an early
// and a late chunk), runs ring attention forward and backward with the other ranks, and compares
// its output and gradients with the whole problem computed by itself alone. With
// --heads-parallel it also checks a MultiHeadAttention split by heads. Exits 1 when a difference
// exceeds 1e-5.

#include <attention/attention.h>
#include <attention/distributed.h>

#include <fmt/core.h>
#include <torch/torch.h>

#include <cstring>
#include <string>

namespace {

namespace dist = attention::distributed;
namespace F = attention::functional;
using torch::Tensor;

double max_diff(const Tensor& a, const Tensor& b) {
  return (a - b).abs().max().item<double>();
}

// Ring attention on this rank's shard against the rows of one process's result.
double check_ring(const dist::Group& group, int64_t length, bool backward) {
  torch::manual_seed(0);
  const int64_t batch = 2, heads = 8, kv_heads = 4, d = 64;
  const auto q = torch::randn({batch, heads, length, d});
  const auto k = torch::randn({batch, kv_heads, length, d});
  const auto v = torch::randn({batch, kv_heads, length, d});
  const auto upstream = torch::randn({batch, heads, length, d});

  // This rank's shard: chunks r and 2W-1-r of 2W.
  const auto shard = [&](const Tensor& t) {
    return dist::shard_sequence(t, 2, group, /*balanced=*/true).contiguous();
  };
  auto q_r = shard(q).requires_grad_(), k_r = shard(k).requires_grad_(),
       v_r = shard(v).requires_grad_();
  auto out_r = dist::ring_attention(q_r, k_r, v_r, group,
                                    dist::RingAttentionOptions().is_causal(true).balanced(true));

  // One process, the whole sequence.
  auto q_1 = q.clone().requires_grad_(), k_1 = k.clone().requires_grad_(),
       v_1 = v.clone().requires_grad_();
  auto out_1 = F::scaled_dot_product_attention(
                   q_1, k_1, v_1, F::ScaledDotProductAttentionOptions().is_causal(true))
                   .output;
  double worst = max_diff(out_r.detach(), shard(out_1.detach()));
  fmt::print("rank {} of {}: ring attention output, max |difference| {:.3g}\n", group.rank(),
             group.size(), worst);
  if (!backward) return worst;
  out_r.backward(shard(upstream));
  out_1.backward(upstream);
  for (const auto& [name, mine, whole] :
       {std::tuple{"query", q_r, q_1}, {"key", k_r, k_1}, {"value", v_r, v_1}}) {
    const double diff = max_diff(mine.grad(), shard(whole.grad()));
    fmt::print("rank {} of {}: gradient of the {}, max |difference| {:.3g}\n", group.rank(),
               group.size(), name, diff);
    worst = std::max(worst, diff);
  }
  return worst;
}

// A MultiHeadAttention split by heads against the whole module.
double check_heads(const dist::Group& group) {
  torch::manual_seed(1);
  const int64_t heads = 4 * group.size();
  attention::MultiHeadAttention full(
      attention::MultiHeadAttentionOptions(64, 16 * heads, heads).num_kv_heads(2 * group.size()));
  const auto x = torch::randn({2, 100, 64});
  auto part = dist::shard_heads(*full, group);
  const double diff = max_diff(part->forward(x).output, full->forward(x).output);
  fmt::print("rank {} of {}: head-parallel MultiHeadAttention, max |difference| {:.3g}\n",
             group.rank(), group.size(), diff);
  return diff;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t length = 1536;
  bool backward = true, heads_parallel = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--length") == 0 && i + 1 < argc) {
      length = std::stoll(argv[++i]);
    } else if (std::strcmp(argv[i], "--forward-only") == 0) {
      backward = false;
    } else if (std::strcmp(argv[i], "--heads-parallel") == 0) {
      heads_parallel = true;
    } else {
      fmt::print(stderr, "usage: {} [--length T] [--forward-only] [--heads-parallel]\n", argv[0]);
      return 2;
    }
  }
  try {
    torch::set_num_threads(1);  // the ranks share this machine's cores
    const auto group = dist::Group::from_env();
    double worst = check_ring(group, length, backward);
    if (heads_parallel) worst = std::max(worst, check_heads(group));
    const bool ok = worst <= 1e-5;
    fmt::print("rank {} of {}: {} (largest difference {:.3g}, tolerance 1e-5)\n", group.rank(),
               group.size(), ok ? "matches one process" : "DIFFERS from one process", worst);
    return ok ? 0 : 1;
  } catch (const c10::Error& e) {
    fmt::print(stderr, "{}\n", e.what_without_backtrace());
    return 1;
  }
}
