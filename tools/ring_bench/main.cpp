// Per-rank memory, traffic and time of ring attention, run under torchrun:
//
//   torchrun --standalone --nproc_per_node=W --redirects 1 --tee 1 --no_python
//       attention-ring-bench --length T [--backward]
//
// Each rank draws only its own shard (B=1, H=2, d=64, causal, float32), runs one ring attention
// (and its backward with --backward), and reports its peak resident memory above what it held
// before the inputs were drawn, the bytes it sent, the wall time, and the time of the kernel on
// one step's work alone (its T/W queries against T/W keys, half of them visible: the compute
// that each ring step has to hide a transfer behind; timed on at most 2048 of the queries and
// scaled). Rank 0 prints one JSON line per rank.

#include <attention/attention.h>
#include <attention/distributed.h>

#include <fmt/core.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <string>

namespace {

namespace dist = attention::distributed;
namespace F = attention::functional;
using Clock = std::chrono::steady_clock;

// Restarts the kernel's count of this process's peak resident memory (Linux 4.0+), so that a
// peak reached before (loading libraries, connecting) does not hide the one being measured.
void reset_peak_rss() {
  std::ofstream("/proc/self/clear_refs") << "5";
}

// A field of /proc/self/status in bytes: "VmHWM" (peak resident memory), "VmRSS" (now).
int64_t status_bytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  }
  return -1;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  int64_t length = 4096;
  bool backward = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--length") == 0 && i + 1 < argc) {
      length = std::stoll(argv[++i]);
    } else if (std::strcmp(argv[i], "--backward") == 0) {
      backward = true;
    } else {
      fmt::print(stderr, "usage: {} [--length T] [--backward]\n", argv[0]);
      return 2;
    }
  }
  try {
    torch::set_num_threads(1);
    const auto group = dist::Group::from_env();
    const int64_t batch = 1, heads = 2, d = 64, local = length / group.size();
    const int64_t baseline = status_bytes("VmRSS");
    reset_peak_rss();
    torch::manual_seed(group.rank());
    auto q = torch::randn({batch, heads, local, d}).requires_grad_(backward);
    auto k = torch::randn({batch, heads, local, d}).requires_grad_(backward);
    auto v = torch::randn({batch, heads, local, d}).requires_grad_(backward);

    // One step's compute alone: the local queries against a block of T/W keys, half visible.
    const int64_t timed = std::min<int64_t>(local, 2048);
    const auto block_start = Clock::now();
    {
      torch::NoGradGuard no_grad;
      F::scaled_dot_product_attention(
          q.detach().narrow(2, 0, timed), k.detach(), v.detach(),
          F::ScaledDotProductAttentionOptions().backend(F::Backend::Chunked));
    }
    const double step_compute =
        seconds_since(block_start) / 2 * static_cast<double>(local) / static_cast<double>(timed);

    const int64_t sent_before = group.bytes_sent();
    const auto start = Clock::now();
    auto out = dist::ring_attention(q, k, v, group,
                                    dist::RingAttentionOptions().is_causal(true).balanced(true));
    if (backward) out.backward(torch::ones_like(out));
    const double wall = seconds_since(start);
    const int64_t sent = group.bytes_sent() - sent_before;
    const auto report = torch::tensor({static_cast<double>(status_bytes("VmHWM") - baseline),
                                       static_cast<double>(sent), wall, step_compute},
                                      torch::kDouble);
    const auto all = group.all_gather(report, "attention-ring-bench");
    if (group.rank() == 0) {
      for (int64_t r = 0; r < group.size(); ++r) {
        const auto* x = all[r].data_ptr<double>();
        fmt::print(
            "{{\"length\": {}, \"ranks\": {}, \"rank\": {}, \"backward\": {}, "
            "\"peak_rss_above_start_mib\": {:.1f}, \"sent_mib\": {:.2f}, \"wall_s\": {:.3f}, "
            "\"step_compute_s\": {:.4f}}}\n",
            length, group.size(), r, backward, x[0] / (1 << 20), x[1] / (1 << 20), x[2], x[3]);
      }
    }
    return 0;
  } catch (const c10::Error& e) {
    fmt::print(stderr, "{}\n", e.what_without_backtrace());
    return 1;
  }
}
