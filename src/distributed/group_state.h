#pragma once

// What a Group holds: c10d's Gloo process group, of which only the point-to-point transfers are
// used (so that every failure is known by the peer it came from), and the waits that turn
// Gloo's and c10d's failures and time-outs into c10::Error naming the operation, the step and
// the peer. c10d's classes used here are the same in LibTorch 1.13 and 2.x.

#include <attention/distributed/group.h>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

namespace attention {
namespace distributed {

using Clock = std::chrono::steady_clock;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;

// The tags of the kinds of transfer (Gloo matches a send to a receive by peer and tag, in order),
// so that a transfer of one kind never matches another kind.
namespace tags {
constexpr int kRingForward = 0;
constexpr int kRingBackward = 1 << 20;
constexpr int kRingGradient = 2 << 20;
constexpr int kCheck = 3 << 20;
constexpr int kCheckDetails = kCheck + 1;
constexpr int kGather = 4 << 20;
constexpr int kReduce = 5 << 20;
constexpr int kReduced = kReduce + 1;
}  // namespace tags

// One send or receive in flight, and what it carries for messages ("the key/value block of
// forward step 1 of 2").
struct Transfer {
  WorkPtr work;
  int64_t peer = 0;
  bool sending = false;
  std::string what;
};

struct GroupState {
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;
  int64_t rank = 0, size = 1;
  std::chrono::milliseconds timeout{0};
  std::atomic<int64_t> bytes_sent{0};

  // When a step that starts now must be over.
  Clock::time_point deadline() const { return Clock::now() + timeout; }
  // Throws when an earlier failure left the group unusable.
  void check_usable(const char* caller) const;
  // Starts sending `tensor` (contiguous, CPU; kept alive by the transfer) to rank `to`.
  Transfer send(const torch::Tensor& tensor, int64_t to, int tag, std::string what,
                const char* caller);
  // Starts receiving into `tensor` (contiguous, CPU) from rank `from`.
  Transfer recv(const torch::Tensor& tensor, int64_t from, int tag, std::string what,
                const char* caller);
  // Waits for every transfer until `deadline`. The first that fails (in order) is reported as a
  // c10::Error naming `caller`, this rank, the transfer and its peer, with the others that have
  // failed too; the group is then unusable.
  void wait(const std::vector<Transfer>& transfers, Clock::time_point deadline, const char* caller);
  // Sends outgoing[r] to and receives incoming[r] from every other rank r (empty tensors are
  // skipped; both sides must know the sizes), all at once, and waits for all until one
  // deadline.
  void exchange(const std::vector<torch::Tensor>& outgoing,
                const std::vector<torch::Tensor>& incoming, int tag, const std::string& what,
                const char* caller);

 private:
  // Starts `t` (a send or a receive of `tensor`), turning Gloo's exceptions into c10::Error.
  Transfer start(Transfer t, const torch::Tensor& tensor, int tag, const char* caller);
  void fail(const std::string& message);  // throws c10::Error
  mutable std::mutex mutex_;
  std::string failure_;
};

// Every rank's `tensor` (CPU), in rank order. The caller has made sure that every rank passes
// the same shape and dtype (a size that differs would fail the transfer).
std::vector<torch::Tensor> gather_same(GroupState& state, const torch::Tensor& tensor,
                                       const std::string& what, const char* caller);
// Sums `tensor` (contiguous, CPU, the same shape and dtype on every rank) over the ranks in
// place: each rank sums one part in rank order and sends it to the others, so that every rank
// gets the same bits.
void reduce_same(GroupState& state, torch::Tensor& tensor, const std::string& what,
                 const char* caller);

// An exception's message on one line, without c10's backtrace.
std::string message_of(const std::exception& e);

}  // namespace distributed
}  // namespace attention
