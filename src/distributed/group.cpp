// The process group: torchrun's environment or a store, c10d's Gloo backend, and the collectives
// the distributed modules use, each bounded by the group's timeout.

#include "distributed/group_state.h"

#include <torch/version.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <limits>

namespace attention {
namespace distributed {
namespace {

// An environment variable that must hold an integer in [low, high].
int64_t env_integer(const char* name, int64_t low, int64_t high) {
  const char* text = std::getenv(name);
  TORCH_CHECK_VALUE(text != nullptr && *text != '\0',
                    "attention::distributed::Group::from_env: the environment variable ", name,
                    " is not set (start the program with torchrun, which sets RANK, WORLD_SIZE, "
                    "MASTER_ADDR and MASTER_PORT, or set them yourself)");
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text, &end, 10);
  TORCH_CHECK_VALUE(errno == 0 && *end == '\0' && value >= low && value <= high,
                    "attention::distributed::Group::from_env: expected ", name,
                    " to be an integer in [", low, ", ", high, "], got '", text, "'");
  return value;
}

std::shared_ptr<::gloo::transport::Device> gloo_device(const GroupOptions& options) {
  if (!options.hostname().empty()) {
    return c10d::ProcessGroupGloo::createDeviceForHostname(options.hostname());
  }
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

// The TCPStore's server backend. From 2.2 LibTorch can serve the store with libuv, the default
// from 2.4, and refuses to start when it was built without libuv (Debian 13's 2.6 is). The
// classic backend speaks the same protocol and is in every version, so it is used unless
// USE_LIBUV=1 asks for libuv (PyTorch's own variable; its default differs).
void choose_store_backend(c10d::TCPStoreOptions& options) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
  const char* use_libuv = std::getenv("USE_LIBUV");
  options.useLibUV = use_libuv != nullptr && std::string(use_libuv) == "1";
#else
  (void)options;
#endif
}

// A write to a rank that has stopped must come back as an error, not end the process (see
// the class comment): SIGPIPE ignored unless the program chose its own action.
void ignore_sigpipe_by_default() {
#if defined(SIGPIPE) && !defined(_WIN32)
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL &&
      !(current.sa_flags & SA_SIGINFO)) {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    sigaction(SIGPIPE, &ignore, nullptr);
  }
#endif
}

}  // namespace

WorkPtr GroupState::send(torch::Tensor& tensor, int64_t to, int tag) {
  std::vector<torch::Tensor> tensors{tensor};
  bytes_sent += static_cast<int64_t>(tensor.nbytes());
  return gloo->send(tensors, static_cast<int>(to), tag);
}

WorkPtr GroupState::recv(torch::Tensor& tensor, int64_t from, int tag) {
  std::vector<torch::Tensor> tensors{tensor};
  return gloo->recv(tensors, static_cast<int>(from), tag);
}

void GroupState::wait(const WorkPtr& work, const std::string& what, const char* caller) const {
  try {
    work->wait(timeout);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, caller, ": rank ", rank, " of ", size, " failed while ", what, " (timeout ",
                timeout.count(),
                " ms); another rank has probably stopped or is not making the same calls. "
                "c10d says: ",
                e.what());
  }
}

Group Group::create(const c10::intrusive_ptr<c10d::Store>& store, int64_t rank, int64_t world_size,
                    const GroupOptions& options) {
  const char* caller = "attention::distributed::Group::create";
  TORCH_CHECK_VALUE(store, caller, ": expected a store, got none");
  TORCH_CHECK_VALUE(world_size >= 1 && world_size <= std::numeric_limits<int>::max(), caller,
                    ": expected world_size >= 1, got ", world_size);
  TORCH_CHECK_VALUE(rank >= 0 && rank < world_size, caller, ": expected rank in [0, ", world_size,
                    "), got ", rank);
  TORCH_CHECK_VALUE(options.timeout().count() > 0, caller, ": expected a positive timeout, got ",
                    options.timeout().count(), " ms");
  auto state = std::make_shared<GroupState>();
  state->rank = rank;
  state->size = world_size;
  state->timeout = options.timeout();
  ignore_sigpipe_by_default();
  auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout());
  gloo_options->devices.push_back(gloo_device(options));
  try {
    state->gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(
        store, static_cast<int>(rank), static_cast<int>(world_size), gloo_options);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, caller, ": rank ", rank, " of ", world_size,
                " could not connect to the other ranks within ", options.timeout().count(),
                " ms. c10d says: ", e.what());
  }
  return Group(std::move(state));
}

