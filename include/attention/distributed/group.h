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
#include <memory>
#include <string>
#include <vector>

namespace attention {
namespace distributed {

struct GroupState;

/// Options of Group.
struct GroupOptions {
  /// How long any collective or transfer may wait for the other ranks before it fails with an
  /// error naming the operation and the ranks; also the time to connect.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::milliseconds(60000);
  /// The address Gloo listens on. Empty (default): the interface named by GLOO_SOCKET_IFNAME
  /// when set, else this machine's hostname, as `torch.distributed` does.
  TORCH_ARG(std::string, hostname) = "";
};

/// A group of `size()` processes (or threads) that compute together, each with its `rank()`.
/// Every distributed call is collective: all ranks make the same calls in the same order.
/// Copies share one connection; the group closes when the last copy goes.
///
/// A rank that stops closes its connections; Gloo's next write to it then raises SIGPIPE, whose
/// default action ends the writing process before any error can be reported. Creating a group
/// therefore sets SIGPIPE to be ignored when its action is still the default (as the Python
/// interpreter does at start-up), so such a write fails with an error instead; a handler the
/// program installed itself is left alone.
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
  /// ranks do not meet within the timeout.
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
  /// Bytes this rank has sent to the others so far (payload of every transfer and collective).
  int64_t bytes_sent() const;

  /// Sums `tensor` (a contiguous CPU tensor) over the ranks, in place. `caller` names the
  /// public function in errors.
  void all_reduce_sum(torch::Tensor& tensor, const char* caller) const;
  /// Every rank's `tensor` (same shape and dtype on each rank), in rank order.
  std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor, const char* caller) const;
  /// Checks that every rank passed the same `values` (shapes, options) and throws
  /// c10::ValueError naming `what`, this rank's values and the first rank that differs.
  void check_same(const std::vector<int64_t>& values, const char* what, const char* caller) const;

  /// The implementation, for the distributed modules of this library.
  const std::shared_ptr<GroupState>& state() const { return state_; }

 private:
  explicit Group(std::shared_ptr<GroupState> state) : state_(std::move(state)) {}
  std::shared_ptr<GroupState> state_;
};

}  // namespace distributed
}  // namespace attention
