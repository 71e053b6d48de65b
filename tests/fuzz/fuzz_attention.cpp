// libFuzzer target: differential testing of scaled_dot_product_attention. Shapes, options, masks
// and values come from the fuzz input; integer options (windows, block size) are drawn from their
// extremes too (0, 1, 2^31, 2^53, 2^62, INT64_MAX - 1, INT64_MAX). The reference is Math in
// float64 with causality and the window written out as an explicit mask built here from the
// definitions, so that a mistake in the library's own window arithmetic cannot hide in both.
// Every backend must either raise a c10::Error or agree with the reference wherever the
// reference is finite (so never NaN where it is finite). A disagreement aborts with the case
// printed. A block mask, now and then, joins the reference as its dense mask built here from the
// same visibility table. Packed sequences (varlen_attention) and the pages of a cache
// (paged_attention) are checked the same way against each sequence alone. One case in eight moves
// one of its tensors to the meta device: every backend (and the operator
// torch.ops.attention.scaled_dot_product_attention) must refuse it.

#include <attention/block_mask.h>
#include <attention/functional.h>
#include <attention/operators.h>
#include <attention/paged_attention.h>

#include "../coded_queries.h"
#include "operators/kernels.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace F = attention::functional;

// Reads the fuzz input a byte at a time; zeros once it runs out.
class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t next() { return pos_ < size_ ? data_[pos_++] : 0; }
  int64_t below(int64_t n) { return next() % n; }

  // Finite values in [-8, 8], with NaN, +inf and -inf now and then: large enough scores to test
  // the softmax's range handling, small enough that float32 and float64 agree to ~1e-4.
  double value() {
    const uint8_t b = next();
    if (b == 255) return std::numeric_limits<double>::quiet_NaN();
    if (b == 254) return std::numeric_limits<double>::infinity();
    if (b == 253) return -std::numeric_limits<double>::infinity();
    return (static_cast<double>(b) - 126.0) / 16.0;
  }

  // An integer option from its extremes or from small values around the sequence lengths.
  int64_t extreme(int64_t length) {
    constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
    const int64_t values[] = {
        0,        1,   2, length - 1, length, int64_t{1} << 31, int64_t{1} << 53, int64_t{1} << 62,
        kMax - 1, kMax};
    const int64_t pick = values[below(10)];
    return pick < 0 ? 0 : pick;
  }

  torch::Tensor tensor(const std::vector<int64_t>& shape, torch::Dtype dtype) {
    auto t = torch::empty(shape, torch::kDouble);
    auto* p = t.data_ptr<double>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = value();
    return t.to(dtype);
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// The case at hand, printed when a backend disagrees.
std::string described;

[[noreturn]] void disagree(const char* backend, const char* what, double diff) {
  std::fprintf(stderr, "fuzz-attention: %s disagrees with Math (float64): %s (max |diff| %g)\n%s\n",
               backend, what, diff, described.c_str());
  std::abort();
}

// How far a result may be from the float64 reference. bfloat16 (inputs here are multiples of
// 1/16 in [-8, 8], exact in it) rounds each probability to 8 significant bits before it weights
// the values, and then the output: 2^-8 of the largest value, 8, and a margin.
double tolerance(torch::Dtype dtype) {
  if (dtype == torch::kBFloat16) return 0.05;
  return dtype == torch::kFloat ? 2e-3 : 1e-9;
}

void compare(const char* backend, const torch::Tensor& got, const torch::Tensor& ref, double tol) {
  if (got.sizes() != ref.sizes()) disagree(backend, "output shape", 0);
  const auto g = got.to(torch::kDouble);
  const auto finite = torch::isfinite(ref);
  if (torch::logical_and(finite, torch::logical_not(torch::isfinite(g))).any().item<bool>()) {
    disagree(backend, "non-finite where Math is finite", 0);
  }
  const auto zero = torch::zeros({}, ref.options());
  const auto diff = (torch::where(finite, g, zero) - torch::where(finite, ref, zero)).abs();
  const double max_diff = diff.numel() ? diff.max().item<double>() : 0.0;
  if (max_diff > tol) disagree(backend, "values", max_diff);
}

// The backends a packed or paged call is checked on, each with the name a disagreement prints.
using NamedBackends = std::vector<std::pair<F::Backend, const char*>>;

// Every backend must refuse `call(backend)` with a c10::Error; one that accepts it disagrees,
// with `otherwise` as what it did.
template <typename Call>
void every_backend_refuses(const NamedBackends& backends, const Call& call, const char* otherwise) {
  for (const auto& [backend, name] : backends) {
    bool refused = false;
    try {
      call(backend);
    } catch (const c10::Error&) {
      refused = true;
    }
    if (!refused) disagree(name, otherwise, 0);
  }
}

// Every backend either refuses `call(backend)` with a c10::Error (what it cannot do) or agrees
// with the reference.
template <typename Call>
void every_backend_agrees(const NamedBackends& backends, const Call& call, const torch::Tensor& ref,
                          double tol) {
  for (const auto& [backend, name] : backends) {
    torch::Tensor out;
    try {
      out = call(backend);
    } catch (const c10::Error&) {
      continue;
    }
    compare(name, out, ref, tol);
  }
}

// The operator torch.ops.attention.scaled_dot_product_attention, called as Python would.
torch::Tensor attention_operator(const torch::Tensor& q, const torch::Tensor& k,
                                 const torch::Tensor& v, const c10::optional<torch::Tensor>& mask,
                                 bool causal) {
  static const auto op = [] {
    attention::register_operators();
    return c10::Dispatcher::singleton()
        .findSchemaOrThrow("attention::scaled_dot_product_attention", "")
        .typed<decltype(attention::operators::attention_cpu)>();
  }();
  return op.call(q, k, v, mask, causal, "bottom_right", c10::nullopt, c10::nullopt, c10::nullopt,
                 c10::nullopt, c10::nullopt, c10::nullopt, 0.0, "auto", 256);
}

// Which of a call's tensors a case moves to the meta device (a device without data: whatever
// reads it is a bug), or -1 for none: one case in eight moves one of `count`.
int64_t misplaced_tensor(Bytes& in, int64_t count) {
  const int64_t pick = in.below(8 * count);
  return pick < count ? pick : -1;
}

// `t` on the meta device when `index` is `chosen`.
torch::Tensor placed(const torch::Tensor& t, int64_t index, int64_t chosen) {
  return index == chosen && t.defined() ? t.to(torch::kMeta) : t;
}

// The keys causality and the window hide, true = hidden, from their definitions: query i sits at
// pos = i + offset; key j is hidden when j > pos (causal), pos - j > window_left or
// j - pos > window_right. (pos - j is small: nothing here comes near the int64 limit.) Undefined
// when neither is set.
torch::Tensor hidden_by_position(const F::ScaledDotProductAttentionOptions& o, int64_t t_q,
                                 int64_t t_k) {
  if (!o.is_causal() && !o.window_left() && !o.window_right()) return {};
  const int64_t offset = o.causal_alignment() == F::CausalAlignment::TopLeft ? 0 : t_k - t_q;
  auto hidden = torch::zeros({t_q, t_k}, torch::kBool);
  auto* h = hidden.data_ptr<bool>();
  for (int64_t i = 0; i < t_q; ++i) {
    for (int64_t j = 0; j < t_k; ++j) {
      const int64_t pos = i + offset;
      h[i * t_k + j] = (o.is_causal() && j > pos) ||
                       (o.window_left() && pos - j > *o.window_left()) ||
                       (o.window_right() && j - pos > *o.window_right());
    }
  }
  return hidden;
}

// Packed sequences: functional::varlen_attention against each sequence alone through
// scaled_dot_product_attention on Math in float64. The same fuzz input, read its own way: the
// sequences' lengths and the options first, then the values. Now and then one offset is broken
// (moved by one, or set to an extreme): then every backend must refuse.
void check_varlen(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  const int64_t count = in.below(5);
  const bool cross = in.below(2) == 1;
  std::vector<int64_t> lq, lk, offsets_q{0}, offsets_k{0};
  for (int64_t s = 0; s < count; ++s) {
    lq.push_back(in.below(24));
    lk.push_back(cross ? in.below(24) : lq.back());
    offsets_q.push_back(offsets_q.back() + lq.back());
    offsets_k.push_back(offsets_k.back() + lk.back());
  }
  const int64_t kv_heads = in.below(8) == 0 ? 0 : 1 + in.below(2);
  const int64_t heads = kv_heads * (1 + in.below(3));
  const int64_t d = in.below(6), dv = 1 + in.below(5);
  const bool float32 = in.below(2) == 0;
  const auto dtype = float32 ? torch::kFloat : torch::kDouble;

  F::ScaledDotProductAttentionOptions options;
  options.is_causal(in.below(2) == 1);
  if (in.below(2) == 1) options.causal_alignment(F::CausalAlignment::TopLeft);
  if (in.below(3) == 0) options.window_left(in.below(6));
  if (in.below(4) == 0) options.window_right(in.below(6));
  if (in.below(4) == 0) options.softcap(std::vector<double>{0.5, 2.0, 30.0}[in.below(3)]);
  if (heads > 0 && in.below(4) == 0) options.alibi_slopes(F::alibi_slopes(heads));
  if (in.below(4) == 0) options.sinks(in.tensor({heads}, dtype));
  const int64_t scale = in.below(4);
  if (scale > 0) options.scale(std::vector<double>{0.5, -1.0, 0.0}[scale - 1]);
  options.block_size(in.below(8) == 0 ? (int64_t{1} << 40) : 1 + in.below(40));
  // A block mask with one row per sequence or one for all, made for the longest sequence or a
  // little more, hiding pairs by a pattern that differs per row; each sequence alone gets the
  // mask made for it from the same pattern, for the reference.
  int64_t mask_block = 0, period = 1, phase = 0;
  bool per_sequence = false;
  if (count > 0 && in.below(3) == 1) {
    per_sequence = in.below(2) == 1;
    period = 1 + in.below(8);
    phase = in.below(8);
    mask_block = 1 + in.below(20);
    const int64_t extra_q = in.below(3), extra_k = in.below(3);
    const auto pattern = [=](int64_t b, int64_t, int64_t i, int64_t j) {
      return (i + 2 * j + (per_sequence ? b : 0) * phase) % period != 0;
    };
    options.block_mask(attention::BlockMask::from_function(
        pattern, per_sequence ? count : 1, 1, *std::max_element(lq.begin(), lq.end()) + extra_q,
        *std::max_element(lk.begin(), lk.end()) + extra_k, mask_block));
  }
  // A broken offset: every backend must refuse it, before touching memory.
  const int64_t broken = in.below(8) == 0 ? 1 + in.below(5) : 0;
  auto& bad = in.below(2) == 0 ? offsets_q : offsets_k;
  // Moved by one, the first or the last offset breaks (an inner one may stay in order);
  // an extreme breaks any.
  const bool edge = in.below(2) == 0;
  const size_t at = broken <= 2 ? (edge ? 0 : bad.size() - 1)
                                : static_cast<size_t>(in.below(static_cast<int64_t>(bad.size())));
  switch (broken) {
    case 1:
      bad[at] += 1;
      break;
    case 2:
      bad[at] -= 1;
      break;
    case 3:
      bad[at] = std::numeric_limits<int64_t>::max();
      break;
    case 4:
      bad[at] = std::numeric_limits<int64_t>::min();
      break;
    case 5:
      bad.push_back(bad.back());
      break;
    default:
      break;
  }

  const auto q = in.tensor({std::accumulate(lq.begin(), lq.end(), int64_t{0}), heads, d}, dtype);
  const auto k = in.tensor({std::accumulate(lk.begin(), lk.end(), int64_t{0}), kv_heads, d}, dtype);
  const auto v = in.tensor({k.size(0), kv_heads, dv}, dtype);
  const auto cu_q = torch::tensor(offsets_q, torch::kLong),
             cu_k = torch::tensor(offsets_k, torch::kLong);
  const int64_t misplaced = misplaced_tensor(in, 5);

  std::ostringstream case_text;
  case_text << "varlen_attention: query " << q.sizes() << " key " << k.sizes() << " value "
            << v.sizes() << " dtype " << q.scalar_type() << " cu_seqlens_q " << cu_q
            << " cu_seqlens_k " << cu_k << " causal " << options.is_causal() << " top-left "
            << (options.causal_alignment() == F::CausalAlignment::TopLeft) << " window "
            << options.window_left().value_or(-1) << "/" << options.window_right().value_or(-1)
            << " softcap " << options.softcap().value_or(0) << " alibi "
            << options.alibi_slopes().defined() << " sinks " << options.sinks() << " scale "
            << (options.scale() ? *options.scale() : -999.0) << " block " << options.block_size()
            << " block mask " << (mask_block > 0) << " (per sequence " << per_sequence
            << ", period " << period << ", phase " << phase << ", block " << mask_block << ")"
            << "\nq " << q << "\nk " << k << "\nv " << v;
  described = case_text.str();

  const NamedBackends backends = {{F::Backend::Math, "Math (packed)"},
                                  {F::Backend::Chunked, "Chunked (packed)"},
                                  {F::Backend::Native, "Native (packed)"},
                                  {F::Backend::Auto, "Auto (packed)"}};
  const auto packed = [&](F::Backend backend) {
    return F::varlen_attention(q, k, v, cu_q, cu_k,
                               F::ScaledDotProductAttentionOptions(options).backend(backend));
  };
  if (broken) {
    every_backend_refuses(backends, packed, "accepted broken offsets");
    return;
  }
  if (misplaced >= 0) {
    every_backend_refuses(
        backends,
        [&](F::Backend backend) {
          return F::varlen_attention(placed(q, 0, misplaced), placed(k, 1, misplaced),
                                     placed(v, 2, misplaced), placed(cu_q, 3, misplaced),
                                     placed(cu_k, 4, misplaced),
                                     F::ScaledDotProductAttentionOptions(options).backend(backend));
        },
        "accepted a tensor on the meta device");
    return;
  }
  // Each sequence alone, (H, T, d) views, on Math in float64.
  auto reference = options;
  reference.backend(F::Backend::Math);
  if (reference.sinks().defined()) reference.sinks(reference.sinks().to(torch::kDouble));
  std::vector<torch::Tensor> parts;
  try {
    for (int64_t s = 0; s < count; ++s) {
      const auto rows = [](const torch::Tensor& t, int64_t from, int64_t n) {
        return t.to(torch::kDouble).narrow(0, from, n).transpose(0, 1);
      };
      auto own = reference;
      own.block_mask(c10::nullopt);
      if (mask_block > 0 && lq[s] > 0 && lk[s] > 0) {
        own.block_mask(attention::BlockMask::from_function(
            [=](int64_t, int64_t, int64_t i, int64_t j) {
              return (i + 2 * j + (per_sequence ? s : 0) * phase) % period != 0;
            },
            1, 1, lq[s], lk[s], mask_block));
      }
      parts.push_back(F::scaled_dot_product_attention(rows(q, offsets_q[s], lq[s]),
                                                      rows(k, offsets_k[s], lk[s]),
                                                      rows(v, offsets_k[s], lk[s]), own)
                          .output.transpose(0, 1));
    }
  } catch (const c10::Error&) {
    // Refused for a sequence alone: refused packed too, on every backend.
    every_backend_refuses(backends, packed, "accepted what Math refused for a sequence alone");
    return;
  }
  const auto ref =
      parts.empty() ? torch::zeros({0, heads, dv}, torch::kDouble) : torch::cat(parts, 0);
  every_backend_agrees(backends, packed, ref, tolerance(dtype));
}

// One page's rows of 8 bits, (Hkv, P, width) codes and (Hkv, P) scales: codes from the input,
// each row's scale mostly a power of two (exact in float and float64, so the reference's keys are
// exactly what the codes stand for), now and then negative, 0 or NaN.
void draw_8bit_rows(Bytes& in, const torch::Tensor& codes, const torch::Tensor& scales) {
  auto* code = codes.data_ptr<int8_t>();
  for (int64_t i = 0; i < codes.numel(); ++i) code[i] = static_cast<int8_t>(in.next());
  auto* scale = scales.data_ptr<float>();
  for (int64_t i = 0; i < scales.numel(); ++i) {
    const int64_t pick = in.below(16);
    scale[i] = pick < 10    ? 1.0f / 16
               : pick < 13  ? 1.0f / 64
               : pick == 13 ? -1.0f / 16
               : pick == 14 ? 0.0f
                            : NAN;
  }
}

// Keys and values in the pages of a cache: functional::paged_attention against each sequence
// alone (its keys gathered from its pages) through scaled_dot_product_attention on Math in
// float64. The pages in shuffled order, some sequences beginning with an earlier one's pages
// (shared prefixes, in any order), pages no sequence holds full of NaN (a kernel that reads
// a wrong page shows), the table's entries past a sequence's length -1 or an extreme; groups of
// 16 query heads and chunks of 16 queries or more take the kernel's matrix products, and two
// threads its split of the keys. Now and then a length is broken (every backend must refuse it)
// or a sequence's first page entry (refused, or, where no query sees its keys, not read). A third
// of the cases hold 8-bit pages (codes and a scale per row; pages no sequence holds have NaN
// scales) through paged_attention's overload with scales, against the keys the codes stand for.
void check_paged(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  const int64_t count = in.below(4);
  const int64_t page_size = 1 + in.below(8);
  std::vector<int64_t> lq, lk, offsets_q{0};
  int64_t pages = 0, widest = 0;
  for (int64_t s = 0; s < count; ++s) {
    lk.push_back(in.below(40));
    lq.push_back(in.below(3) == 0 ? 1 : in.below(24));
    offsets_q.push_back(offsets_q.back() + lq.back());
    const int64_t needed = (lk.back() + page_size - 1) / page_size;
    pages += needed;
    widest = std::max(widest, needed + in.below(2));
  }
  const int64_t kv_heads = 1 + in.below(2);
  const int64_t heads = kv_heads * std::vector<int64_t>{1, 2, 3, 16}[in.below(4)];
  const int64_t d = std::vector<int64_t>{1, 3, 16, 32}[in.below(4)];
  // 32 now and then: a register of 16-bit codes on every route, where 8-bit values meet coded
  // weights.
  const int64_t dv = in.below(4) == 0 ? 32 : 1 + in.below(17);
  const bool float32 = in.below(2) == 0;
  const auto dtype = float32 ? torch::kFloat : torch::kDouble;

  F::ScaledDotProductAttentionOptions options;
  options.is_causal(in.below(2) == 1);
  if (in.below(2) == 1) options.causal_alignment(F::CausalAlignment::TopLeft);
  if (in.below(3) == 0) options.window_left(in.below(3) == 0 ? in.extreme(40) : in.below(12));
  if (in.below(4) == 0) options.window_right(in.below(3) == 0 ? in.extreme(40) : in.below(12));
  if (in.below(4) == 0) options.softcap(std::vector<double>{0.5, 2.0, 30.0}[in.below(3)]);
  if (in.below(4) == 0) options.alibi_slopes(F::alibi_slopes(heads));
  if (in.below(4) == 0) options.sinks(in.tensor({heads}, dtype));
  const int64_t scale = in.below(4);
  if (scale > 0) options.scale(std::vector<double>{0.5, -1.0, 0.0}[scale - 1]);
  const bool two_threads = in.below(2) == 0;
  const bool eight_bit = in.below(3) == 0;

  // The pool: the sequences' pages in shuffled order, then two that no sequence holds.
  std::vector<int64_t> order(pages + 2);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(in.next()));
  auto key_pages = torch::full({pages + 2, kv_heads, page_size, d}, NAN, torch::kDouble);
  auto value_pages = torch::full({pages + 2, kv_heads, page_size, dv}, NAN, torch::kDouble);
  auto table = torch::full({count, widest}, -1, torch::kLong);
  torch::Tensor key_codes, value_codes, key_scales, value_scales;  // 8-bit pages
  if (eight_bit) {
    key_codes = torch::zeros({pages + 2, kv_heads, page_size, d}, torch::kChar);
    value_codes = torch::zeros({pages + 2, kv_heads, page_size, dv}, torch::kChar);
    key_scales = torch::full({pages + 2, kv_heads, page_size}, NAN, torch::kFloat);
    value_scales = torch::full({pages + 2, kv_heads, page_size}, NAN, torch::kFloat);
  }
  // The keys the codes of a page stand for, in float64.
  const auto decoded = [](const torch::Tensor& codes, const torch::Tensor& scales) {
    return codes.to(torch::kDouble) * scales.to(torch::kDouble).unsqueeze(-1);
  };
  std::vector<torch::Tensor> keys, values;  // each sequence's (T_k, Hkv, d), gathered
  int64_t next = 0;
  for (int64_t s = 0; s < count; ++s) {
    const int64_t needed = (lk[s] + page_size - 1) / page_size;
    // Half the time a sequence begins with some of an earlier one's pages (a cached prefix, a
    // fork): the kernel stacks those pages' rows across the sharers.
    const int64_t from = s > 0 && in.below(2) == 0 ? in.below(s) : -1;
    const int64_t shared =
        from < 0 ? 0 : in.below(std::min(needed, (lk[from] + page_size - 1) / page_size) + 1);
    for (int64_t j = 0; j < needed; ++j) {
      if (j < shared) {
        table[s][j] = table[from][j];
        continue;
      }
      const int64_t page = order[next++];
      table[s][j] = page;
      if (eight_bit) {
        draw_8bit_rows(in, key_codes[page], key_scales[page]);
        draw_8bit_rows(in, value_codes[page], value_scales[page]);
        key_pages[page].copy_(decoded(key_codes[page], key_scales[page]));
        value_pages[page].copy_(decoded(value_codes[page], value_scales[page]));
        continue;
      }
      key_pages[page].copy_(in.tensor({kv_heads, page_size, d}, torch::kDouble));
      value_pages[page].copy_(in.tensor({kv_heads, page_size, dv}, torch::kDouble));
    }
    for (int64_t j = needed; j < widest; ++j) {
      table[s][j] = std::vector<int64_t>{-1, std::numeric_limits<int64_t>::max(),
                                         std::numeric_limits<int64_t>::min()}[in.below(3)];
    }
    const auto gather = [&](const torch::Tensor& pool) {
      if (needed == 0) return torch::empty({0, kv_heads, pool.size(3)}, torch::kDouble);
      return pool.index_select(0, table[s].narrow(0, 0, needed))
          .transpose(1, 2)
          .reshape({needed * page_size, kv_heads, pool.size(3)})
          .narrow(0, 0, lk[s]);
    };
    keys.push_back(gather(key_pages));
    values.push_back(gather(value_pages));
  }
  const auto q = in.tensor({offsets_q.back(), heads, d}, dtype);
  auto lengths = torch::tensor(lk, torch::kLong).view({count});
  // A broken entry or length: every backend must refuse it, before touching memory.
  const int64_t broken = in.below(8) == 0 && count > 0 ? 1 + in.below(3) : 0;
  const int64_t victim = count > 0 ? in.below(count) : 0;
  if (broken == 1 && lk[victim] > 0) table[victim][0] = pages + 2;  // past the pool
  if (broken == 2 && lk[victim] > 0) table[victim][0] = -1;
  if (broken == 3) lengths[victim] = widest * page_size + 1;  // more keys than its pages hold
  // A broken entry is refused where some query sees a key of its page; where none does, the page
  // may hold anything, and the result must not change.
  const auto k_pages = eight_bit ? key_codes : key_pages.to(dtype);
  const auto v_pages = eight_bit ? value_codes : value_pages.to(dtype);
  const auto cu_q = torch::tensor(offsets_q, torch::kLong);
  const int64_t misplaced = misplaced_tensor(in, 6);

  std::ostringstream case_text;
  case_text << "paged_attention: query " << q.sizes() << " key_pages " << k_pages.sizes()
            << " value_pages " << v_pages.sizes() << " dtype " << q.scalar_type()
            << " cu_seqlens_q " << cu_q << " key_lengths " << lengths << " page_table " << table
            << " causal " << options.is_causal() << " top-left "
            << (options.causal_alignment() == F::CausalAlignment::TopLeft) << " window "
            << options.window_left().value_or(-1) << "/" << options.window_right().value_or(-1)
            << " softcap " << options.softcap().value_or(0) << " alibi "
            << options.alibi_slopes().defined() << " sinks " << options.sinks() << " scale "
            << (options.scale() ? *options.scale() : -999.0) << " two threads " << two_threads
            << " 8-bit " << eight_bit << "\nq " << q << "\nkey pages " << k_pages
            << "\nvalue pages " << v_pages;
  if (eight_bit) case_text << "\nkey scales " << key_scales << "\nvalue scales " << value_scales;
  described = case_text.str();

  const NamedBackends backends = {{F::Backend::Math, "Math (paged)"},
                                  {F::Backend::Chunked, "Chunked (paged)"},
                                  {F::Backend::Auto, "Auto (paged)"}};
  const auto paged = [&](F::Backend backend) {
    torch::NoGradGuard no_grad;
    const auto o = F::ScaledDotProductAttentionOptions(options).backend(backend);
    const auto call = [&] {
      if (eight_bit) {
        return F::paged_attention(q, k_pages, key_scales, v_pages, value_scales, cu_q, lengths,
                                  table, o);
      }
      return F::paged_attention(q, k_pages, v_pages, cu_q, lengths, table, o);
    };
    if (!two_threads) return call();
    at::set_num_threads(2);
    try {
      auto out = call();
      at::set_num_threads(1);
      return out;
    } catch (...) {
      at::set_num_threads(1);
      throw;
    }
  };
  if (broken == 3) {
    every_backend_refuses(backends, paged, "accepted more keys than a sequence's pages hold");
    return;
  }
  if (misplaced >= 0) {
    every_backend_refuses(
        backends,
        [&](F::Backend backend) {
          const auto o = F::ScaledDotProductAttentionOptions(options).backend(backend);
          const auto at = [&](const torch::Tensor& t, int64_t i) {
            return placed(t, i, misplaced);
          };
          if (eight_bit) {
            return F::paged_attention(at(q, 0), at(k_pages, 1), key_scales, at(v_pages, 2),
                                      value_scales, at(cu_q, 3), at(lengths, 4), at(table, 5), o);
          }
          return F::paged_attention(at(q, 0), at(k_pages, 1), at(v_pages, 2), at(cu_q, 3),
                                    at(lengths, 4), at(table, 5), o);
        },
        "accepted a tensor on the meta device");
    return;
  }
  auto reference = options;
  reference.backend(F::Backend::Math);
  if (reference.sinks().defined()) reference.sinks(reference.sinks().to(torch::kDouble));
  // Each sequence alone on Math in float64, of `queries` (Math may refuse: it throws).
  const auto reference_of = [&](const torch::Tensor& queries) {
    std::vector<torch::Tensor> parts;
    for (int64_t s = 0; s < count; ++s) {
      const auto query = queries.narrow(0, offsets_q[s], lq[s]).transpose(0, 1);
      parts.push_back(F::scaled_dot_product_attention(
                          query, keys[s].to(dtype).to(torch::kDouble).transpose(0, 1),
                          values[s].to(dtype).to(torch::kDouble).transpose(0, 1), reference)
                          .output.transpose(0, 1));
    }
    return parts.empty() ? torch::zeros({0, heads, dv}, torch::kDouble) : torch::cat(parts, 0);
  };
  torch::Tensor ref;
  try {
    ref = reference_of(q.to(torch::kDouble));
  } catch (const c10::Error&) {
    every_backend_refuses(backends, paged, "accepted what Math refused for a sequence alone");
    return;
  }
  // 8-bit pages on the fused kernel: its queries as it codes them for its integer products, where
  // it does (with a softmax scale of 0 every score is 0 whatever the queries), and the weights'
  // coding's bound on top of the tolerance. Math (paged) reads the keys the codes stand for.
  auto fused_ref = ref;
  double fused_tol = tolerance(dtype);
  if (eight_bit) {
    const double softmax_scale = test::softmax_scale(options.scale(), d);
    if (softmax_scale != 0) {
      fused_ref = reference_of(test::reference_queries(q, softmax_scale, torch::kChar, dv));
    }
    fused_tol += test::weight_coding_bound(40, 8.0, torch::kChar, dtype, d, dv);
  }
  every_backend_agrees({backends[0]}, paged, ref, tolerance(dtype));
  every_backend_agrees({backends[1], backends[2]}, paged, fused_ref, fused_tol);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool once = [] {
    at::set_num_threads(1);
    return true;
  }();
  (void)once;
  check_varlen(data, size);
  check_paged(data, size);
  Bytes in(data, size);
  const int64_t rank = 2 + in.below(4);
  std::vector<int64_t> lead;
  for (int64_t i = 0; i + 3 < rank; ++i) lead.push_back(in.below(3));
  const int64_t kv_heads = in.below(8) == 0 ? 0 : 1 + in.below(3);
  const int64_t heads = kv_heads * (1 + in.below(3));
  const int64_t t_q = in.below(40), t_k = in.below(40), d = in.below(10), dv = 1 + in.below(8);
  // float32, float64, and bfloat16 now and then (the fused kernels' bfloat16 products, where the
  // processor has them).
  const int64_t precision = in.below(5);
  const auto dtype = precision < 2   ? torch::kFloat
                     : precision < 4 ? torch::kDouble
                                     : torch::kBFloat16;

  auto shape = [&](int64_t h, int64_t t, int64_t f) {
    auto s = lead;
    if (rank >= 3) s.push_back(h);
    s.insert(s.end(), {t, f});
    return s;
  };
  const auto q = in.tensor(shape(heads, t_q, d), dtype);
  const auto k = in.tensor(shape(kv_heads, t_k, d), dtype);
  const auto v = in.tensor(shape(kv_heads, t_k, dv), dtype);

  F::ScaledDotProductAttentionOptions options;
  options.is_causal(in.below(2) == 1);
  const int64_t scale = in.below(6);
  if (scale > 0) options.scale(std::vector<double>{0.5, 2.0, -1.0, 0.0, 0.125}[scale - 1]);
  options.block_size(in.below(4) == 0 ? std::max<int64_t>(1, in.extreme(t_k)) : 1 + in.below(70));
  if (in.below(2) == 1) options.causal_alignment(F::CausalAlignment::TopLeft);
  if (in.below(3) == 1) options.window_left(in.extreme(std::max(t_q, t_k)));
  if (in.below(3) == 1) options.window_right(in.extreme(std::max(t_q, t_k)));
  auto scores = shape(heads, t_q, t_k);
  switch (in.below(5)) {
    case 1:  // bool, full
      options.attn_mask(in.tensor(scores, torch::kDouble) > 2.0);
      break;
    case 2:  // bool, key padding
      options.attn_mask(in.tensor({t_k}, torch::kDouble) > 1.0);
      break;
    case 3:  // additive, full
      options.attn_mask(in.tensor(scores, dtype));
      break;
    case 4:  // additive, (Tq, Tk)
      options.attn_mask(in.tensor({t_q, t_k}, dtype));
      break;
    default:
      break;
  }
  // A block mask: pairs visible in patches of 1 to 8 positions, each patch hidden, visible or
  // visible pair by pair, so that its blocks (of any size) take every class; one for all heads
  // or one per head. Hidden pairs for the reference, shaped to broadcast to the scores.
  torch::Tensor block_hidden;
  std::ostringstream block_text;
  if (in.below(3) == 1) {
    const int64_t mask_heads = rank >= 3 && heads > 0 && in.below(2) == 1 ? heads : 1;
    const int64_t patch = 1 + in.below(8);
    auto visible = torch::empty({mask_heads, t_q, t_k}, torch::kBool);
    auto* at = visible.data_ptr<bool>();
    for (int64_t h = 0; h < mask_heads; ++h) {
      for (int64_t pq = 0; pq < t_q; pq += patch) {
        for (int64_t pk = 0; pk < t_k; pk += patch) {
          const int64_t kind = in.below(3);
          for (int64_t i = pq; i < std::min(t_q, pq + patch); ++i) {
            for (int64_t j = pk; j < std::min(t_k, pk + patch); ++j) {
              at[(h * t_q + i) * t_k + j] = kind == 2 ? in.below(2) == 1 : kind == 1;
            }
          }
        }
      }
    }
    const int64_t block =
        in.below(4) == 0 ? std::max<int64_t>(1, in.extreme(t_k)) : 1 + in.below(40);
    const auto mask = attention::BlockMask::from_function(
        [visible, at, t_q, t_k](int64_t, int64_t h, int64_t i, int64_t j) {
          return at[(h * t_q + i) * t_k + j];
        },
        1, mask_heads, t_q, t_k, block);
    options.block_mask(mask);
    block_hidden = rank >= 3 ? visible.logical_not() : visible[0].logical_not();
    block_text << "\nblock mask " << mask << "\nvisible " << visible;
  }
  // A relative position bias, one bucket per distance up to a few positions (its dense bias for
  // the reference written out here from the definition).
  torch::Tensor relative_dense;
  if (in.below(3) == 1) {
    const int64_t max_distance = std::vector<int64_t>{0, 1, 2, 5, 39}[in.below(5)];
    const int64_t table_heads = rank >= 3 ? heads : 1;
    const auto table = in.tensor({2 * max_distance + 1, table_heads}, dtype);
    options.relative_bias(table).relative_buckets(F::RelativeBuckets::distance(max_distance));
    const int64_t offset =
        options.causal_alignment() == F::CausalAlignment::TopLeft ? 0 : t_k - t_q;
    auto dense = torch::empty({table_heads, t_q, t_k}, torch::kDouble);
    const auto wide = table.to(torch::kDouble).contiguous();
    const double* w = wide.data_ptr<double>();
    double* out = dense.data_ptr<double>();
    for (int64_t h = 0; h < table_heads; ++h) {
      for (int64_t i = 0; i < t_q; ++i) {
        for (int64_t j = 0; j < t_k; ++j) {
          const int64_t bucket = std::clamp<int64_t>(j - (i + offset), -max_distance, max_distance);
          out[(h * t_q + i) * t_k + j] = w[(bucket + max_distance) * table_heads + h];
        }
      }
    }
    relative_dense = rank >= 3 ? dense : dense[0];
    block_text << "\nrelative bias (max_distance " << max_distance << ") " << table;
  }
  // A score modification adding c times the relative position j - pos(i), from the tile's
  // indices (its dense bias for the reference written out here from the definition).
  torch::Tensor modified_dense;
  if (in.below(3) == 1) {
    const double c = std::vector<double>{0.01, -0.3, 1.5}[in.below(3)];
    options.score_mod(
        attention::ScoreMod([c](const torch::Tensor& s, const attention::ScoreTile& t) {
          const int64_t first = t.query_begin + t.query_offset;
          const auto relative =
              torch::arange(t.key_begin, t.key_begin + s.size(1), torch::kDouble).view({1, -1}) -
              torch::arange(first, first + s.size(0), torch::kDouble).view({-1, 1});
          return s.add_(relative.mul(c).to(s.scalar_type()));
        }));
    const int64_t offset =
        options.causal_alignment() == F::CausalAlignment::TopLeft ? 0 : t_k - t_q;
    modified_dense = (torch::arange(t_k, torch::kDouble).view({1, -1}) -
                      torch::arange(t_q, torch::kDouble).view({-1, 1}) - offset) *
                     c;
    block_text << "\nscore_mod adding " << c << " x relative position";
  }

  const int64_t misplaced = misplaced_tensor(in, options.attn_mask().defined() ? 4 : 3);

  std::ostringstream case_text;
  case_text << "query " << q.sizes() << " key " << k.sizes() << " value " << v.sizes() << " dtype "
            << q.scalar_type() << " causal " << options.is_causal() << " scale "
            << (options.scale() ? *options.scale() : -999.0) << " block " << options.block_size()
            << " top-left " << (options.causal_alignment() == F::CausalAlignment::TopLeft)
            << " window " << options.window_left().value_or(-1) << "/"
            << options.window_right().value_or(-1) << "\nq " << q << "\nk " << k << "\nv " << v
            << "\nmask " << options.attn_mask() << block_text.str();
  described = case_text.str();
  auto reference = options;
  reference.backend(F::Backend::Math)
      .is_causal(false)
      .window_left({})
      .window_right({})
      .block_mask(c10::nullopt)
      .relative_bias({})
      .score_mod(c10::nullopt);
  if (reference.attn_mask().defined() && reference.attn_mask().is_floating_point()) {
    reference.attn_mask(reference.attn_mask().to(torch::kDouble));
  }
  // The dense biases join the reference's mask: added to a float one, -inf where a bool one hides.
  for (const auto& bias : {relative_dense, modified_dense}) {
    if (!bias.defined()) continue;
    const auto& mask = reference.attn_mask();
    reference.attn_mask(!mask.defined() ? bias
                        : mask.is_floating_point()
                            ? mask + bias
                            : torch::where(mask, torch::full({}, -INFINITY, torch::kDouble), bias));
  }
  for (const auto& hidden : {hidden_by_position(options, t_q, t_k), block_hidden}) {
    if (!hidden.defined()) continue;
    const auto& mask = reference.attn_mask();
    reference.attn_mask(!mask.defined()            ? hidden
                        : mask.is_floating_point() ? mask.masked_fill(hidden, -INFINITY)
                                                   : mask.logical_or(hidden));
  }
  const NamedBackends backends = {{F::Backend::Math, "Math"},
                                  {F::Backend::Chunked, "Chunked"},
                                  {F::Backend::Native, "Native"},
                                  {F::Backend::Auto, "Auto"}};
  const auto dense = [&](F::Backend backend) {
    return F::scaled_dot_product_attention(q, k, v, options.backend(backend)).output;
  };
  if (misplaced >= 0) {
    // Every backend, and the operator (whose kernel the dispatcher picks by the highest device
    // among the tensors: the Meta kernel here), refuses a tensor on another device.
    const auto& mask = options.attn_mask();
    every_backend_refuses(
        backends,
        [&](F::Backend backend) {
          auto moved = options;
          if (mask.defined()) moved.attn_mask(placed(mask, 3, misplaced));
          return F::scaled_dot_product_attention(placed(q, 0, misplaced), placed(k, 1, misplaced),
                                                 placed(v, 2, misplaced), moved.backend(backend))
              .output;
        },
        "accepted a tensor on the meta device");
    every_backend_refuses(
        {{F::Backend::Auto, "the operator"}},
        [&](F::Backend) {
          return attention_operator(
              placed(q, 0, misplaced), placed(k, 1, misplaced), placed(v, 2, misplaced),
              mask.defined() ? c10::optional<torch::Tensor>(placed(mask, 3, misplaced))
                             : c10::nullopt,
              options.is_causal());
        },
        "accepted a tensor on the meta device");
    return 0;
  }
  torch::Tensor ref;
  try {
    ref = F::scaled_dot_product_attention(q.to(torch::kDouble), k.to(torch::kDouble),
                                          v.to(torch::kDouble), reference)
              .output;
  } catch (const c10::Error&) {
    // Refused input: every backend must refuse it too (validation comes before any backend).
    every_backend_refuses(NamedBackends(backends.begin() + 1, backends.end()), dense,
                          "accepted what Math refused");
    return 0;
  }
  // Only the fused kernels hold bfloat16 to float's accuracy; Math and the others compute in it.
  every_backend_agrees(
      dtype == torch::kBFloat16 ? NamedBackends{{F::Backend::Chunked, "Chunked"}} : backends, dense,
      ref, tolerance(dtype));
  return 0;
}