Group Group::from_env(const GroupOptions& options) {
  const char* caller = "attention::distributed::Group::from_env";
  const int64_t world_size = env_integer("WORLD_SIZE", 1, std::numeric_limits<int>::max());
  const int64_t rank = env_integer("RANK", 0, world_size - 1);
  const int64_t port = env_integer("MASTER_PORT", 1, 65535);
  const char* addr = std::getenv("MASTER_ADDR");
  TORCH_CHECK_VALUE(addr != nullptr && *addr != '\0', caller,
                    ": the environment variable MASTER_ADDR is not set (torchrun sets it)");
  // torchrun either hosts the store itself (and says so) or leaves it to rank 0.
  const char* agent_store = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  const bool agent_hosts = agent_store != nullptr && std::string(agent_store) == "True";
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(port);
  store_options.isServer = rank == 0 && !agent_hosts;
  store_options.numWorkers = static_cast<std::size_t>(world_size);
  store_options.timeout = options.timeout();
  choose_store_backend(store_options);
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(addr, store_options);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, caller, ": rank ", rank, " of ", world_size,
                " could not reach the store at ", addr, ":", port, " within ",
                options.timeout().count(), " ms. c10d says: ", e.what());
  }
  return create(store, rank, world_size, options);
}

int64_t Group::rank() const {
  return state_->rank;
}

int64_t Group::size() const {
  return state_->size;
}

std::chrono::milliseconds Group::timeout() const {
  return state_->timeout;
}

int64_t Group::bytes_sent() const {
  return state_->bytes_sent.load();
}

void Group::all_reduce_sum(torch::Tensor& tensor, const char* caller) const {
  TORCH_CHECK_VALUE(tensor.defined() && tensor.device().is_cpu() && tensor.is_contiguous(), caller,
                    ": all_reduce_sum expected a contiguous CPU tensor");
  if (state_->size == 1) return;
  std::vector<torch::Tensor> tensors{tensor};
  // A ring all-reduce sends about twice the tensor's bytes from each rank.
  state_->bytes_sent +=
      2 * static_cast<int64_t>(tensor.nbytes()) * (state_->size - 1) / state_->size;
  state_->wait(state_->gloo->allreduce(tensors),
               fmt::format("summing a tensor of shape {} over the ranks", tensor.sizes()), caller);
}

std::vector<torch::Tensor> Group::all_gather(const torch::Tensor& tensor,
                                             const char* caller) const {
  auto input = tensor.contiguous();
  if (state_->size == 1) return {input};
  std::vector<std::vector<torch::Tensor>> outputs(1);
  for (int64_t r = 0; r < state_->size; ++r) outputs[0].push_back(torch::empty_like(input));
  std::vector<torch::Tensor> inputs{input};
  state_->bytes_sent += static_cast<int64_t>(input.nbytes()) * (state_->size - 1);
  state_->wait(state_->gloo->allgather(outputs, inputs),
               fmt::format("gathering a tensor of shape {} from every rank", input.sizes()),
               caller);
  return outputs[0];
}

void Group::check_same(const std::vector<int64_t>& values, const char* what,
                       const char* caller) const {
  if (state_->size == 1) return;
  // Gathered with their count first, so that ranks passing different numbers of values do not
  // make a gather of mismatched sizes.
  auto counts = all_gather(torch::tensor({static_cast<int64_t>(values.size())}), caller);
  for (int64_t r = 0; r < state_->size; ++r) {
    TORCH_CHECK_VALUE(counts[r].item<int64_t>() == static_cast<int64_t>(values.size()), caller,
                      ": every rank must pass the same ", what, "; rank ", state_->rank, " has ",
                      values.size(), " values, rank ", r, " has ", counts[r].item<int64_t>());
  }
  if (values.empty()) return;
  auto all = all_gather(torch::tensor(values), caller);
  for (int64_t r = 0; r < state_->size; ++r) {
    const auto theirs = std::vector<int64_t>(all[r].data_ptr<int64_t>(),
                                             all[r].data_ptr<int64_t>() + all[r].numel());
    TORCH_CHECK_VALUE(theirs == values, caller, ": every rank must pass the same ", what, "; rank ",
                      state_->rank, " has ", fmt::format("{}", values), ", rank ", r, " has ",
                      fmt::format("{}", theirs));
  }
}

}  // namespace distributed
}  // namespace attention
