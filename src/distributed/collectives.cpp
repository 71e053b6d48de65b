// The group's collectives, written on its point-to-point transfers so that a failure names its
// peer: the check that every rank has the same problem (and that none refused its own input),
// gathering a tensor from every rank, and summing one over the ranks.
//
// The check's wire format (for ranks written in other languages; examples/ring_attention/
// python_rank.py is one): every rank sends every other rank 20 int64 values with tag
// tags::kCheck, [error kind (0 = none), message bytes, number of values n, the first 17 values,
// zero-padded]. When a rank has an error or some n exceeds 17, every rank then sends every other
// one its n values (int64) followed by its message (UTF-8), as bytes, with tag
// tags::kCheckDetails; every rank knows every size from the first exchange.

#include "distributed/group_state.h"

#include <torch/torch.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>

namespace attention {
namespace distributed {
namespace {

using torch::Tensor;

constexpr int64_t kHeader = 20, kInlineValues = kHeader - 3;
// Bounds on what a rank may send in a check, so that a peer speaking another protocol cannot
// make this one allocate without bound.
constexpr int64_t kMaxValues = 4096, kMaxMessage = 16384;

enum ErrorKind : int64_t { kNone, kValue, kType, kIndex, kNotImplemented, kOther };

std::pair<int64_t, std::string> kind_and_message(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::ValueError& e) {
    return {kValue, e.what_without_backtrace()};
  } catch (const c10::TypeError& e) {
    return {kType, e.what_without_backtrace()};
  } catch (const c10::IndexError& e) {
    return {kIndex, e.what_without_backtrace()};
  } catch (const c10::NotImplementedError& e) {
    return {kNotImplemented, e.what_without_backtrace()};
  } catch (const std::exception& e) {
    return {kOther, message_of(e)};
  } catch (...) {
    return {kOther, "an exception that is not a std::exception"};
  }
}

// Throws `message` as the c10 error of `kind`.
void throw_as(int64_t kind, const std::string& message) {
  TORCH_CHECK_VALUE(kind != kValue, message);
  TORCH_CHECK_TYPE(kind != kType, message);
  TORCH_CHECK_INDEX(kind != kIndex, message);
  TORCH_CHECK_NOT_IMPLEMENTED(kind != kNotImplemented, message);
  TORCH_CHECK(false, message);
}

// What one rank said in a check.
struct Said {
  int64_t kind = kNone;
  std::vector<int64_t> values;
  std::string message;
};

std::vector<Tensor> all_peers(const GroupState& s, const Tensor& t) {
  return std::vector<Tensor>(s.size, t);
}

// [begin, end) of part `j` of `n` elements cut into `parts` (the first n % parts one longer).
std::pair<int64_t, int64_t> part_of(int64_t n, int64_t parts, int64_t j) {
  const int64_t base = n / parts, extra = n % parts;
  const int64_t begin = base * j + std::min(j, extra);
  return {begin, begin + base + (j < extra ? 1 : 0)};
}

void check_cpu(const Tensor& tensor, const char* caller, const char* function) {
  TORCH_CHECK_VALUE(tensor.defined() && tensor.device().is_cpu(), caller, ": ", function,
                    " expected a CPU tensor, got ",
                    tensor.defined() ? tensor.device().str() : std::string("an undefined one"));
}

}  // namespace

std::vector<Tensor> gather_same(GroupState& s, const Tensor& tensor, const std::string& what,
                                const char* caller) {
  s.check_usable(caller);
  const auto input = tensor.contiguous();
  std::vector<Tensor> gathered(s.size);
  for (int64_t r = 0; r < s.size; ++r) gathered[r] = r == s.rank ? input : torch::empty_like(input);
  if (s.size > 1) s.exchange(all_peers(s, input), gathered, tags::kGather, what, caller);
  return gathered;
}

void reduce_same(GroupState& s, Tensor& tensor, const std::string& what, const char* caller) {
  s.check_usable(caller);
  if (s.size == 1) return;
  auto flat = tensor.view({-1});
  const int64_t n = flat.numel();
  const auto part = [&](const Tensor& t, int64_t j) {
    const auto [begin, end] = part_of(n, s.size, j);
    return t.narrow(0, begin, end - begin);
  };
  // Each rank receives its part from every other rank and sums the parts in rank order...
  std::vector<Tensor> outgoing(s.size), incoming(s.size);
  for (int64_t r = 0; r < s.size; ++r) {
    outgoing[r] = part(flat, r);
    incoming[r] = r == s.rank ? part(flat, r) : torch::empty_like(part(flat, s.rank));
  }
  s.exchange(outgoing, incoming, tags::kReduce, what, caller);
  auto mine = part(flat, s.rank);
  auto sum = incoming[0].clone();
  for (int64_t r = 1; r < s.size; ++r) sum.add_(incoming[r]);
  mine.copy_(sum);
  // ...and sends the sum to every other rank, which receives it in place.
  for (int64_t r = 0; r < s.size; ++r) incoming[r] = part(flat, r);
  s.exchange(all_peers(s, mine), incoming, tags::kReduced, what, caller);
}

void Group::check_same(const std::vector<int64_t>& values, const char* what, const char* caller,
                       const std::exception_ptr& local_error) const {
  auto& s = *state_;
  s.check_usable(caller);
  Said mine{kNone, values, ""};
  if (local_error) std::tie(mine.kind, mine.message) = kind_and_message(local_error);
  // Too many values is this rank's own error, which the others must learn of too.
  if (!local_error && static_cast<int64_t>(values.size()) > kMaxValues) {
    mine.kind = kValue;
    mine.message = fmt::format("{}: check_same takes at most {} values, got {}", caller, kMaxValues,
                               values.size());
  }
  if (mine.kind != kNone) mine.values.clear();
  if (mine.message.size() > static_cast<size_t>(kMaxMessage)) {
    mine.message = mine.message.substr(0, kMaxMessage - 3) + "...";
  }
  if (s.size == 1) {
    if (local_error) std::rethrow_exception(local_error);
    if (mine.kind != kNone) throw_as(mine.kind, mine.message);
    return;
  }
  const std::string step = fmt::format("the check that every rank has the same {}", what);

  auto header = torch::zeros({kHeader}, torch::kLong);
  auto* h = header.data_ptr<int64_t>();
  h[0] = mine.kind;
  h[1] = static_cast<int64_t>(mine.message.size());
  h[2] = static_cast<int64_t>(mine.values.size());
  std::copy_n(mine.values.begin(), std::min<int64_t>(mine.values.size(), kInlineValues), h + 3);
  std::vector<Tensor> headers(s.size);
  for (int64_t r = 0; r < s.size; ++r) {
    headers[r] = r == s.rank ? header : torch::empty({kHeader}, torch::kLong);
  }
  s.exchange(all_peers(s, header), headers, tags::kCheck, step, caller);

  std::vector<Said> said(s.size);
  bool details = false;
  for (int64_t r = 0; r < s.size; ++r) {
    const auto* theirs = headers[r].data_ptr<int64_t>();
    TORCH_CHECK(theirs[0] >= kNone && theirs[0] <= kOther && theirs[1] >= 0 &&
                    theirs[1] <= kMaxMessage && theirs[2] >= 0 && theirs[2] <= kMaxValues,
                caller, ": rank ", r, " sent a check this rank cannot read (", headers[r].sizes(),
                "): it does not speak this library's protocol");
    said[r].kind = theirs[0];
    said[r].values.assign(theirs + 3, theirs + 3 + std::min(theirs[2], kInlineValues));
    details = details || theirs[0] != kNone || theirs[2] > kInlineValues;
  }
  if (details) {
    const auto bytes = [](int64_t count, int64_t message) { return 8 * count + message; };
    auto payload = torch::empty({bytes(h[2], h[1])}, torch::kUInt8);
    // (memcpy is never given the null pointer of an empty tensor or vector.)
    if (!mine.values.empty()) {
      std::memcpy(payload.data_ptr(), mine.values.data(), 8 * mine.values.size());
    }
    if (!mine.message.empty()) {
      std::memcpy(payload.data_ptr<uint8_t>() + 8 * mine.values.size(), mine.message.data(),
                  mine.message.size());
    }
    std::vector<Tensor> payloads(s.size);
    for (int64_t r = 0; r < s.size; ++r) {
      const auto* theirs = headers[r].data_ptr<int64_t>();
      payloads[r] =
          r == s.rank ? payload : torch::empty({bytes(theirs[2], theirs[1])}, torch::kUInt8);
    }
    s.exchange(all_peers(s, payload), payloads, tags::kCheckDetails, step, caller);
    for (int64_t r = 0; r < s.size; ++r) {
      const auto* theirs = headers[r].data_ptr<int64_t>();
      const auto* bytes_r = payloads[r].data_ptr<uint8_t>();
      if (payloads[r].numel() == 0) continue;
      said[r].values.resize(theirs[2]);
      if (theirs[2] > 0) std::memcpy(said[r].values.data(), bytes_r, 8 * theirs[2]);
      said[r].message.assign(reinterpret_cast<const char*>(bytes_r) + 8 * theirs[2], theirs[1]);
    }
  }

  // Every rank decides from the same information, so every rank throws the same error.
  std::vector<int64_t> refused;
  for (int64_t r = 0; r < s.size; ++r) {
    if (said[r].kind != kNone) refused.push_back(r);
  }
  if (!refused.empty()) {
    const int64_t first = refused[0];
    const std::string others =
        refused.size() == 1 ? ""
                            : fmt::format(" (ranks {} failed too)",
                                          fmt::join(refused.begin() + 1, refused.end(), ", "));
    throw_as(said[first].kind,
             fmt::format("{}: rank {} of {} failed{}, so every rank stops here. Rank {}: {}",
                         caller, first, s.size, others, first, said[first].message));
  }
  for (int64_t r = 1; r < s.size; ++r) {
    TORCH_CHECK_VALUE(said[r].values == said[0].values, caller, ": every rank must pass the same ",
                      what, "; rank 0 has ", fmt::format("{}", said[0].values), ", rank ", r,
                      " has ", fmt::format("{}", said[r].values));
  }
}

std::vector<Tensor> Group::all_gather(const Tensor& tensor, const char* caller) const {
  std::exception_ptr error;
  try {
    check_cpu(tensor, caller, "all_gather");
  } catch (...) {
    error = std::current_exception();
  }
  std::vector<int64_t> shape{error ? -1 : static_cast<int64_t>(tensor.scalar_type())};
  if (!error) shape.insert(shape.end(), tensor.sizes().begin(), tensor.sizes().end());
  check_same(shape, "dtype and shape of the tensor to gather", caller, error);
  return gather_same(*state_, tensor,
                     fmt::format("a tensor of shape {} gathered from every rank", tensor.sizes()),
                     caller);
}

void Group::all_reduce_sum(Tensor& tensor, const char* caller) const {
  std::exception_ptr error;
  try {
    check_cpu(tensor, caller, "all_reduce_sum");
    TORCH_CHECK_VALUE(tensor.is_contiguous(), caller,
                      ": all_reduce_sum expected a contiguous tensor (it sums in place)");
  } catch (...) {
    error = std::current_exception();
  }
  std::vector<int64_t> shape{error ? -1 : static_cast<int64_t>(tensor.scalar_type())};
  if (!error) shape.insert(shape.end(), tensor.sizes().begin(), tensor.sizes().end());
  check_same(shape, "dtype and shape of the tensor to sum", caller, error);
  reduce_same(*state_, tensor,
              fmt::format("a part of a tensor of shape {} summed over the ranks", tensor.sizes()),
              caller);
}

}  // namespace distributed
}  // namespace attention
