// attention::distributed with real processes, started here without torchrun so that one of them
// can die or never come: a rank killed (SIGKILL) in ring attention's forward and in its backward,
// a rank that never starts, and a port held by a program that accepts connections and never
// answers. The others must each report a c10::Error (not Gloo's own exception, a crash or a hang)
// naming the operation or the start-up, the step and the peer, within the group's timeout plus a
// margin. Each rank is tests/distributed_rank.cpp; a run takes about 2 s, most of it loading
// LibTorch.

#include "helpers.h"

#include <fmt/format.h>

#include <fcntl.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

// A namespace of its own: the test files compile in batches, where anonymous names would meet.
namespace killed_rank {

using Clock = std::chrono::steady_clock;
constexpr int64_t kTimeoutMs = 2000;
// Above the timeout: process scheduling on a loaded machine, not a second wait.
constexpr int64_t kMarginMs = 1000;
// The timeout of the ranks whose failure is a peer closing its connection, not a wait running
// out: long enough that three ranks loading LibTorch under the sanitizers on two cores are all
// up before it (2000 ms was not, now and then), while their failure still comes at once.
constexpr int64_t kKilledPeerTimeoutMs = 20000;

// A port nothing listens on (just released by the system).
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
  socklen_t length = sizeof address;
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

// A port held by a program that listens and never answers: connections complete (into its
// backlog) and nothing is ever read or written.
struct SilentListener {
  int fd = -1, port = 0;
  SilentListener() {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
    REQUIRE(listen(fd, 64) == 0);
    socklen_t length = sizeof address;
    getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
    port = ntohs(address.sin_port);
  }
  ~SilentListener() { close(fd); }
};

// tests/distributed_rank.cpp's program: this one, with --distributed-rank first.
std::string rank_program() {
  std::vector<char> path(4096);
  const ssize_t n = readlink("/proc/self/exe", path.data(), path.size() - 1);
  REQUIRE(n > 0);
  return std::string(path.data(), static_cast<size_t>(n));
}

struct Outcome {
  int exit_code = -1, signal = 0;
  int64_t elapsed_ms = -1;
  std::string kind, message, output;
};

// A started rank: its process and the file its output goes to.
struct Rank {
  pid_t pid = 0;
  std::string log;
};

Rank start_rank(int rank, int world, int port, const std::vector<std::string>& extra,
                int64_t timeout_ms = kTimeoutMs) {
  Rank r;
  r.log = fmt::format("distributed_rank_{}_{}_{}.log", getpid(), port, rank);
  std::vector<std::string> env_strings{fmt::format("RANK={}", rank),
                                       fmt::format("WORLD_SIZE={}", world), "MASTER_ADDR=127.0.0.1",
                                       fmt::format("MASTER_PORT={}", port), "OMP_NUM_THREADS=1"};
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const auto name = entry.substr(0, entry.find('='));
    if (name != "RANK" && name != "WORLD_SIZE" && name != "MASTER_ADDR" && name != "MASTER_PORT" &&
        name != "TORCHELASTIC_USE_AGENT_STORE") {
      env_strings.push_back(entry);
    }
  }
  std::vector<std::string> args{rank_program(), "--distributed-rank", "--timeout-ms",
                                std::to_string(timeout_ms)};
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, r.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  REQUIRE(posix_spawn(&r.pid, argv[0], &actions, nullptr, argv.data(), envp.data()) == 0);
  posix_spawn_file_actions_destroy(&actions);
  return r;
}

// Waits for a rank (killing it after `limit`: a rank that hangs fails the test) and reads what
// it printed.
Outcome finish(const Rank& r, std::chrono::seconds limit = std::chrono::seconds(60)) {
  Outcome o;
  const auto give_up = Clock::now() + limit;
  int status = 0;
  while (waitpid(r.pid, &status, WNOHANG) == 0) {
    if (Clock::now() > give_up) {
      kill(r.pid, SIGKILL);
      waitpid(r.pid, &status, 0);
      o.kind = "hung";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (WIFEXITED(status)) o.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) o.signal = WTERMSIG(status);
  o.output = test::read_bytes(r.log);
  std::remove(r.log.c_str());
  std::istringstream lines(o.output);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("elapsed_ms ", 0) == 0) o.elapsed_ms = std::stoll(line.substr(11));
    for (const char* kind : {"error ", "other "}) {
      if (line.rfind(kind, 0) == 0 && o.kind.empty()) {
        o.kind = std::string(kind).substr(0, 5);
        o.message = line.substr(6);
      }
    }
    if (line == "ok" && o.kind.empty()) o.kind = "ok";
  }
  return o;
}

