// Load time and peak memory of load_weights on one file, for scripts/bench_load.sh.
//
//   attention-load-bench FILE D_MODEL NUM_HEADS [REPEATS]
//
// Builds MultiHeadAttention(D_MODEL, D_MODEL, NUM_HEADS) with qkv_bias (the layout
// scripts/bench_load.sh writes), then loads FILE REPEATS times. Before each load the process's
// peak resident set is reset (/proc/self/clear_refs), so each line reports what that load itself
// added on top of the module: one JSON object per load.

#include <attention/attention.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace {

// VmHWM or VmRSS of /proc/self/status, in MiB.
double status_mib(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) {
      std::istringstream in(line.substr(field.size() + 1));
      double kib = 0;
      in >> kib;
      return kib / 1024.0;
    }
  }
  return -1;
}

void reset_peak() {
  std::ofstream("/proc/self/clear_refs") << "5";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    fmt::print(stderr, "usage: attention-load-bench FILE D_MODEL NUM_HEADS [REPEATS]\n");
    return 2;
  }
  const std::string path = argv[1];
  const int64_t d = std::atoll(argv[2]);
  const int64_t heads = std::atoll(argv[3]);
  const int repeats = argc > 4 ? std::atoi(argv[4]) : 3;
  attention::MultiHeadAttention mha(
      attention::MultiHeadAttentionOptions(d, d, heads).qkv_bias(true));
  for (int r = 0; r < repeats; ++r) {
    const double before = status_mib("VmRSS");
    reset_peak();
    const auto start = std::chrono::steady_clock::now();
    const auto report = attention::load_weights(*mha, path);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    fmt::print(
        "{{\"side\": \"cpp\", \"format\": \"{}\", \"load_ms\": {:.1f}, "
        "\"rss_before_mib\": {:.1f}, \"peak_rss_mib\": {:.1f}, \"tensors\": {}}}\n",
        report.format, ms, before, status_mib("VmHWM"), report.loaded.size());
  }
  return 0;
}
