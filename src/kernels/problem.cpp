#include "kernels/problem.h"

#include "checks.h"
#include "functional/enum_checks.h"
#include "functional/relative_buckets.h"
#include "kernels/paged.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <memory>
#include <utility>

namespace attention {
namespace kernels {
namespace {

using detail::shape_str;

// The dtypes every backend computes in: floating, and not half on the CPU (LibTorch has no CPU
// products in half precision: said here rather than deep in a kernel).
void check_dtype(at::ScalarType dtype, const at::Device& device, const char* caller) {
  TORCH_CHECK_TYPE(c10::isFloatingType(dtype), caller, ": expected a floating-point dtype, got ",
                   dtype);
  TORCH_CHECK_TYPE(!(device.is_cpu() && dtype == at::kHalf), caller,
                   ": expected Float, Double or BFloat16 on the CPU, got Half");
}

// Query, key and value of one dtype that the backends take, on one device.
void check_dtype_and_device(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const char* caller) {
  TORCH_CHECK_TYPE(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(), caller,
                   ": expected query, key and value of one dtype, got ", q.scalar_type(), ", ",
                   k.scalar_type(), ", ", v.scalar_type());
  check_dtype(q.scalar_type(), q.device(), caller);
  TORCH_CHECK(q.device() == k.device() && q.device() == v.device(), caller,
              ": expected query, key and value on one device, got ", q.device(), ", ", k.device(),
              ", ", v.device());
}

void check_tensors(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                   const char* caller) {
  TORCH_CHECK_VALUE(q.defined() && k.defined() && v.defined(), caller,
                    ": expected defined query, key and value tensors");
  TORCH_CHECK_VALUE(q.dim() >= 2 && q.dim() == k.dim() && q.dim() == v.dim(), caller,
                    ": expected query, key and value of the same rank >= 2, got query ",
                    shape_str(q.sizes()), ", key ", shape_str(k.sizes()), ", value ",
                    shape_str(v.sizes()));
  check_dtype_and_device(q, k, v, caller);
  TORCH_CHECK_VALUE(q.size(-1) == k.size(-1), caller,
                    ": expected query and key with the same feature size, got query ",
                    shape_str(q.sizes()), " and key ", shape_str(k.sizes()));
  TORCH_CHECK_VALUE(k.sizes().slice(0, k.dim() - 1) == v.sizes().slice(0, v.dim() - 1), caller,
                    ": expected key and value that differ only in the last dimension, got key ",
                    shape_str(k.sizes()), " and value ", shape_str(v.sizes()));
  if (q.dim() == 2) return;
  // The remainder is taken only once Hkv is known to be positive (or both head counts are 0).
  const int64_t heads = q.size(-3), kv_heads = k.size(-3);
  const bool heads_ok = q.sizes().slice(0, q.dim() - 3) == k.sizes().slice(0, k.dim() - 3) &&
                        (kv_heads > 0 ? heads % kv_heads == 0 : heads == 0);
  TORCH_CHECK_VALUE(heads_ok, caller,
                    ": expected query (..., H, Tq, d) and key (..., Hkv, Tk, d) with equal leading "
                    "dimensions and H a multiple of Hkv >= 1, got query ",
                    shape_str(q.sizes()), " and key ", shape_str(k.sizes()));
}

// Packed sequences: query (total_q, H, d), key (total_k, Hkv, d), value (total_k, Hkv, dv).
void check_packed_tensors(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                          const char* caller) {
  TORCH_CHECK_VALUE(q.defined() && k.defined() && v.defined(), caller,
                    ": expected defined query, key and value tensors");
  const bool shapes_ok = q.dim() == 3 && k.dim() == 3 && v.dim() == 3 && q.size(2) == k.size(2) &&
                         k.size(0) == v.size(0) && k.size(1) == v.size(1) &&
                         (k.size(1) > 0 ? q.size(1) % k.size(1) == 0 : q.size(1) == 0);
  TORCH_CHECK_VALUE(shapes_ok, caller,
                    ": expected packed query (total_q, H, d), key (total_k, Hkv, d) and value "
                    "(total_k, Hkv, dv) with H a multiple of Hkv >= 1, got query ",
                    shape_str(q.sizes()), ", key ", shape_str(k.sizes()), ", value ",
                    shape_str(v.sizes()));
  check_dtype_and_device(q, k, v, caller);
}

void check_projections(const torch::Tensor& x_q, const torch::Tensor& x_kv,
                       const torch::Tensor& w_q, const torch::Tensor& w_k, const torch::Tensor& w_v,
                       const char* caller) {
  TORCH_CHECK_VALUE(
      x_q.defined() && x_kv.defined() && w_q.defined() && w_k.defined() && w_v.defined(), caller,
      ": expected defined x_q, x_kv, W_query, W_key and W_value tensors");
  TORCH_CHECK_VALUE(x_q.dim() == 2 || x_q.dim() == 3, caller,
                    ": expected x_q (T, d_in) or (B, T, d_in), got ", shape_str(x_q.sizes()));
  TORCH_CHECK_VALUE(x_kv.dim() == x_q.dim() && (x_q.dim() == 2 || x_kv.size(0) == x_q.size(0)),
                    caller, ": expected x_kv of the same rank and batch size as x_q ",
                    shape_str(x_q.sizes()), ", got ", shape_str(x_kv.sizes()));
  const int64_t d_in = x_q.size(-1), d_in_kv = x_kv.size(-1);
  TORCH_CHECK_VALUE(w_q.dim() == 2 && w_q.size(0) == d_in, caller, ": expected W_query (", d_in,
                    ", d_kq) for x_q ", shape_str(x_q.sizes()), ", got ", shape_str(w_q.sizes()));
  const int64_t d_kq = w_q.size(1);
  TORCH_CHECK_VALUE(w_k.dim() == 2 && w_k.size(0) == d_in_kv && w_k.size(1) == d_kq, caller,
                    ": expected W_key (", d_in_kv, ", ", d_kq, ") for x_kv ",
                    shape_str(x_kv.sizes()), " and W_query ", shape_str(w_q.sizes()), ", got ",
                    shape_str(w_k.sizes()));
  TORCH_CHECK_VALUE(w_v.dim() == 2 && w_v.size(0) == d_in_kv, caller, ": expected W_value (",
                    d_in_kv, ", d_v) for x_kv ", shape_str(x_kv.sizes()), ", got ",
                    shape_str(w_v.sizes()));
  const auto dtype = x_q.scalar_type();
  for (const auto* t : {&x_kv, &w_q, &w_k, &w_v}) {
    TORCH_CHECK_TYPE(t->scalar_type() == dtype, caller,
                     ": expected x_q, x_kv, W_query, W_key and W_value of one dtype, got ", dtype,
                     ", ", x_kv.scalar_type(), ", ", w_q.scalar_type(), ", ", w_k.scalar_type(),
                     ", ", w_v.scalar_type());
    TORCH_CHECK(t->device() == x_q.device(), caller,
                ": expected x_q, x_kv, W_query, W_key and W_value on one device, got ",
                x_q.device(), ", ", x_kv.device(), ", ", w_q.device(), ", ", w_k.device(), ", ",
                w_v.device());
  }
  check_dtype(dtype, x_q.device(), caller);
}

void check_options(const functional::ScaledDotProductAttentionOptions& o, const char* caller) {
  detail::check_backend(o.backend(), caller);
  detail::check_alignment(o.causal_alignment(), caller);
  TORCH_CHECK_VALUE(o.dropout_p() >= 0.0 && o.dropout_p() < 1.0, caller,
                    ": expected dropout_p in [0, 1), got ", o.dropout_p());
  TORCH_CHECK_VALUE(!o.scale() || std::isfinite(*o.scale()), caller,
                    ": expected a finite scale, got ", o.scale() ? *o.scale() : 0.0);
  TORCH_CHECK_VALUE(o.block_size() > 0, caller, ": expected block_size > 0, got ", o.block_size());
  TORCH_CHECK_VALUE(!o.window_left() || *o.window_left() >= 0, caller,
                    ": expected window_left >= 0 (unset for no bound), got ", *o.window_left());
  TORCH_CHECK_VALUE(!o.window_right() || *o.window_right() >= 0, caller,
                    ": expected window_right >= 0 (unset for no bound), got ", *o.window_right());
  TORCH_CHECK_VALUE(!o.softcap() || (std::isfinite(*o.softcap()) && *o.softcap() > 0.0), caller,
                    ": expected a finite softcap > 0 (unset for none), got ", *o.softcap());
}

// Attention sinks: one finite logit per query head, of the queries' dtype and device.
void check_sinks(const torch::Tensor& sinks, const torch::Tensor& like, int64_t heads,
                 const char* caller) {
  TORCH_CHECK_TYPE(sinks.scalar_type() == like.scalar_type(), caller, ": expected sinks of dtype ",
                   like.scalar_type(), " (the queries'), got ", sinks.scalar_type());
  TORCH_CHECK(sinks.device() == like.device(), caller, ": expected sinks on device ", like.device(),
              ", got ", sinks.device());
  TORCH_CHECK_VALUE(sinks.dim() == 1 && sinks.size(0) == heads, caller,
                    ": expected sinks of shape (", heads, ",), one per query head, got ",
                    shape_str(sinks.sizes()));
  TORCH_CHECK_VALUE(sinks.numel() == 0 || torch::isfinite(sinks).all().item<bool>(), caller,
                    ": expected finite sinks");
}

// ALiBi's slopes: one finite value per query head, on the queries' device or the CPU (a meta
// tensor has no values to read), read once to the host.
std::vector<double> check_alibi(const torch::Tensor& slopes, const torch::Tensor& like,
                                int64_t heads, const char* caller) {
  if (!slopes.defined()) return {};
  TORCH_CHECK(slopes.device() == like.device() || slopes.device().is_cpu(), caller,
              ": expected alibi_slopes on the queries' device (", like.device(),
              ") or the CPU, got ", slopes.device());
  TORCH_CHECK_TYPE(slopes.is_floating_point(), caller,
                   ": expected floating-point alibi_slopes, got ", slopes.scalar_type());
  TORCH_CHECK_VALUE(slopes.dim() == 1 && slopes.size(0) == heads, caller,
                    ": expected alibi_slopes of shape (", heads, ",), one per query head, got ",
                    shape_str(slopes.sizes()));
  const auto host = slopes.detach().to(torch::kCPU, torch::kDouble).contiguous();
  std::vector<double> values(host.data_ptr<double>(), host.data_ptr<double>() + heads);
  for (const double v : values) {
    TORCH_CHECK_VALUE(std::isfinite(v), caller, ": expected finite alibi_slopes, got ", v);
  }
  return values;
}

// The shape of a block mask's dense mask, (batch, heads, Tq, Tk), less the leading 1s that scores
// of rank 2 or 3 do not have: a mask of higher rank than the scores would give the output its
// rank.
std::vector<int64_t> dense_shape(const BlockMask& blocks, size_t rank) {
  std::vector<int64_t> shape{blocks.batch(), blocks.heads(), blocks.t_q(), blocks.t_k()};
  while (shape.size() > rank && shape.front() == 1) shape.erase(shape.begin());
  return shape;
}

// `mask` (undefined, bool or additive) hiding the keys `hidden` (bool) hides as well: a bool mask
// is or'ed, an additive one gets -inf there (torch::where keeps its gradient elsewhere).
torch::Tensor hiding(const torch::Tensor& mask, const torch::Tensor& hidden) {
  if (!mask.defined()) return hidden;
  if (mask.scalar_type() == at::kBool) return mask.logical_or(hidden);
  return torch::where(
      hidden, torch::full({}, -std::numeric_limits<double>::infinity(), mask.options()), mask);
}

void check_mask(const torch::Tensor& mask, const torch::Tensor& q, c10::IntArrayRef scores,
                const char* caller) {
  TORCH_CHECK_TYPE(mask.scalar_type() == at::kBool || mask.scalar_type() == q.scalar_type(), caller,
                   ": expected attn_mask of dtype bool (true = masked out) or ", q.scalar_type(),
                   " (additive), got ", mask.scalar_type());
  TORCH_CHECK(mask.device() == q.device(), caller, ": expected attn_mask on device ", q.device(),
              ", got ", mask.device());
  TORCH_CHECK_VALUE(detail::broadcastable_to(mask.sizes(), scores), caller,
                    ": expected attn_mask broadcastable to the scores ", shape_str(scores),
                    ", got ", shape_str(mask.sizes()));
}

}  // namespace

Sequences::Sequences(std::vector<int64_t> queries, std::vector<int64_t> keys)
    : query_offsets(std::move(queries)), key_offsets(std::move(keys)) {
  for (int64_t s = 0; s < count(); ++s) {
    max_queries = std::max(max_queries, this->queries(s));
    max_keys = std::max(max_keys, this->keys(s));
    score_pairs += static_cast<double>(this->queries(s)) * static_cast<double>(this->keys(s));
  }
}

Problem Problem::sequence(int64_t s) const {
  Problem view = *this;
  view.sequences = nullptr;
  view.sequence_index = s;
  view.t_q = sequences->queries(s);
  view.t_k = sequences->keys(s);
  view.query_offset = alignment == functional::CausalAlignment::TopLeft ? 0 : view.t_k - view.t_q;
  // As describe() does for a whole problem: a window that spans the sequence hides no key.
  const int64_t widest = std::max(view.t_q, view.t_k);
  if (view.window_left >= widest) view.window_left = -1;
  if (view.window_right >= widest) view.window_right = -1;
  return view;
}

double Problem::score_count() const {
  const double matrices = static_cast<double>(n) * static_cast<double>(g);
  if (packed()) return matrices * sequences->score_pairs;
  return matrices * static_cast<double>(t_q) * static_cast<double>(t_k);
}

std::vector<int64_t> Problem::score_sizes() const {
  auto sizes = lead;
  sizes.insert(sizes.end(), {t_q, t_k});
  return sizes;
}

torch::Tensor Problem::expanded_mask() const {
  return mask.defined() ? mask.expand(score_sizes()) : mask;
}

namespace {

// The shapes of a problem's query, key and value, whether given or still to be projected.
struct Shapes {
  c10::IntArrayRef q, k, v;
};

// Describes a problem whose tensors (or projections) have been checked against each other; the
// options and the mask are checked here.
Problem describe(const Shapes& shapes, const torch::Tensor& like,
                 const functional::ScaledDotProductAttentionOptions& options, bool records_grad,
                 const char* caller) {
  check_options(options, caller);
  // Below double the kernels compute in float (bfloat16's range is float's): a scale or softcap
  // beyond it would be infinite there, and softcap * tanh(s / softcap) NaN for every score.
  if (like.scalar_type() != at::kDouble) {
    constexpr double kFloatMax = std::numeric_limits<float>::max();
    TORCH_CHECK_VALUE(!options.scale() || std::abs(*options.scale()) <= kFloatMax, caller,
                      ": expected a scale within float's range (|scale| <= ", kFloatMax, ") for ",
                      like.scalar_type(), " queries, got ", options.scale().value_or(0.0));
    TORCH_CHECK_VALUE(!options.softcap() || *options.softcap() <= kFloatMax, caller,
                      ": expected a softcap within float's range (<= ", kFloatMax, ") for ",
                      like.scalar_type(), " queries, got ", options.softcap().value_or(0.0));
  }
  const auto q = shapes.q, k = shapes.k, v = shapes.v;
  const size_t rank = q.size();
  Problem p;
  p.caller = caller;
  p.lead = q.slice(0, rank - 2).vec();
  p.t_q = q[rank - 2];
  p.t_k = k[rank - 2];
  p.d = q[rank - 1];
  p.dv = v[rank - 1];
  if (rank >= 3) {
    p.heads = q[rank - 3];
    p.kv_heads = k[rank - 3];
    p.g = p.kv_heads > 0 ? p.heads / p.kv_heads : 1;
  }
  for (size_t i = 0; i + 2 < rank; ++i) p.n *= k[i];
  p.causal = options.is_causal();
  p.alignment = options.causal_alignment();
  p.query_offset =
      options.causal_alignment() == functional::CausalAlignment::TopLeft ? 0 : p.t_k - p.t_q;
  // A window at least as long as both sequences hides no key (every |pos(i) - j| is below
  // max(Tq, Tk)): it is described as no bound, so that no backend ever forms a diagonal near the
  // int64 limit (window_right = INT64_MAX plus the query offset would wrap around).
  const int64_t widest = std::max(p.t_q, p.t_k);
  const auto bound = [widest](const c10::optional<int64_t>& window) -> int64_t {
    return window && *window < widest ? *window : -1;
  };
  p.window_left = bound(options.window_left());
  p.window_right = bound(options.window_right());
  p.softcap = options.softcap().value_or(0.0);
  p.alibi = check_alibi(options.alibi_slopes(), like, p.heads, caller);
  if (options.sinks().defined()) {
    check_sinks(options.sinks(), like, p.heads, caller);
    p.sinks = options.sinks();
    records_grad = records_grad || detail::records_grad(p.sinks);
  }
  p.device = like.device();
  p.scale = options.scale() ? *options.scale()
                            : (p.d > 0 ? 1.0 / std::sqrt(static_cast<double>(p.d)) : 1.0);
  p.scale_is_default = !options.scale();
  p.dropout_p = options.dropout_p();
  p.need_weights = options.need_weights();
  p.backend = options.backend();
  const int64_t longest = std::max<int64_t>(1, std::max(p.t_q, p.t_k));
  p.block = std::clamp<int64_t>(options.block_size(), 1, std::min(kMaxBlockSize, longest));
  const auto& mask = options.attn_mask();
  if (mask.defined()) {
    check_mask(mask, like, p.score_sizes(), caller);
    p.mask = mask;
    p.mask_is_bool = mask.scalar_type() == at::kBool;
    p.mask_needs_grad = !p.mask_is_bool && detail::records_grad(mask);
  }
  if (options.relative_bias().defined()) {
    const auto& table = options.relative_bias();
    detail::check_relative_buckets(options.relative_buckets(), "relative_buckets", caller);
    const int64_t buckets = options.relative_buckets().num_buckets();
    TORCH_CHECK_TYPE(table.scalar_type() == like.scalar_type(), caller,
                     ": expected relative_bias of the queries' dtype ", like.scalar_type(),
                     ", got ", table.scalar_type());
    TORCH_CHECK(table.device() == like.device(), caller, ": expected relative_bias on device ",
                like.device(), ", got ", table.device());
    TORCH_CHECK_VALUE(table.dim() == 2 && table.size(0) == buckets && table.size(1) == p.heads,
                      caller, ": expected relative_bias of shape (", buckets, ", ", p.heads,
                      "): one row per bucket of relative_buckets, one column per query head, got ",
                      shape_str(table.sizes()));
    p.relative_bias = table;
    records_grad = records_grad || detail::records_grad(table);
    // Every relative position j - pos(i) of the problem: from -(Tq - 1 + offset) to
    // Tk - 1 - offset (bounded by 2 max(Tq, Tk): the query offset is |Tk - Tq| at most).
    if (p.t_q > 0 && p.t_k > 0) {
      p.relative_first = -(p.t_q - 1 + p.query_offset);
      const auto positions = torch::arange(p.relative_first, p.t_k - p.query_offset, torch::kLong);
      const auto found = options.relative_buckets().bucket(positions).contiguous();
      p.relative_buckets.assign(found.data_ptr<int64_t>(),
                                found.data_ptr<int64_t>() + found.numel());
    }
  }
  if (options.block_mask()) {
    const BlockMask& blocks = *options.block_mask();
    TORCH_CHECK_VALUE(blocks.t_q() == p.t_q && blocks.t_k() == p.t_k, caller,
                      ": expected a block_mask made for Tq = ", p.t_q, " queries and Tk = ", p.t_k,
                      " keys, got one made for ", blocks.t_q(), " and ", blocks.t_k());
    const auto scores = p.score_sizes();
    const auto dense = dense_shape(blocks, scores.size());
    TORCH_CHECK_VALUE(detail::broadcastable_to(dense, scores), caller,
                      ": expected a block_mask whose batch and heads broadcast to the scores ",
                      shape_str(p.score_sizes()), " as a dense mask ", shape_str(dense),
                      " would, got batch ", blocks.batch(), " and heads ", blocks.heads());
    p.block_mask = blocks;
  }
  p.needs_grad = p.mask_needs_grad || records_grad;
  if (options.score_mod()) {
    TORCH_CHECK_VALUE(options.score_mod()->differentiable() || !p.needs_grad, caller,
                      ": the score_mod has no derivative, and this call needs gradients (an input "
                      "requires grad under grad mode): give the ScoreMod a derivative, or call "
                      "under torch::NoGradGuard");
    p.score_mod = options.score_mod();
  }
  return p;
}

// The options of a packed or paged call without their block mask, which describe() would check
// against the packed totals: packed_block_mask() checks it against the sequences.
functional::ScaledDotProductAttentionOptions without_block_mask(
    const functional::ScaledDotProductAttentionOptions& options) {
  auto own = options;
  own.block_mask(c10::nullopt);
  return own;
}

// A packed or paged call's block mask: sequence s reads batch row s (or the one row) of it, its
// queries and keys from the top-left corner, so it must be made for at least the longest
// sequence's.
c10::optional<BlockMask> packed_block_mask(
    const functional::ScaledDotProductAttentionOptions& options, const Problem& p,
    const Sequences& sequences, const char* caller) {
  if (!options.block_mask()) return c10::nullopt;
  const BlockMask& blocks = *options.block_mask();
  TORCH_CHECK_VALUE((blocks.batch() == 1 || blocks.batch() == sequences.count()) &&
                        (blocks.heads() == 1 || blocks.heads() == p.heads),
                    caller, ": expected a block_mask of batch 1 or S = ", sequences.count(),
                    " (one row per sequence) and heads 1 or H = ", p.heads, ", got batch ",
                    blocks.batch(), " and heads ", blocks.heads());
  TORCH_CHECK_VALUE(blocks.t_q() >= sequences.max_queries && blocks.t_k() >= sequences.max_keys,
                    caller, ": expected a block_mask made for at least the longest sequence's ",
                    sequences.max_queries, " queries and ", sequences.max_keys,
                    " keys (each sequence reads its top-left corner), got one made for ",
                    blocks.t_q(), " and ", blocks.t_k());
  return blocks;
}

}  // namespace

Problem with_dense_block_mask(const Problem& p) {
  if (!p.block_mask) return p;
  Problem dense = p;
  dense.block_mask = c10::nullopt;
  torch::Tensor hidden = p.block_mask->to_attn_mask();
  if (p.sequence_index >= 0) {
    // A packed problem's sequence: its row of the mask, the corner of its queries and keys,
    // (heads, Tq, Tk), which broadcasts to its (H, Tq, Tk) scores.
    hidden = hidden[p.block_mask->batch() == 1 ? 0 : p.sequence_index]
                 .narrow(-2, 0, p.t_q)
                 .narrow(-1, 0, p.t_k);
  } else {
    hidden = hidden.view(dense_shape(*p.block_mask, p.score_sizes().size()));
  }
  hidden = hidden.to(p.device);
  dense.mask = hiding(p.mask, hidden);
  dense.mask_is_bool = !p.mask.defined() || p.mask_is_bool;
  return dense;
}

Problem with_dense_relative_bias(const Problem& p) {
  if (!p.relative_bias.defined()) return p;
  Problem dense = p;
  dense.relative_bias = torch::Tensor();
  dense.relative_buckets.clear();
  if (p.t_q == 0 || p.t_k == 0) return dense;
  // The bucket of each (i, j), then the table's row per pair: (Tq, Tk, H) -> (H, Tq, Tk).
  const auto query = torch::arange(p.t_q, torch::kLong).view({-1, 1}) + p.query_offset;
  const auto key = torch::arange(p.t_k, torch::kLong).view({1, -1});
  const auto index = (key - query - p.relative_first).flatten();
  const auto buckets = torch::tensor(p.relative_buckets, torch::kLong).index_select(0, index);
  auto bias = p.relative_bias.index_select(0, buckets.to(p.device))
                  .view({p.t_q, p.t_k, p.heads})
                  .permute({2, 0, 1});
  if (p.lead.empty()) bias = bias[0];  // one head: the scores are (Tq, Tk)
  dense.mask = !p.mask.defined() ? bias : (p.mask_is_bool ? hiding(bias, p.mask) : p.mask + bias);
  dense.mask_is_bool = false;
  dense.mask_needs_grad = dense.mask.requires_grad() && c10::GradMode::is_enabled();
  return dense;
}

torch::Tensor relative_bias_by_position(const Problem& p, at::ScalarType dtype) {
  if (!p.relative_bias.defined()) return {};
  const auto buckets = torch::tensor(p.relative_buckets, torch::kLong).to(p.device);
  return p.relative_bias.detach().to(dtype).index_select(0, buckets).t().contiguous();
}

std::vector<int64_t> block_mask_rows(const Problem& p) {
  if (!p.block_mask) return {};
  const int64_t batch = p.block_mask->batch(), heads = p.block_mask->heads();
  if (p.sequence_index >= 0) {
    // A packed problem's sequence, one batch of H heads: its row of the mask.
    const int64_t row = batch == 1 ? 0 : p.sequence_index;
    std::vector<int64_t> rows(static_cast<size_t>(p.n * p.g));
    for (int64_t m = 0; m < p.n * p.g; ++m) rows[m] = row * heads + (heads == 1 ? 0 : m % heads);
    return rows;
  }
  std::vector<int64_t> lead_ones = p.lead;
  lead_ones.push_back(1);
  lead_ones.push_back(1);
  // The dense mask's shape with one query and one key (the problem checked that it broadcasts).
  auto shape = dense_shape(*p.block_mask, lead_ones.size());
  shape.end()[-2] = shape.end()[-1] = 1;
  const auto rows =
      torch::arange(batch * heads, torch::kLong).view(shape).expand(lead_ones).contiguous();
  const int64_t* at = rows.data_ptr<int64_t>();
  return std::vector<int64_t>(at, at + rows.numel());
}

Problem make_problem(const torch::Tensor& query, const torch::Tensor& key,
                     const torch::Tensor& value,
                     const functional::ScaledDotProductAttentionOptions& options,
                     const char* caller) {
  check_tensors(query, key, value, caller);
  return describe({query.sizes(), key.sizes(), value.sizes()}, query, options,
                  detail::records_grad(query, key, value), caller);
}

std::vector<int64_t> read_offsets(const torch::Tensor& offsets, const char* name, int64_t total,
                                  const char* total_name, const torch::Tensor& like,
                                  const char* caller) {
  TORCH_CHECK_VALUE(offsets.defined(), caller, ": expected a defined ", name, " tensor");
  TORCH_CHECK_TYPE(offsets.scalar_type() == at::kInt || offsets.scalar_type() == at::kLong, caller,
                   ": expected ", name, " of dtype Int or Long, got ", offsets.scalar_type());
  TORCH_CHECK(offsets.device().is_cpu() || offsets.device() == like.device(), caller, ": expected ",
              name, " on the CPU or on the queries' device (", like.device(), "), got ",
              offsets.device());
  TORCH_CHECK_VALUE(offsets.dim() == 1 && offsets.numel() >= 1, caller, ": expected ", name,
                    " of shape (S + 1,) for S >= 0 sequences, got ", shape_str(offsets.sizes()));
  const auto host = offsets.to(torch::kCPU, torch::kLong).contiguous();
  const int64_t* at = host.data_ptr<int64_t>();
  std::vector<int64_t> values(at, at + host.numel());
  TORCH_CHECK_VALUE(values.front() == 0, caller, ": expected ", name, " to start at 0, got ",
                    values.front());
  for (size_t s = 1; s < values.size(); ++s) {
    TORCH_CHECK_VALUE(values[s] >= values[s - 1], caller, ": expected nondecreasing ", name,
                      ", got ", values[s], " after ", values[s - 1], " (entry ", s, ")");
  }
  TORCH_CHECK_VALUE(values.back() == total, caller, ": expected ", name, " to end at ", total_name,
                    " = ", total, ", got ", values.back());
  return values;
}

Problem make_varlen_problem(const torch::Tensor& query, const torch::Tensor& key,
                            const torch::Tensor& value, const torch::Tensor& cu_seqlens_q,
                            const torch::Tensor& cu_seqlens_k,
                            const functional::ScaledDotProductAttentionOptions& options,
                            const char* caller) {
  check_packed_tensors(query, key, value, caller);
  // A mask over packed tokens would be (H, total_q, total_k), quadratic in the whole batch, and
  // the weights ragged: the sequences' own causality and window are what a packed call hides.
  TORCH_CHECK_VALUE(!options.attn_mask().defined(), caller,
                    ": takes no attn_mask (each query sees the keys of its own sequence, through "
                    "is_causal and the window); use scaled_dot_product_attention per sequence for "
                    "a mask");
  TORCH_CHECK_VALUE(!options.need_weights(), caller,
                    ": returns no attention weights (need_weights); use "
                    "scaled_dot_product_attention per sequence for them");
  auto queries = read_offsets(cu_seqlens_q, "cu_seqlens_q", query.size(0),
                              "total_q (the queries' first dimension)", query, caller);
  auto keys = read_offsets(cu_seqlens_k, "cu_seqlens_k", key.size(0),
                           "total_k (the keys' first dimension)", query, caller);
  TORCH_CHECK_VALUE(queries.size() == keys.size(), caller,
                    ": expected cu_seqlens_q and cu_seqlens_k of one length (S + 1 for S "
                    "sequences), got ",
                    queries.size(), " and ", keys.size(), " entries");
  // The kernels read the packed tokens as one batch of H heads: (H, total, d).
  const auto head_major = [](const torch::Tensor& t) {
    return c10::SmallVector<int64_t, 3>{t.size(1), t.size(0), t.size(2)};
  };
  const auto q = head_major(query), k = head_major(key), v = head_major(value);
  Problem p = describe({q, k, v}, query, without_block_mask(options),
                       detail::records_grad(query, key, value), caller);
  auto sequences = std::make_shared<const Sequences>(std::move(queries), std::move(keys));
  p.block_mask = packed_block_mask(options, p, *sequences, caller);
  const int64_t longest =
      std::max<int64_t>(1, std::max(sequences->max_queries, sequences->max_keys));
  p.block = std::clamp<int64_t>(options.block_size(), 1, std::min(kMaxBlockSize, longest));
  p.sequences = std::move(sequences);
  return p;
}

namespace {

// 8-bit pages come with a float scale per row, (num_pages, Hkv, P), on the pages' device; pages
// of the queries' dtype come with none.
void check_page_scales(const torch::Tensor& k, const torch::Tensor& v,
                       const torch::Tensor& key_scales, const torch::Tensor& value_scales,
                       bool quantized, const char* caller) {
  if (!quantized) {
    TORCH_CHECK_VALUE(!key_scales.defined() && !value_scales.defined(), caller,
                      ": takes key_scales and value_scales only with 8-bit pages (dtype Char), "
                      "got pages of dtype ",
                      k.scalar_type());
    return;
  }
  for (const auto& [scales, pages, name] :
       {std::tuple{&key_scales, &k, "key_scales"}, {&value_scales, &v, "value_scales"}}) {
    TORCH_CHECK_VALUE(scales->defined(), caller, ": expected ", name,
                      " with 8-bit pages (a float scale per row: a key is its codes times its "
                      "scale)");
    TORCH_CHECK_TYPE(scales->scalar_type() == at::kFloat, caller, ": expected ", name,
                     " of dtype Float, got ", scales->scalar_type());
    TORCH_CHECK_VALUE(scales->sizes() == pages->sizes().slice(0, 3), caller, ": expected ", name,
                      " of shape ", shape_str(pages->sizes().slice(0, 3)),
                      " (num_pages, Hkv, page_size), got ", shape_str(scales->sizes()));
    TORCH_CHECK(scales->device() == pages->device(), caller, ": expected ", name,
                " on the pages' device (", pages->device(), "), got ", scales->device());
  }
}

}  // namespace

torch::Tensor paged_table(const torch::Tensor& page_table) {
  return page_table.to(torch::kCPU, torch::kLong).contiguous();
}

Problem make_paged_problem(const torch::Tensor& query, const torch::Tensor& key_pages,
                           const torch::Tensor& value_pages, const torch::Tensor& cu_seqlens_q,
                           const torch::Tensor& key_lengths, const torch::Tensor& page_table,
                           const functional::ScaledDotProductAttentionOptions& options,
                           const char* caller, const torch::Tensor& key_scales,
                           const torch::Tensor& value_scales) {
  const auto& q = query;
  const auto &k = key_pages, &v = value_pages;
  TORCH_CHECK_VALUE(q.defined() && k.defined() && v.defined(), caller,
                    ": expected defined query, key_pages and value_pages tensors");
  const bool shapes_ok = q.dim() == 3 && k.dim() == 4 && v.dim() == 4 && q.size(2) == k.size(3) &&
                         k.sizes().slice(0, 3) == v.sizes().slice(0, 3) && k.size(2) > 0 &&
                         (k.size(1) > 0 ? q.size(1) % k.size(1) == 0 : q.size(1) == 0);
  TORCH_CHECK_VALUE(shapes_ok, caller,
                    ": expected query (total_q, H, d), key_pages (num_pages, Hkv, page_size, d) "
                    "and value_pages (num_pages, Hkv, page_size, dv) with H a multiple of Hkv >= 1 "
                    "and page_size >= 1, got query ",
                    shape_str(q.sizes()), ", key_pages ", shape_str(k.sizes()), ", value_pages ",
                    shape_str(v.sizes()));
  const bool quantized = k.scalar_type() == at::kChar || v.scalar_type() == at::kChar;
  if (quantized) {
    TORCH_CHECK_TYPE(k.scalar_type() == at::kChar && v.scalar_type() == at::kChar, caller,
                     ": expected key_pages and value_pages both of dtype Char (8-bit) or both of "
                     "the query's dtype, got ",
                     k.scalar_type(), " and ", v.scalar_type());
  } else {
    TORCH_CHECK_TYPE(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
                     caller, ": expected query and pages of one dtype, got ", q.scalar_type(), ", ",
                     k.scalar_type(), ", ", v.scalar_type());
  }
  check_dtype(q.scalar_type(), q.device(), caller);
  TORCH_CHECK(q.device() == k.device() && q.device() == v.device(), caller,
              ": expected query and pages on one device, got ", q.device(), ", ", k.device(), ", ",
              v.device());
  check_page_scales(k, v, key_scales, value_scales, quantized, caller);
  TORCH_CHECK_VALUE(!options.attn_mask().defined(), caller,
                    ": takes no attn_mask (each query sees the keys of its own sequence, through "
                    "is_causal and the window)");
  TORCH_CHECK_VALUE(!options.need_weights(), caller,
                    ": returns no attention weights (need_weights)");
  TORCH_CHECK_VALUE(options.dropout_p() == 0.0, caller,
                    ": computes no dropout (it is for inference); got ", options.dropout_p());
  TORCH_CHECK(!detail::records_grad(q, k, v, options.sinks()), caller,
              ": is for inference: the pages hold no gradients; call it under "
              "torch::NoGradGuard");
  auto queries = read_offsets(cu_seqlens_q, "cu_seqlens_q", q.size(0),
                              "total_q (the queries' first dimension)", q, caller);
  const int64_t count = static_cast<int64_t>(queries.size()) - 1;
  const int64_t num_pages = k.size(0), page_size = k.size(2);
  for (const auto& [t, name] :
       {std::pair{&key_lengths, "key_lengths"}, {&page_table, "page_table"}}) {
    TORCH_CHECK_VALUE(t->defined(), caller, ": expected a defined ", name, " tensor");
    TORCH_CHECK_TYPE(t->scalar_type() == at::kInt || t->scalar_type() == at::kLong, caller,
                     ": expected ", name, " of dtype Int or Long, got ", t->scalar_type());
    TORCH_CHECK(t->device().is_cpu() || t->device() == q.device(), caller, ": expected ", name,
                " on the CPU or on the queries' device (", q.device(), "), got ", t->device());
  }
  TORCH_CHECK_VALUE(key_lengths.dim() == 1 && key_lengths.size(0) == count, caller,
                    ": expected key_lengths of shape (", count, ",), one per sequence, got ",
                    shape_str(key_lengths.sizes()));
  TORCH_CHECK_VALUE(page_table.dim() == 2 && page_table.size(0) == count, caller,
                    ": expected page_table of shape (", count,
                    ", max_pages), one row per sequence, got ", shape_str(page_table.sizes()));
  const int64_t max_pages = page_table.size(1);
  // max_pages x page_size, saturated: a length is compared with it, never multiplied.
  int64_t room = 0;
  if (__builtin_mul_overflow(max_pages, page_size, &room)) {
    room = std::numeric_limits<int64_t>::max();
  }
  const auto lengths_host = key_lengths.to(torch::kCPU, torch::kLong).contiguous();
  const int64_t* lengths = lengths_host.data_ptr<int64_t>();
  std::vector<int64_t> keys{0};
  for (int64_t s = 0; s < count; ++s) {
    TORCH_CHECK_VALUE(lengths[s] >= 0, caller, ": expected key_lengths >= 0, got ", lengths[s],
                      " for sequence ", s);
    TORCH_CHECK_VALUE(lengths[s] <= room, caller, ": expected key_lengths of at most ", room,
                      " (page_table's ", max_pages, " pages of ", page_size, " tokens), got ",
                      lengths[s], " for sequence ", s);
    int64_t end = 0;
    TORCH_CHECK_VALUE(!__builtin_add_overflow(keys.back(), lengths[s], &end), caller,
                      ": expected key_lengths whose sum fits in int64, got ", lengths[s],
                      " for sequence ", s, " after ", keys.back());
    keys.push_back(end);
  }
  // The kernels read the queries as one batch of H heads, and the keys as if gathered one after
  // another: (Hkv, total_k, d).
  const c10::SmallVector<int64_t, 3> q_shape{q.size(1), q.size(0), q.size(2)};
  const c10::SmallVector<int64_t, 3> k_shape{k.size(1), keys.back(), k.size(3)};
  const c10::SmallVector<int64_t, 3> v_shape{v.size(1), keys.back(), v.size(3)};
  Problem p = describe({q_shape, k_shape, v_shape}, q, without_block_mask(options), false, caller);
  auto sequences = std::make_shared<const Sequences>(std::move(queries), std::move(keys));
  p.block_mask = packed_block_mask(options, p, *sequences, caller);
  const int64_t longest =
      std::max<int64_t>(1, std::max(sequences->max_queries, sequences->max_keys));
  p.block = std::clamp<int64_t>(options.block_size(), 1, std::min(kMaxBlockSize, longest));
  p.sequences = std::move(sequences);
  // The pages that hold keys some query sees: in the pool. Visible ranges move right with the
  // query, so the first query's start and the last one's end bound them.
  const auto table_host = paged_table(page_table);
  const int64_t* table = table_host.data_ptr<int64_t>();
  for (int64_t s = 0; s < count; ++s) {
    const Problem one = p.sequence(s);
    if (one.t_q == 0 || one.t_k == 0) continue;
    const int64_t begin = visible_begin(one, 0), end = visible_end(one, one.t_q - 1);
    for (int64_t j = begin / page_size; end > begin && j < (end + page_size - 1) / page_size; ++j) {
      const int64_t page = table[s * max_pages + j];
      TORCH_CHECK_VALUE(page >= 0 && page < num_pages, caller, ": expected page_table[", s, "][", j,
                        "] (a page holding keys of sequence ", s, " that its queries see) in [0, ",
                        num_pages, "), got ", page);
    }
  }
  return p;
}

Problem make_projected_problem(const torch::Tensor& x_q, const torch::Tensor& x_kv,
                               const torch::Tensor& w_query, const torch::Tensor& w_key,
                               const torch::Tensor& w_value,
                               const functional::ScaledDotProductAttentionOptions& options,
                               const char* caller) {
  check_projections(x_q, x_kv, w_query, w_key, w_value, caller);
  // The projections (..., T, d_in) x (d_in, d_out) keep every dim but the last.
  c10::SmallVector<int64_t, 3> q(x_q.sizes().begin(), x_q.sizes().end());
  c10::SmallVector<int64_t, 3> k(x_kv.sizes().begin(), x_kv.sizes().end()), v = k;
  q.back() = w_query.size(1);
  k.back() = w_key.size(1);
  v.back() = w_value.size(1);
  return describe({q, k, v}, x_q, options, detail::records_grad(x_q, x_kv, w_query, w_key, w_value),
                  caller);
}

torch::Tensor hidden_keys(const Problem& p) {
  torch::Tensor hidden;
  const auto all = [&] {
    return torch::ones({p.t_q, p.t_k}, torch::TensorOptions().dtype(torch::kBool).device(p.device));
  };
  // Key j is hidden from query i when j > i + diagonal() or j < i + left_diagonal().
  if (p.bounded_right()) hidden = all().triu(p.diagonal() + 1);
  if (p.bounded_left()) {
    auto before = all().tril(p.left_diagonal() - 1);
    hidden = hidden.defined() ? hidden.logical_or(before) : before;
  }
  if (p.mask.defined() && p.mask_is_bool) {
    hidden = hidden.defined() ? hidden.logical_or(p.mask) : p.mask;
  }
  return hidden;
}

torch::Tensor alibi_bias(const Problem& p, const torch::TensorOptions& options) {
  if (p.alibi.empty()) return {};
  const auto on = torch::TensorOptions().dtype(torch::kDouble).device(p.device);
  const auto positions = torch::arange(p.t_q, on).add_(p.query_offset).unsqueeze(1);
  const auto distance = (positions - torch::arange(p.t_k, on).unsqueeze(0)).abs_();
  auto slopes = torch::tensor(p.alibi, torch::kDouble).to(p.device);
  // (H, 1, 1) slopes against (Tq, Tk) distances: (H, Tq, Tk), broadcastable to (..., H, Tq, Tk).
  auto bias = slopes.view({-1, 1, 1}).neg().mul(distance).to(options);
  return p.lead.empty() ? bias.squeeze(0) : bias;  // rank 2: one head, (Tq, Tk)
}

torch::Tensor additive_mask(const Problem& p) {
  return p.mask_is_bool ? torch::Tensor() : p.mask;
}

torch::Tensor rows_without_keys(const Problem& p) {
  const auto hidden = hidden_keys(p);
  const auto additive = additive_mask(p);
  torch::Tensor blocked = additive.defined() ? additive.isneginf() : hidden;
  if (additive.defined() && hidden.defined()) blocked = blocked.logical_or(hidden);
  return blocked.defined() ? blocked.all(-1, /*keepdim=*/true) : torch::Tensor();
}

}  // namespace kernels
}  // namespace attention
