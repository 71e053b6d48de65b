#include <attention/lightning_indexer.h>

#include "checks.h"
#include "kernels/cpu/top_k.h"
#include "memory/empty_large.h"
#include "modules/shared.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace attention {

namespace {

constexpr const char* kLightningIndexerName = "attention::LightningIndexer";
// Elements of one block's per-head scores (B x heads x queries x keys), and most queries in a
// block: a block scores the keys up to its last query, so smaller blocks skip more of the keys
// after their queries.
constexpr int64_t kBlockElements = int64_t{1} << 24;
constexpr int64_t kMaxBlockQueries = 256;

// The top `width` columns of each row of `scores` (B, T, S), the earlier column first among equal
// scores, as ascending positions; -1 for those after each row's query (at `positions`, (T, 1)),
// and -1 to fill rows of fewer than `width` columns.
torch::Tensor select_top_k(torch::Tensor scores, const torch::Tensor& positions, int64_t width) {
  const int64_t b = scores.size(0), t = scores.size(1), s = scores.size(2);
  const int64_t k = std::min(width, s);
  // A NaN score ranks below every other: the selection stays k per row.
  scores = scores.masked_fill(scores.isnan(), -std::numeric_limits<double>::infinity());
  const auto threshold = std::get<0>(scores.topk(k, -1)).narrow(-1, k - 1, 1);
  const auto above = scores.gt(threshold), at = scores.eq(threshold);
  const auto missing = k - above.sum(-1, /*keepdim=*/true);
  const auto chosen = above.logical_or(at.logical_and(at.cumsum(-1).le(missing)));
  auto indices = chosen.nonzero().select(1, 2).view({b, t, k});
  indices = indices.masked_fill(indices.gt(positions), -1);
  if (k < width) indices = torch::cat({indices, indices.new_full({b, t, width - k}, -1)}, -1);
  return indices;
}

}  // namespace

LightningIndexerImpl::LightningIndexerImpl(const LightningIndexerOptions& options_)
    : options(options_) {
  reset();
}

void LightningIndexerImpl::reset() {
  const auto& o = options;
  detail::check_positive(o.d_model(), "d_model", kLightningIndexerName);
  detail::check_positive(o.index_n_heads(), "index_n_heads", kLightningIndexerName);
  detail::check_positive(o.index_head_dim(), "index_head_dim", kLightningIndexerName);
  TORCH_CHECK_VALUE(o.index_head_dim() <= std::numeric_limits<int64_t>::max() / o.index_n_heads(),
                    kLightningIndexerName, ": index_n_heads x index_head_dim = ", o.index_n_heads(),
                    " x ", o.index_head_dim(), " overflows int64");
  using torch::nn::Linear;
  using torch::nn::LinearOptions;
  W_q_index = register_module(
      "W_q_index",
      Linear(LinearOptions(o.d_model(), o.index_n_heads() * o.index_head_dim()).bias(false)));
  W_k_index = register_module("W_k_index",
                              Linear(LinearOptions(o.d_model(), o.index_head_dim()).bias(false)));
  W_weights = register_module("W_weights",
                              Linear(LinearOptions(o.d_model(), o.index_n_heads()).bias(false)));
}

void LightningIndexerImpl::pretty_print(std::ostream& stream) const {
  stream << kLightningIndexerName << "(d_model=" << options.d_model()
         << ", index_n_heads=" << options.index_n_heads()
         << ", index_head_dim=" << options.index_head_dim() << ")";
}

torch::Tensor LightningIndexerImpl::keys(const torch::Tensor& x) {
  detail::check_module_input(x, options.d_model(), W_k_index->weight, kLightningIndexerName, "x");
  return W_k_index(x);
}

int64_t LightningIndexerImpl::check_inputs(const torch::Tensor& x,
                                           const torch::Tensor& index_keys) const {
  detail::check_module_input(x, options.d_model(), W_q_index->weight, kLightningIndexerName, "x");
  TORCH_CHECK_VALUE(x.dim() == 3, kLightningIndexerName, ": expected x (B, T, ", options.d_model(),
                    "), got ", detail::shape_str(x.sizes()));
  const int64_t b = x.size(0), t = x.size(1);
  TORCH_CHECK_VALUE(index_keys.defined() && index_keys.dim() == 3 && index_keys.size(0) == b &&
                        index_keys.size(1) >= t && index_keys.size(2) == options.index_head_dim(),
                    kLightningIndexerName, ": expected index_keys (", b, ", S >= ", t, ", ",
                    options.index_head_dim(), ") for x ", detail::shape_str(x.sizes()), ", got ",
                    index_keys.defined() ? detail::shape_str(index_keys.sizes()) : "undefined");
  TORCH_CHECK_TYPE(index_keys.scalar_type() == x.scalar_type(), kLightningIndexerName,
                   ": expected index_keys of x's dtype ", x.scalar_type(), ", got ",
                   index_keys.scalar_type());
  TORCH_CHECK(index_keys.device() == x.device(), kLightningIndexerName,
              ": expected index_keys on x's device ", x.device(), ", got ", index_keys.device());
  return index_keys.size(1) - t;
}

