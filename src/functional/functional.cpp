#include <attention/functional.h>
#include <attention/paged_attention.h>

#include "functional/last_path.h"
#include "functional/named_entry.h"
#include "kernels/chunked.h"
#include "kernels/kernels.h"
#include "kernels/paged.h"
#include "kernels/problem.h"
#include "memory/int8_rows.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace attention {
namespace functional {
namespace {

constexpr const char* kSdpa = "attention::functional::scaled_dot_product_attention";
constexpr const char* kProjected = "attention::functional::projected_attention";
constexpr const char* kVarlen = "attention::functional::varlen_attention";
constexpr const char* kPaged = "attention::functional::paged_attention";

thread_local Path last = Path::None;

bool has_nonfinite(const torch::Tensor& t) {
  return t.numel() > 0 && !torch::isfinite(t).all().item<bool>();
}

// What each backend cannot do, refused before it runs, with the backend named.
void check_supported(const kernels::Problem& p, Backend backend, const torch::Tensor& q,
                     const torch::Tensor& k) {
  if (backend == Backend::Chunked) {
    TORCH_CHECK(!p.need_weights && p.dropout_p == 0.0, p.caller,
                ": the Chunked backend computes neither attention weights nor dropout; use "
                "Backend::Math (or Auto) for those");
    TORCH_CHECK(!p.mask_needs_grad, p.caller,
                ": the Chunked backend does not differentiate attn_mask; use Backend::Math (or "
                "Auto) for a mask that requires grad");
  }
  if (backend == Backend::Native) {
    TORCH_CHECK(!p.need_weights, p.caller,
                ": the Native backend returns no attention weights; use Backend::Math (or Auto) "
                "for them");
    TORCH_CHECK(!p.score_mod, p.caller,
                ": the Native backend cannot apply a score_mod; use Backend::Math, Chunked or "
                "Auto");
    // LibTorch adds its masks to the scores, so a NaN score stays NaN where it is masked, and it
    // gives NaN where a query's scores are all -inf: both differ from the other backends.
    TORCH_CHECK(!p.beyond_native(), p.caller,
                ": the Native backend computes neither soft-capping, ALiBi nor attention sinks; "
                "use Backend::Math, Chunked or Auto");
    TORCH_CHECK(!has_nonfinite(q) && !has_nonfinite(k), p.caller,
                ": the Native backend cannot take non-finite queries or keys; use Backend::Math "
                "or Chunked");
  }
}

// Whether a paged problem runs on the paged kernel, which reads the pages where they lie; the
// others run on gathered keys and values.
bool paged_in_place(const kernels::Problem& p, const torch::Tensor& query,
                    const torch::Tensor& key_pages) {
  const bool quantized = key_pages.scalar_type() == torch::kChar;
  return (p.backend == Backend::Auto || p.backend == Backend::Chunked) && !p.degenerate() &&
         kernels::paged_forward_applies(query) &&
         !(quantized && query.scalar_type() == torch::kDouble);
}

// Auto: Math for weights, dropout or a mask that needs a gradient. Otherwise, on the fused CPU
// kernels (CPU float, double and bfloat16): in inference Chunked at every size (`attention-bench
// auto` measured it at 0.4-0.8 of Math's time at T <= 16 and 0.3-0.4 at T = 128 and 256, B=1, H=8);
// in training Chunked from kAutoChunkedScores scores, Math below: Math's backward is the
// article's formula, exact where a softmax saturates, while the fused backward's D = rowsum(dO o O)
// leaves such gradients off by rounding of their terms' magnitude, not of their own (up to 1e-4
// relative in float32 on the saturated goldens), and below that size Math's cost is small (0.6-2
// ms at T <= 256). Elsewhere Chunked's tiles of LibTorch ops pay off only for large scores. With
// its fused CPU backward, Chunked is ahead of LibTorch 2.x's own kernel in training as well
// (README, Performance), so Auto never picks Native.
Backend choose(const kernels::Problem& p, const torch::Tensor& query) {
  if (p.need_weights || p.dropout_p > 0.0 || p.mask_needs_grad) return Backend::Math;
  const bool small = p.score_count() < static_cast<double>(kAutoChunkedScores);
  if (kernels::fused_cpu_applies(query) && !p.needs_grad) return Backend::Chunked;
  return small ? Backend::Math : Backend::Chunked;
}

// The backend a problem runs on: its own, or Auto's choice.
Backend route(const kernels::Problem& given, const torch::Tensor& query) {
  const bool learned_bias = given.relative_bias.defined() && torch::GradMode::is_enabled() &&
                            given.relative_bias.requires_grad();
  if (given.backend != Backend::Auto) return given.backend;
  if ((learned_bias || given.score_mod) && !kernels::fused_cpu_applies(query)) return Backend::Math;
  return choose(given, query);
}

// What run() refuses of a problem on its backend, before anything runs: run() checks it, and a
// caller that must refuse before it changes anything (MultiHeadAttention::forward_paged, which
// writes its cache) checks it first.
void check_route(const kernels::Problem& given, Backend backend, const torch::Tensor& query,
                 const torch::Tensor& key) {
  const bool fused = kernels::fused_cpu_applies(query);
  const bool learned_bias = given.relative_bias.defined() && torch::GradMode::is_enabled() &&
                            given.relative_bias.requires_grad();
  const bool in_kernel = backend == Backend::Chunked && !given.degenerate() && fused;
  TORCH_CHECK(!(backend == Backend::Chunked && !in_kernel && learned_bias), given.caller,
              ": the Chunked backend differentiates relative_bias on the fused CPU kernels only "
              "(float, double or bfloat16 on the CPU); use Backend::Math (or Auto)");
  TORCH_CHECK(!(backend == Backend::Chunked && !fused && given.score_mod), given.caller,
              ": the Chunked backend applies a score_mod on the fused CPU kernels only (float, "
              "double or bfloat16 on the CPU); use Backend::Math (or Auto)");
  // Expanding a block mask or a relative bias into a mask changes nothing checked here.
  check_supported(given, backend, query, key);
}

// Runs a validated problem on the backend it asks for (or Auto's choice). Only the fused CPU
// kernels read a block mask by its blocks and a relative bias by relative position; every other
// route takes them as masks (the relative bias, with its gradient, on Math). A score_mod runs on
// the fused CPU kernels and on Math only.
AttentionOutput run(const kernels::Problem& given, const torch::Tensor& query,
                    const torch::Tensor& key, const torch::Tensor& value) {
  const bool fused = kernels::fused_cpu_applies(query);
  const Backend backend = route(given, query);
  const bool in_kernel = backend == Backend::Chunked && !given.degenerate() && fused;
  check_route(given, backend, query, key);
  kernels::Problem dense;
  // A packed problem's sequences take theirs one at a time (kernels::each_sequence).
  const bool expand =
      !in_kernel && !given.packed() && (given.block_mask || given.relative_bias.defined());
  if (expand) {
    // The bias first: a key the block mask hides stays hidden whatever the bias adds there.
    dense = kernels::with_dense_block_mask(kernels::with_dense_relative_bias(given));
  }
  const kernels::Problem& p = expand ? dense : given;
  // Nothing to attend, or nothing to multiply: every backend gives what whole matrices give.
  if (p.degenerate() || backend == Backend::Math) {
    last = Path::Math;
    if (backend == Backend::Chunked && fused && query.scalar_type() == at::kBFloat16) {
      return kernels::math_in_float(p, query, key, value);
    }
    return kernels::math(p, query, key, value);
  }
  if (backend == Backend::Native) {
    last = Path::Native;
    return kernels::native(p, query, key, value);
  }
  last = kernels::fused_cpu_applies(query) ? Path::ChunkedFused : Path::ChunkedTiles;
  return kernels::chunked(p, query, key, value);
}

// A decoding step (few queries, many keys) on the fused CPU route reads a contiguous cache as
// the paged kernel reads pages: the Chunked forward gives a thread a (batch, key/value head, query
// block) item, so one sequence with fewer key/value heads than threads leaves threads idle, and
// its tiles of matrix products have one or two rows. The paged kernel splits the keys across
// threads and takes each key once for all of its rows. Each batch row is a sequence whose keys
// are one page (the cache's own memory, read in place); the options hold as they are.
bool decodes_in_place(const kernels::Problem& p, const torch::Tensor& query,
                      const torch::Tensor& key, const torch::Tensor& value) {
  const bool fused = p.backend == Backend::Chunked ||
                     (p.backend == Backend::Auto &&
                      (choose(p, query) == Backend::Chunked || p.t_k >= kAutoDecodeKeys));
  if (!fused || p.degenerate() || p.packed() || !kernels::paged_forward_applies(query)) {
    return false;
  }
  // A block mask, a relative bias and a score_mod come along: the batch rows are the sequences
  // (a block mask's batch row too, unless it broadcasts over leading dims before the batch).
  if (p.mask.defined() || p.dropout_p > 0.0 || p.need_weights || p.needs_grad) {
    return false;
  }
  if (p.block_mask && p.block_mask->batch() != 1 && query.dim() > 4) return false;
  // A prompt chunk goes to Chunked's tiles; one query per head, however many heads share a
  // key/value head (multi-query), is an item of the paged kernel's matrix products.
  if (p.t_q > 1 && p.t_q * p.g > kernels::kPagedItemRows) return false;
  // The cache read in place: rows of contiguous features, the same batch dimensions as the query.
  if (key.stride(-1) != 1 || value.stride(-1) != 1) return false;
  const int64_t batch_dims = std::max<int64_t>(0, query.dim() - 3);
  return query.sizes().slice(0, batch_dims) == key.sizes().slice(0, batch_dims);
}

// The decoding step of a validated dense problem through the paged kernel: (..., H, Tq, dv).
torch::Tensor decode_in_place(const kernels::Problem& p, const torch::Tensor& query,
                              const torch::Tensor& key, const torch::Tensor& value,
                              const ScaledDotProductAttentionOptions& options) {
  const int64_t batch = p.n / p.kv_heads, h = p.heads, hkv = p.kv_heads;
  const auto cpu_long = torch::TensorOptions().dtype(torch::kLong);
  const auto packed =
      query.reshape({batch, h, p.t_q, p.d}).transpose(1, 2).reshape({batch * p.t_q, h, p.d});
  const auto keys = key.reshape({batch, hkv, p.t_k, p.d});
  const auto values = value.reshape({batch, hkv, p.t_k, p.dv});
  const auto starts = torch::arange(0, (batch + 1) * p.t_q, p.t_q, cpu_long);
  const auto lengths = torch::full({batch}, p.t_k, cpu_long);
  const auto table = torch::arange(batch, cpu_long).view({batch, 1});
  const auto paged =
      kernels::make_paged_problem(packed, keys, values, starts, lengths, table, options, p.caller);
  auto sizes = query.sizes().vec();
  sizes.back() = p.dv;
  return kernels::paged_forward(paged, packed, keys, values, kernels::paged_table(table))
      .view({batch, p.t_q, h, p.dv})
      .transpose(1, 2)
      .reshape(sizes);
}

// The keys (or values) of every sequence of a paged problem gathered one after another,
// (total_k, Hkv, d): the packed keys its problem describes, for the backends that read whole
// tensors. Keys in pages outside the pool (which no query sees: make_paged_problem checked) read
// as zeros.
torch::Tensor gathered(const kernels::Problem& p, const torch::Tensor& pages,
                       const torch::Tensor& table) {
  const int64_t num_pages = pages.size(0), page_size = pages.size(2);
  const kernels::Sequences& sequences = *p.sequences;
  const int64_t* entries = table.data_ptr<int64_t>();
  const int64_t ld = table.size(1), zero_row = num_pages * page_size;
  std::vector<int64_t> rows;
  rows.reserve(sequences.key_offsets.back());
  for (int64_t s = 0; s < sequences.count(); ++s) {
    for (int64_t j = 0; j < sequences.keys(s); ++j) {
      const int64_t page = entries[s * ld + j / page_size];
      rows.push_back(page >= 0 && page < num_pages ? page * page_size + j % page_size : zero_row);
    }
  }
  const auto flat = pages.permute({0, 2, 1, 3}).reshape({zero_row, pages.size(1), pages.size(3)});
  const auto padded =
      torch::cat({flat, torch::zeros({1, pages.size(1), pages.size(3)}, pages.options())});
  return padded.index_select(0, torch::tensor(rows, torch::kLong).to(pages.device()));
}

}  // namespace

torch::Tensor alibi_slopes(int64_t num_heads) {
  TORCH_CHECK_VALUE(num_heads > 0,
                    "attention::functional::alibi_slopes: expected num_heads > 0, got ", num_heads);
  TORCH_CHECK_VALUE(num_heads <= kMaxAlibiHeads,
                    "attention::functional::alibi_slopes: expected num_heads <= 2^24, got ",
                    num_heads);
  // The largest power of two n <= num_heads gets 2^(-8k/n), k = 1..n; the remaining heads take
  // the odd-numbered slopes 2^(-4k/n), k = 1, 3, 5, ... of the sequence for 2n heads.
  int64_t n = 1;
  while (2 * n <= num_heads) n *= 2;
  std::vector<double> slopes;
  for (int64_t k = 1; k <= n; ++k) slopes.push_back(std::pow(2.0, -8.0 * k / n));
  for (int64_t k = 1; static_cast<int64_t>(slopes.size()) < num_heads; k += 2) {
    slopes.push_back(std::pow(2.0, -4.0 * k / n));
  }
  return torch::tensor(slopes, torch::kDouble);
}

Path last_path() {
  return last;
}

void record_last_path(Path path) {
  last = path;
}

AttentionOutput scaled_dot_product_attention(const torch::Tensor& query, const torch::Tensor& key,
                                             const torch::Tensor& value,
                                             const ScaledDotProductAttentionOptions& options) {
  return scaled_dot_product_attention_named(query, key, value, options, kSdpa);
}

AttentionOutput scaled_dot_product_attention_named(const torch::Tensor& query,
                                                   const torch::Tensor& key,
                                                   const torch::Tensor& value,
                                                   const ScaledDotProductAttentionOptions& options,
                                                   const char* caller) {
  const auto p = kernels::make_problem(query, key, value, options, caller);
  if (decodes_in_place(p, query, key, value)) {
    last = Path::ChunkedFused;
    return {decode_in_place(p, query, key, value, options), {}};
  }
  return run(p, query, key, value);
}

torch::Tensor varlen_attention(const torch::Tensor& query, const torch::Tensor& key,
                               const torch::Tensor& value, const torch::Tensor& cu_seqlens_q,
                               const torch::Tensor& cu_seqlens_k,
                               const ScaledDotProductAttentionOptions& options) {
  return varlen_attention_named(query, key, value, cu_seqlens_q, cu_seqlens_k, options, kVarlen);
}

torch::Tensor varlen_attention_named(const torch::Tensor& query, const torch::Tensor& key,
                                     const torch::Tensor& value, const torch::Tensor& cu_seqlens_q,
                                     const torch::Tensor& cu_seqlens_k,
                                     const ScaledDotProductAttentionOptions& options,
                                     const char* caller) {
  const auto p =
      kernels::make_varlen_problem(query, key, value, cu_seqlens_q, cu_seqlens_k, options, caller);
  // Every backend reads the packed tokens as one batch of H heads, (H, total, d) views; the
  // output comes back in the packed layout (total_q, H, dv).
  const auto heads_first = [](const torch::Tensor& t) { return t.transpose(0, 1); };
  return run(p, heads_first(query), heads_first(key), heads_first(value)).output.transpose(0, 1);
}

torch::Tensor projected_attention(const torch::Tensor& x_q, const torch::Tensor& x_kv,
                                  const torch::Tensor& W_query, const torch::Tensor& W_key,
                                  const torch::Tensor& W_value,
                                  const ScaledDotProductAttentionOptions& options) {
  const auto p =
      kernels::make_projected_problem(x_q, x_kv, W_query, W_key, W_value, options, kProjected);
  const bool plain = !p.mask.defined() && !p.block_mask && !p.relative_bias.defined() &&
                     p.dropout_p == 0.0 && !p.need_weights && !p.beyond_native() &&
                     !p.bounded_left() && p.window_right < 0 && p.backend == Backend::Auto &&
                     !p.needs_grad;
  if (plain && kernels::tiny_applies(x_q, x_kv, W_query, W_key, W_value)) {
    last = Path::Direct;
    return kernels::tiny(p, x_q, x_kv, W_query, W_key, W_value);
  }
  auto queries = x_q.matmul(W_query);
  auto keys = x_kv.matmul(W_key);
  auto values = x_kv.matmul(W_value);
  return run(p, queries, keys, values).output;
}

torch::Tensor paged_attention(const torch::Tensor& query, const torch::Tensor& key_pages,
                              const torch::Tensor& value_pages, const torch::Tensor& cu_seqlens_q,
                              const torch::Tensor& key_lengths, const torch::Tensor& page_table,
                              const ScaledDotProductAttentionOptions& options) {
  return paged_attention(query, key_pages, torch::Tensor(), value_pages, torch::Tensor(),
                         cu_seqlens_q, key_lengths, page_table, options);
}

torch::Tensor paged_attention(const torch::Tensor& query, const torch::Tensor& key_pages,
                              const torch::Tensor& key_scales, const torch::Tensor& value_pages,
                              const torch::Tensor& value_scales, const torch::Tensor& cu_seqlens_q,
                              const torch::Tensor& key_lengths, const torch::Tensor& page_table,
                              const ScaledDotProductAttentionOptions& options) {
  const auto p =
      kernels::make_paged_problem(query, key_pages, value_pages, cu_seqlens_q, key_lengths,
                                  page_table, options, kPaged, key_scales, value_scales);
  const bool quantized = key_pages.scalar_type() == torch::kChar;
  if (paged_in_place(p, query, key_pages)) {
    last = Path::ChunkedFused;
    return kernels::paged_forward(p, query, key_pages, value_pages,
                                  kernels::paged_table(page_table), 0, key_scales, value_scales,
                                  kernels::paged_shares_prefixes());
  }
  if (!quantized) {
    const auto table = kernels::paged_table(page_table);
    const auto heads_first = [](const torch::Tensor& t) { return t.transpose(0, 1); };
    const auto keys = gathered(p, key_pages, table), values = gathered(p, value_pages, table);
    return run(p, heads_first(query), heads_first(keys), heads_first(values))
        .output.transpose(0, 1);
  }
  // The other routes (and double queries) read 8-bit pages as the keys they stand for, in the
  // queries' dtype: codes times scales, computed in float (double for double queries).
  const auto dtype = query.scalar_type();
  return paged_attention(query, detail::dequantize_rows(key_pages, key_scales, dtype),
                         detail::dequantize_rows(value_pages, value_scales, dtype), cu_seqlens_q,
                         key_lengths, page_table, options);
}

}  // namespace functional

namespace detail {

void check_paged_step(const torch::Tensor& query, const torch::Tensor& key_pages,
                      const torch::Tensor& key_scales, const torch::Tensor& value_pages,
                      const torch::Tensor& value_scales, const torch::Tensor& cu_seqlens_q,
                      const torch::Tensor& key_lengths, const torch::Tensor& page_table,
                      const functional::ScaledDotProductAttentionOptions& options,
                      const torch::Tensor& new_keys, const char* caller) {
  const auto p =
      kernels::make_paged_problem(query, key_pages, value_pages, cu_seqlens_q, key_lengths,
                                  page_table, options, caller, key_scales, value_scales);
  // The paged kernel refuses nothing make_paged_problem accepts.
  if (functional::paged_in_place(p, query, key_pages)) return;
  // The other routes run the problem on its gathered keys: of those only the step's own are not
  // in the pages yet, and what a route refuses of keys (non-finite ones) is refused of them here.
  const auto heads_first = [](const torch::Tensor& t) { return t.transpose(0, 1); };
  functional::check_route(p, functional::route(p, heads_first(query)), heads_first(query),
                          heads_first(new_keys));
}

}  // namespace detail
}  // namespace attention
