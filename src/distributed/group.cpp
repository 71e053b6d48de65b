// The process group: torchrun's environment or a store, and c10d's Gloo backend connecting the
// ranks (the transfers are in transfers.cpp, the collectives in collectives.cpp).

#include "distributed/group_state.h"

#include <torch/version.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <future>
#include <limits>
#include <memory>
#include <thread>

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

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Past the start-up's deadline, how long c10d has to report its own failure (with its own
// reason) before the watch below gives up on it: thread scheduling, not a second wait.
constexpr milliseconds kStartupSlack{250};

// What is left until `deadline`, at least 1 ms (c10d takes no zero timeout).
milliseconds left_until(Clock::time_point deadline) {
  return std::max(milliseconds(1),
                  std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
}

// Gloo's connection of this rank to every other one, through `store`, within `limit`.
c10::intrusive_ptr<c10d::ProcessGroupGloo> connect_gloo(
    const c10::intrusive_ptr<c10d::Store>& store, int64_t rank, int64_t world_size,
    const GroupOptions& options, milliseconds limit, const char* caller,
    const std::string& through = "") {
  auto gloo_options = c10d::ProcessGroupGloo::Options::create(limit);
  gloo_options->devices.push_back(gloo_device(options));
  try {
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, static_cast<int>(rank),
                                                       static_cast<int>(world_size), gloo_options);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, caller, ": rank ", rank, " of ", world_size,
                " could not connect to the other ranks", through, " within ",
                options.timeout().count(), " ms. c10d says: ", message_of(e));
  }
}

// Runs `start` on a thread of its own and waits for it until `deadline` (plus the slack): c10d's
// store client can wait without end on a peer that accepts the connection and never answers (a
// port held by some other program), which no timeout of c10d's bounds. In time: its result, or
// its exception. Late: the error below, and the thread is left to end on its own or with the
// process (it holds nothing of the caller's).
std::shared_ptr<GroupState> within_deadline(std::function<std::shared_ptr<GroupState>()> start,
                                            Clock::time_point deadline,
                                            const std::string& late_message) {
  auto task = std::make_shared<std::packaged_task<std::shared_ptr<GroupState>()>>(std::move(start));
  auto result = task->get_future();
  std::thread([task] { (*task)(); }).detach();
  TORCH_CHECK(result.wait_until(deadline + kStartupSlack) == std::future_status::ready,
              late_message);
  return result.get();
}

}  // namespace

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
  state->gloo = connect_gloo(store, rank, world_size, options, options.timeout(), caller);
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
  TORCH_CHECK_VALUE(options.timeout().count() > 0, caller, ": expected a positive timeout, got ",
                    options.timeout().count(), " ms");
  // One deadline for the whole start-up: the store, then Gloo's connections in what is left. The
  // store's host does not wait for its workers (c10d's default would): Gloo's connections wait for
  // every rank anyway, and two waits in a row would double the time a missing rank costs.
  const auto deadline = Clock::now() + options.timeout();
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(port);
  store_options.isServer = rank == 0 && !agent_hosts;
  store_options.numWorkers = static_cast<std::size_t>(world_size);
  store_options.waitWorkers = false;
  store_options.timeout = options.timeout();
  choose_store_backend(store_options);
  const std::string host = addr;
  const std::string store_at = fmt::format("the store at {}:{}", host, port);
  ignore_sigpipe_by_default();
  auto start = [=]() {
    c10::intrusive_ptr<c10d::Store> store;
    try {
      store = c10::make_intrusive<c10d::TCPStore>(host, store_options);
    } catch (const std::exception& e) {
      // Hosting fails at once (the port is taken); reaching it fails at the deadline.
      const std::string failed =
          store_options.isServer
              ? "host " + store_at
              : fmt::format("reach {} within {} ms", store_at, options.timeout().count());
      TORCH_CHECK(false, caller, ": rank ", rank, " of ", world_size, " could not ", failed,
                  ". c10d says: ", message_of(e));
    }
    auto state = std::make_shared<GroupState>();
    state->rank = rank;
    state->size = world_size;
    state->timeout = options.timeout();
    state->gloo = connect_gloo(store, rank, world_size, options, left_until(deadline), caller,
                               " through " + store_at);
    return state;
  };
  return Group(within_deadline(
      start, deadline,
      fmt::format("{}: rank {} of {} could not connect within {} ms: no answer from {} or from "
                  "the other ranks (a program other than a rank may hold that port)",
                  caller, rank, world_size, options.timeout().count(), store_at)));
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

}  // namespace distributed
}  // namespace attention
