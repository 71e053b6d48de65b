// One rank of the multi-process tests of attention::distributed (test_distributed_processes.cpp
// starts several, without torchrun, so that one can be killed). Reads torchrun's variables,
// makes the group and runs causal ring attention forward and backward; one rank may be made to
// die (SIGKILL) on the way. Prints what happened for the test to read:
//
//   elapsed_ms <n>     the time from the start of the call that failed (or of the whole run)
//   error <message>    a c10::Error's message without backtrace (exit 1)
//   other <message>    any other exception (exit 3): a failure of the library
//   ok                 (exit 0)
//
//   attention-tests --distributed-rank [--timeout-ms N] [--die-in forward|backward] [--length T]

#include "helper_programs.h"

#include <attention/distributed.h>

#include <torch/torch.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>

namespace {

namespace dist = attention::distributed;
using Clock = std::chrono::steady_clock;

int64_t milliseconds_since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

[[noreturn]] void die() {
  std::raise(SIGKILL);
  std::abort();
}

}  // namespace

int distributed_rank_main(int argc, char** argv) {
  int64_t timeout_ms = 2000, length = 3072;
  std::string die_in;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--timeout-ms") == 0) timeout_ms = std::stoll(argv[i + 1]);
    if (std::strcmp(argv[i], "--die-in") == 0) die_in = argv[i + 1];
    if (std::strcmp(argv[i], "--length") == 0) length = std::stoll(argv[i + 1]);
  }
  torch::set_num_threads(1);
  auto start = Clock::now();
  try {
    const auto group = dist::Group::from_env(
        dist::GroupOptions().timeout(std::chrono::milliseconds(timeout_ms)).hostname("127.0.0.1"));
    torch::manual_seed(0);
    const auto shard = [&](int64_t heads) {
      return dist::shard_sequence(torch::randn({1, heads, length, 64}), 2, group, true)
          .contiguous()
          .requires_grad_();
    };
    const auto q = shard(4), k = shard(2), v = shard(2);
    // Dying in the forward: once the first key/value block is on its way (the check of the
    // problem before it sends 20 int64 values to each peer), while the kernel works on the first
    // step.
    if (die_in == "forward") {
      const int64_t check_bytes = group.bytes_sent() + 8 * 20 * (group.size() - 1);
      std::thread([group, check_bytes] {
        while (group.bytes_sent() <= check_bytes)
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        die();
      }).detach();
    }
    start = Clock::now();
    auto out = dist::ring_attention(q, k, v, group,
                                    dist::RingAttentionOptions().is_causal(true).balanced(true));
    // Dying in the backward: when autograd reaches ring attention's backward on this rank.
    if (die_in == "backward") {
      out.register_hook([](const torch::Tensor& grad) {
        die();
        return grad;
      });
    }
    start = Clock::now();
    (out * out).sum().backward();
    std::cout << "elapsed_ms " << milliseconds_since(start) << "\nok" << std::endl;
    return 0;
  } catch (const c10::Error& e) {
    std::cout << "elapsed_ms " << milliseconds_since(start) << "\nerror "
              << e.what_without_backtrace() << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cout << "elapsed_ms " << milliseconds_since(start) << "\nother " << e.what() << std::endl;
    return 3;
  }
}