// A survivor: it reported a c10::Error (not another exception, not a crash or hang) containing
// every fragment, within the timeout plus the margin.
void check_survivor(const Outcome& o, const std::vector<std::string>& fragments,
                    int64_t timeout_ms = kTimeoutMs) {
  INFO(o.output);
  CHECK(o.signal == 0);
  CHECK(o.exit_code == 1);
  CHECK(o.kind == "error");
  for (const auto& f : fragments) CHECK_THAT(o.message, test::contains(f));
  CHECK(o.message.find("Exception raised from") == std::string::npos);  // no c10d backtrace
  CHECK(o.elapsed_ms >= 0);
  CHECK(o.elapsed_ms <= timeout_ms + kMarginMs);
}

// Starts 3 ranks, of which `victim` dies in `phase` ("forward" or "backward"), and checks that
// the two survivors report the operation, the phase's step and a peer that closed its
// connection. The first survivor to fail can only have seen the victim's connection close, so at
// least one names the victim; the other may see that survivor close first (it gave up and
// ended), and names it as a peer that stopped or gave up.
void kill_one_of_three(int victim, const std::string& phase) {
  const int port = free_port();
  std::vector<Rank> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.push_back(start_rank(
        r, 3, port,
        r == victim ? std::vector<std::string>{"--die-in", phase} : std::vector<std::string>{},
        kKilledPeerTimeoutMs));
  }
  std::vector<Outcome> outcomes;
  for (const auto& r : ranks) outcomes.push_back(finish(r));
  CHECK(outcomes[victim].signal == SIGKILL);
  const std::string victim_closed = fmt::format("rank {} has closed its connection", victim);
  int naming_victim = 0;
  for (int r = 0; r < 3; ++r) {
    if (r == victim) continue;
    check_survivor(
        outcomes[r],
        {fmt::format("attention::distributed::ring_attention: rank {} of 3 failed while ", r),
         "of " + phase + " step", "has closed its connection: it has stopped, or has given up"},
        kKilledPeerTimeoutMs);
    CHECK(outcomes[r].message.find(fmt::format("rank {} has closed", r)) == std::string::npos);
    if (outcomes[r].message.find(victim_closed) != std::string::npos) ++naming_victim;
  }
  CHECK(naming_victim >= 1);
}

}  // namespace killed_rank

TEST_CASE("processes: a rank killed in ring attention's forward", "[distributed][processes]") {
  killed_rank::kill_one_of_three(2, "forward");
}

TEST_CASE("processes: a rank killed in ring attention's backward", "[distributed][processes]") {
  killed_rank::kill_one_of_three(1, "backward");
}

TEST_CASE("processes: a rank that never starts", "[distributed][processes]") {
  // Ranks 0 and 1 of 3: each fails once, within the timeout (not the store's wait for its workers
  // and then Gloo's connections, a timeout each).
  const int port = killed_rank::free_port();
  std::vector<killed_rank::Rank> ranks;
  for (int r = 0; r < 2; ++r) ranks.push_back(killed_rank::start_rank(r, 3, port, {}));
  for (int r = 0; r < 2; ++r) {
    killed_rank::check_survivor(
        killed_rank::finish(ranks[r]),
        {fmt::format("attention::distributed::Group::from_env: rank {} of 3 could not connect", r),
         fmt::format("within {} ms", killed_rank::kTimeoutMs)});
  }
}

TEST_CASE("processes: a port held by a program that never answers", "[distributed][processes]") {
  const killed_rank::SilentListener holder;
  const std::string at = fmt::format("the store at 127.0.0.1:{}", holder.port);
  // A worker reaches the port and never hears back; rank 0 cannot host the store on it.
  const auto worker = killed_rank::start_rank(1, 2, holder.port, {});
  const auto host = killed_rank::start_rank(0, 2, holder.port, {});
  killed_rank::check_survivor(
      killed_rank::finish(worker),
      {"attention::distributed::Group::from_env: rank 1 of 2 could not", at});
  killed_rank::check_survivor(
      killed_rank::finish(host),
      {"attention::distributed::Group::from_env: rank 0 of 2 could not host " + at});
}
