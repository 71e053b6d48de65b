// The group's transfers: Gloo's sends and receives, each waited for until a deadline, and every
// failure of a peer (a closed connection, no answer in time, a refused send) turned into a
// c10::Error that names the operation, the step and the peer. Gloo reports these with its own
// exception types, thrown from the call that starts a transfer as well as from the wait; a
// program that catches c10::Error must never see them.

#include "distributed/group_state.h"

#include <fmt/format.h>

#include <algorithm>
#include <regex>

namespace attention {
namespace distributed {
namespace {

enum class Cause { kClosed, kTimedOut, kOther };

struct Diagnosis {
  Cause cause = Cause::kOther;
  std::string detail;  // Gloo's or c10d's words, without location, address or backtrace
};

Diagnosis diagnose(const std::exception& e) {
  std::string text = message_of(e);
  // Gloo starts with "[file:line] " and names the peer by an address whose port it prints in
  // network byte order; the message names the peer by rank instead.
  static const std::regex location(R"(^\[[^\]]*\] )"), address(R"( ?\[[^\]]*\]:[0-9]+)");
  text = std::regex_replace(std::regex_replace(text, location, ""), address, "");
  Diagnosis d{Cause::kOther, text};
  const auto has = [&](const char* part) { return text.find(part) != std::string::npos; };
  if (has("imed out") || has("imeout")) {
    d.cause = Cause::kTimedOut;
  } else if (has("closed") || has("reset by peer") || has("Broken pipe") || has("refused") ||
             has("EOF")) {
    d.cause = Cause::kClosed;
  }
  return d;
}

std::string direction(const Transfer& t) {
  return fmt::format("{} {} {} rank {}", t.sending ? "sending" : "receiving", t.what,
                     t.sending ? "to" : "from", t.peer);
}

std::string reason(const Diagnosis& d, int64_t peer, std::chrono::milliseconds timeout) {
  switch (d.cause) {
    case Cause::kClosed:
      return fmt::format(
          "rank {} has closed its connection: it has stopped, or has given up after a failure "
          "of its own (Gloo: {})",
          peer, d.detail);
    case Cause::kTimedOut:
      return fmt::format(
          "rank {} did not answer within {} ms: it has stopped, hangs, or is not making the "
          "same calls (Gloo: {})",
          peer, timeout.count(), d.detail);
    case Cause::kOther:
      break;
  }
  return d.detail;
}

}  // namespace

std::string message_of(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string text = c10_error ? c10_error->what_without_backtrace() : e.what();
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

void GroupState::check_usable(const char* caller) const {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(failure_.empty(), caller, ": rank ", rank, " of ", size,
              ": this group failed earlier and cannot be used any more (make a new one). The "
              "first failure: ",
              failure_);
}

void GroupState::fail(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure_.empty()) failure_ = message;
  }
  TORCH_CHECK(false, message);
}

Transfer GroupState::start(Transfer t, const torch::Tensor& tensor, int tag, const char* caller) {
  std::vector<torch::Tensor> tensors{tensor};
  try {
    const int peer = static_cast<int>(t.peer);
    t.work = t.sending ? gloo->send(tensors, peer, tag) : gloo->recv(tensors, peer, tag);
  } catch (const std::exception& e) {
    fail(fmt::format("{}: rank {} of {} failed while {}: {}. The group cannot be used any more",
                     caller, rank, size, direction(t), reason(diagnose(e), t.peer, timeout)));
  }
  if (t.sending) bytes_sent += static_cast<int64_t>(tensor.nbytes());
  return t;
}

Transfer GroupState::send(const torch::Tensor& tensor, int64_t to, int tag, std::string what,
                          const char* caller) {
  return start(Transfer{{}, to, true, std::move(what)}, tensor, tag, caller);
}

Transfer GroupState::recv(const torch::Tensor& tensor, int64_t from, int tag, std::string what,
                          const char* caller) {
  return start(Transfer{{}, from, false, std::move(what)}, tensor, tag, caller);
}

void GroupState::wait(const std::vector<Transfer>& transfers, Clock::time_point deadline,
                      const char* caller) {
  for (size_t i = 0; i < transfers.size(); ++i) {
    // c10d reads a wait of 0 ms as "no limit": at least 1 ms is left.
    const auto left =
        std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()),
                 std::chrono::milliseconds(1));
    try {
      transfers[i].work->wait(left);
    } catch (const std::exception& e) {
      const auto& t = transfers[i];
      std::string message = fmt::format("{}: rank {} of {} failed while {}: {}", caller, rank, size,
                                        direction(t), reason(diagnose(e), t.peer, timeout));
      // A rank that has given up closes its connections too: the transfers still in flight say
      // whether another peer has failed as well (the one that stopped first may be that one).
      // A wait of 1 ms tells a failed transfer from one still running; at most 16 are asked.
      const size_t last = std::min(transfers.size(), i + 17);
      for (size_t j = i + 1; j < last; ++j) {
        try {
          transfers[j].work->wait(std::chrono::milliseconds(1));
        } catch (const std::exception& other) {
          const auto d = diagnose(other);
          if (d.cause == Cause::kClosed) {
            message += fmt::format("; {} failed too: rank {} has closed its connection",
                                   direction(transfers[j]), transfers[j].peer);
          }
        }
      }
      fail(message + ". The group cannot be used any more");
    }
  }
}

void GroupState::exchange(const std::vector<torch::Tensor>& outgoing,
                          const std::vector<torch::Tensor>& incoming, int tag,
                          const std::string& what, const char* caller) {
  const auto deadline = this->deadline();
  std::vector<Transfer> transfers;
  for (int64_t r = 0; r < size; ++r) {
    if (r == rank) continue;
    if (incoming[r].numel() > 0) transfers.push_back(recv(incoming[r], r, tag, what, caller));
    if (outgoing[r].numel() > 0) transfers.push_back(send(outgoing[r], r, tag, what, caller));
  }
  wait(transfers, deadline, caller);
}

}  // namespace distributed
}  // namespace attention
