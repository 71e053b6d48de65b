#pragma once

// What a Group holds: c10d's Gloo process group, and the waits that turn c10d's failures and
// timeouts into errors naming the operation and the ranks. c10d's classes used here are the same
// in LibTorch 1.13 and 2.x.

#include <attention/distributed/group.h>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <atomic>
#include <string>

namespace attention {
namespace distributed {

using WorkPtr = c10::intrusive_ptr<c10d::Work>;

struct GroupState {
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;
  int64_t rank = 0, size = 1;
  std::chrono::milliseconds timeout{0};
  std::atomic<int64_t> bytes_sent{0};

  /// Starts sending `tensor` (contiguous, CPU) to rank `to`; `tag` tells transfers apart.
  WorkPtr send(torch::Tensor& tensor, int64_t to, int tag);
  /// Starts receiving into `tensor` (contiguous, CPU) from rank `from`.
  WorkPtr recv(torch::Tensor& tensor, int64_t from, int tag);
  /// Waits for `work` at most the group's timeout; on failure throws c10::Error that names
  /// `caller`, this rank and `what` (e.g. "receiving key/value block 2 from rank 1").
  void wait(const WorkPtr& work, const std::string& what, const char* caller) const;
};

}  // namespace distributed
}  // namespace attention
