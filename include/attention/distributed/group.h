#pragma once

/// \file
/// The process group of the distributed modules: PyTorch's c10d with its Gloo backend, made from
/// torchrun's environment or from any c10d store.

#include <attention/export.h>
#include <torch/arg.h>
#include <torch/types.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

namespace attention {
namespace distributed {

struct GroupState;

/// Options of Group.
struct GroupOptions {
  /// How long one step of communication may wait for the other ranks before it fails with a
  /// c10::Error naming the operation, the step and the peer; also the time to connect. A step
  /// is one exchange: a ring step's block, one exchange of a collective, or the check that every
  /// rank passes the same problem.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::milliseconds(60000);
  /// The address Gloo listens on. Empty (default): the interface named by GLOO_SOCKET_IFNAME
  /// when set, else this machine's hostname, as `torch.distributed` does.
  TORCH_ARG(std::string, hostname) = "";
};

/// A group of `size()` processes (or threads) that compute together, each with its `rank()`.
/// Every distributed call is collective: all ranks make the same calls in the same order.
/// Copies share one connection; the group closes when the last copy goes.
///
/// Failures. A call that one rank refuses (bad input, a file it cannot read) is refused on every
/// rank at once, with the same message and exception type, and the group stays usable. A rank
/// that stops or stops answering makes the others fail within the timeout with a c10::Error
/// that names the operation, the step and that rank (Gloo's own exceptions never reach the
/// caller); the group is then unusable, every later call fails at once naming the first
/// failure: make a new one.
///
/// A rank that stops closes its connections; Gloo's next write to it then raises SIGPIPE, whose
/// default action ends the writing process before any error can be reported. Creating a group
/// therefore sets SIGPIPE to be ignored when its action is still the default (as the Python
/// interpreter does at start-up), so such a write fails with an error instead; a handler the
/// program installed itself is left alone.
///
/// Thread safety: rank(), size(), timeout() and bytes_sent() may be called from any thread (the
/// failure record has a mutex, the byte count is atomic). Collectives must not overlap on one
/// rank, over all copies of the group: the caller serializes them. Ranks that are threads of one
/// process each make their own Group. Creating one may change the process's SIGPIPE action.
///
/// Example:
/// \code
/// // torchrun --standalone --nproc_per_node=2 --no_python ./my_program
/// auto group = attention::distributed::Group::from_env();
/// std::cout << "rank " << group.rank() << " of " << group.size() << "\n";
/// \endcode
class ATTENTION_DISTRIBUTED_API Group {
 public:
  /// The group torchrun describes: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (rank 0 hosts
  /// the c10d::TCPStore unless TORCHELASTIC_USE_AGENT_STORE=True says torchrun hosts it).
  /// Throws c10::ValueError naming a variable that is missing or malformed, c10::Error when the
  /// ranks do not meet within the timeout. The whole start-up (reaching or hosting the store, then
  /// connecting to every rank) has one deadline, the timeout: a rank that never starts, a store
  /// that cannot be reached or hosted, and a port held by a program that accepts connections and
  /// never answers each fail within it (plus a quarter second for c10d to report its own reason),
  /// with a message that names this rank, the store's address and what c10d said.
  static Group from_env(const GroupOptions& options = {});

  /// A group of `world_size` ranks meeting through `store` (a c10d::TCPStore, FileStore or, for
  /// ranks that are threads of one process, a c10d::HashStore shared by them).
  static Group create(const c10::intrusive_ptr<c10d::Store>& store, int64_t rank,
                      int64_t world_size, const GroupOptions& options = {});

  /// This process's rank, 0 <= rank() < size().
  int64_t rank() const;
  /// The number of ranks.
  int64_t size() const;
  /// The time any operation may wait for the other ranks.
  std::chrono::milliseconds timeout() const;
  /// Bytes this rank has sent to the others so far (payload of every transfer).
  int64_t bytes_sent() const;

  /// Sums `tensor` (a contiguous CPU tensor) over the ranks, in place; every rank gets the same
  /// bits. Checks first that every rank passes the same shape and dtype. `caller` names the
  /// public function in errors.
  void all_reduce_sum(torch::Tensor& tensor, const char* caller) const;
  /// Every rank's `tensor` (a CPU tensor), in rank order. Checks first that every rank passes
  /// the same shape and dtype.
  std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor, const char* caller) const;
  /// Checks that every rank passed the same `values` (shapes, options) and that no rank failed
  /// before: `local_error` is the exception this rank met while checking its own inputs (null
  /// when none). When any rank has one, every rank throws the same error, of the same c10 type,
  /// naming the first such rank and its message; when the values differ, every rank throws the
  /// same c10::ValueError naming `what`, rank 0's values and the first rank that differs. The
  /// group stays usable after either. At most 4096 values. One exchange of 20 int64 values with
  /// every other rank (a second when a rank failed or more than 17 values are compared).
  void check_same(const std::vector<int64_t>& values, const char* what, const char* caller,
                  const std::exception_ptr& local_error = nullptr) const;

  /// The implementation, for the distributed modules of this library.
  const std::shared_ptr<GroupState>& state() const { return state_; }

 private:
  explicit Group(std::shared_ptr<GroupState> state) : state_(std::move(state)) {}
  std::shared_ptr<GroupState> state_;
};

}  // namespace distributed
}  // namespace attention
