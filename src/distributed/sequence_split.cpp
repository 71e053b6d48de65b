// The split of a sequence across the ranks: contiguous, or balanced for causal attention (chunks
// r and 2W-1-r of 2W), the gather that undoes it, and the padding that lets any length split.

#include <attention/distributed/sequence_split.h>

#include "checks.h"
#include "distributed/group_state.h"

#include <torch/autograd.h>
#include <torch/torch.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <vector>

namespace attention {
namespace distributed {
namespace {

using torch::Tensor;

int64_t checked_dim(const Tensor& t, int64_t dim, const char* caller) {
  TORCH_CHECK_VALUE(
      t.defined() && t.dim() > 0, caller, ": expected a tensor of rank >= 1, got ",
      (t.defined() ? detail::shape_str(t.sizes()) : std::string("an undefined tensor")));
  TORCH_CHECK_VALUE(dim >= -t.dim() && dim < t.dim(), caller, ": expected dim in [", -t.dim(), ", ",
                    t.dim(), ") for a tensor of rank ", t.dim(), ", got ", dim);
  return dim < 0 ? dim + t.dim() : dim;
}

// This rank's positions of a whole sequence: chunk r of W, or chunks r and 2W-1-r of 2W.
Tensor own_positions(const Tensor& full, int64_t dim, int64_t w, int64_t r, bool balanced) {
  const int64_t chunk = full.size(dim) / (balanced ? 2 * w : w);
  if (!balanced) return full.narrow(dim, r * chunk, chunk);
  return torch::cat(
      {full.narrow(dim, r * chunk, chunk), full.narrow(dim, (2 * w - 1 - r) * chunk, chunk)}, dim);
}

// The gather as an autograd function: the gradient of the whole sequence reaches each rank's
// shard as its own positions of it, without communication.
class GatherSequence : public torch::autograd::Function<GatherSequence> {
 public:
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& local, int64_t dim,
                        bool balanced, const Group& group) {
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["balanced"] = balanced;
    ctx->saved_data["world"] = group.size();
    ctx->saved_data["rank"] = group.rank();
    const auto shards =
        gather_same(*group.state(), local.detach().cpu(),
                    fmt::format("a shard of shape {} gathered from every rank", local.sizes()),
                    "attention::distributed::gather_sequence");
    const int64_t w = group.size();
    if (!balanced) return torch::cat(shards, dim).to(local.device());
    const int64_t chunk = local.size(dim) / 2;
    std::vector<Tensor> pieces(2 * w);
    for (int64_t r = 0; r < w; ++r) {
      pieces[r] = shards[r].narrow(dim, 0, chunk);
      pieces[2 * w - 1 - r] = shards[r].narrow(dim, chunk, chunk);
    }
    return torch::cat(pieces, dim).to(local.device());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto& saved = ctx->saved_data;
    return {own_positions(grads[0], saved.at("dim").toInt(), saved.at("world").toInt(),
                          saved.at("rank").toInt(), saved.at("balanced").toBool()),
            Tensor(), Tensor(), Tensor()};
  }
};

}  // namespace

PaddedSequence pad_to_split(const Tensor& full, int64_t dim, const Group& group, bool balanced) {
  dim = checked_dim(full, dim, "attention::distributed::pad_to_split");
  const int64_t pieces = balanced ? 2 * group.size() : group.size();
  PaddedSequence out;
  out.length = full.size(dim);
  // A tensor's length times its element size fits in memory, so this cannot overflow.
  const int64_t padded = (out.length + pieces - 1) / pieces * pieces;
  if (padded == out.length) {
    out.padded = full;
  } else {
    std::vector<int64_t> shape = full.sizes().vec();
    shape[dim] = padded - out.length;
    out.padded = torch::cat({full, torch::zeros(shape, full.options())}, dim);
  }
  out.padding = torch::arange(padded, torch::TensorOptions().device(full.device())) >= out.length;
  return out;
}

Tensor shard_sequence(const Tensor& full, int64_t dim, const Group& group, bool balanced) {
  const char* caller = "attention::distributed::shard_sequence";
  dim = checked_dim(full, dim, caller);
  const int64_t w = group.size(), r = group.rank(), pieces = balanced ? 2 * w : w;
  TORCH_CHECK_VALUE(full.size(dim) % pieces == 0, caller, ": expected a length along dim ", dim,
                    " divisible by ", pieces, " (", balanced ? "2 x " : "", w, " ranks), got ",
                    full.size(dim));
  return own_positions(full, dim, w, r, balanced);
}

Tensor gather_sequence(const Tensor& local, int64_t dim, const Group& group, bool balanced) {
  const char* caller = "attention::distributed::gather_sequence";
  // A shard one rank refuses stops every rank at once (check_same carries the refusal).
  std::exception_ptr error;
  try {
    dim = checked_dim(local, dim, caller);
    TORCH_CHECK_VALUE(!balanced || local.size(dim) % 2 == 0, caller,
                      ": a balanced shard holds two chunks, so an even length along dim ", dim,
                      "; got ", local.size(dim));
  } catch (...) {
    error = std::current_exception();
  }
  std::vector<int64_t> values{-1};
  if (!error) {
    values = {dim, balanced, static_cast<int64_t>(local.scalar_type())};
    values.insert(values.end(), local.sizes().begin(), local.sizes().end());
  }
  group.check_same(values, "dim, split, dtype and shape", caller, error);
  return GatherSequence::apply(local, dim, balanced, group);
}

}  // namespace distributed
}  // namespace attention