torch::Tensor LightningIndexerImpl::block_scores(const torch::Tensor& queries,
                                                 const torch::Tensor& weights,
                                                 const torch::Tensor& index_keys, int64_t offset,
                                                 int64_t t0, int64_t t1, torch::Tensor* buffers) {
  const int64_t seen = offset + t1;
  const double scale = 1.0 / std::sqrt(static_cast<double>(options.index_head_dim()));
  // Rows (query, head) against every key they may see in one product, (B, rows x heads, seen);
  // then each head's ReLU(q · k) scaled, weighted and summed over the heads.
  const int64_t b = queries.size(0), rows = t1 - t0, heads = queries.size(2);
  const auto block = queries.narrow(1, t0, rows).reshape({b, rows * heads, queries.size(3)});
  const auto keys = index_keys.narrow(1, 0, seen).transpose(1, 2);
  if (buffers == nullptr) {
    const auto raw = torch::relu(block.bmm(keys) * scale).view({b, rows, heads, seen});
    return (raw * weights.narrow(1, t0, rows).unsqueeze(-1)).sum(2);
  }
  // The same into the call's buffers: a fresh tensor of this size would be faulted in page by
  // page at every block.
  auto raw =
      buffers[0].flatten().narrow(0, 0, b * rows * heads * seen).view({b, rows * heads, seen});
  at::bmm_out(raw, block, keys);
  raw.mul_(scale).relu_();
  auto weighted = raw.view({b, rows, heads, seen}).mul_(weights.narrow(1, t0, rows).unsqueeze(-1));
  auto scores = buffers[1].flatten().narrow(0, 0, b * rows * seen).view({b, rows, seen});
  at::sum_out(scores, weighted, {2});
  return scores;
}

torch::Tensor LightningIndexerImpl::scores(const torch::Tensor& x,
                                           const torch::Tensor& index_keys) {
  const int64_t offset = check_inputs(x, index_keys), b = x.size(0), t = x.size(1);
  const auto queries = W_q_index(x).view({b, t, options.index_n_heads(), options.index_head_dim()});
  const auto weights = torch::softmax(W_weights(x), -1);  // (B, T, heads)
  const auto scores = block_scores(queries, weights, index_keys, offset, 0, t, nullptr);
  // Keys after each query are not its to choose.
  const auto position = torch::arange(offset, offset + t, x.options().dtype(at::kLong));
  const auto later =
      torch::arange(offset + t, position.options()).unsqueeze(0).gt(position.unsqueeze(1));
  return scores.masked_fill(later, -std::numeric_limits<double>::infinity());
}

torch::Tensor LightningIndexerImpl::forward(const torch::Tensor& x, const torch::Tensor& index_keys,
                                            int64_t topk) {
  const int64_t offset = check_inputs(x, index_keys), b = x.size(0), t = x.size(1);
  TORCH_CHECK_VALUE(topk >= 1, kLightningIndexerName, ": expected topk >= 1, got ", topk);
  // The choice has no gradient (the book's indexer gets none through its top-k either).
  torch::NoGradGuard no_grad;
  const int64_t s = index_keys.size(1), heads = options.index_n_heads();
  // The book's cap: no more selected keys than there are keys.
  const int64_t width = std::min(topk, s);
  const auto queries = W_q_index(x).view({b, t, heads, options.index_head_dim()});
  const auto weights = torch::softmax(W_weights(x), -1);
  const int64_t block = std::clamp<int64_t>(kBlockElements / std::max<int64_t>(1, b * heads * s), 1,
                                            kMaxBlockQueries);
  auto chosen = torch::empty({b, t, width}, x.options().dtype(at::kLong));
  const bool in_place =
      x.device().is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble);
  torch::Tensor buffers[2];
  if (in_place) {
    buffers[0] = detail::empty_large({b * block * heads * s}, x.options());
    buffers[1] = detail::empty_large({b * block * s}, x.options());
  }
  for (int64_t t0 = 0; t0 < t; t0 += block) {
    const int64_t t1 = std::min(t, t0 + block), rows = t1 - t0, seen = offset + t1;
    const auto scores =
        block_scores(queries, weights, index_keys, offset, t0, t1, in_place ? buffers : nullptr);
    if (in_place) {
      // Row i of the block sees the keys up to its own position.
      std::vector<int64_t> visible(rows);
      std::iota(visible.begin(), visible.end(), offset + t0 + 1);
      AT_DISPATCH_FLOATING_TYPES(scores.scalar_type(), "LightningIndexer", [&] {
        for (int64_t i = 0; i < b; ++i) {
          kernels::cpu::top_k_rows(scores[i].data_ptr<scalar_t>(), rows, seen, visible.data(),
                                   width, width, chosen[i].narrow(0, t0, rows).data_ptr<int64_t>());
        }
      });
    } else {
      const auto positions =
          torch::arange(offset + t0, offset + t1, x.options().dtype(at::kLong)).unsqueeze(1);
      const auto later = torch::arange(seen, positions.options()).unsqueeze(0).gt(positions);
      chosen.narrow(1, t0, rows)
          .copy_(select_top_k(scores.masked_fill(later, -std::numeric_limits<double>::infinity()),
                              positions, width));
    }
  }
  return chosen;
}

}  // namespace attention
