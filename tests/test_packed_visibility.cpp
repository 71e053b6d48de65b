// Packed sequences with a block mask, a relative position bias and a score modification:
// varlen_attention (fused and Math) against each sequence alone through
// scaled_dot_product_attention on Math, given the block mask made for that sequence alone, the
// same table, and the modification told which sequence it is in; forward, and backward with the
// table's gradient. The mask has one row per sequence or one for all, one head or one per head,
// and is made for more queries and keys than the longest sequence. Bad masks refused by name.
// paged_attention's are in test_paged_attention.cpp.

#include <attention/block_mask.h>
#include <attention/functional.h>
#include <attention/score_mod.h>

#include "golden/harness.h"
#include "helpers.h"

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace packed_visibility_test {

namespace F = attention::functional;
using attention::BlockMask;
using attention::ScoreMod;
using attention::ScoreTile;
using Options = F::ScaledDotProductAttentionOptions;

// Which keys query i of sequence s, head h sees: a pattern of every block class, different per
// sequence and head (with one row or one head, s or h is 0).
bool visible(int64_t s, int64_t h, int64_t i, int64_t j) {
  return j < 3 || (i + 2 * j + s + h) % 5 != 0;
}

// `mod` told that its tiles are of sequence s (as varlen_attention tells it), for a call of that
// sequence alone (whose tiles are of batch 0).
ScoreMod in_sequence(const ScoreMod& mod, int64_t s) {
  const auto moved = [s](ScoreTile t) {
    t.batch = s;
    return t;
  };
  return ScoreMod([mod, moved](const torch::Tensor& x,
                               const ScoreTile& t) { return mod.function()(x, moved(t)); },
                  [mod, moved](const torch::Tensor& x, const torch::Tensor& g, const ScoreTile& t) {
                    return mod.derivative()(x, g, moved(t));
                  });
}

struct Packed {
  std::vector<int64_t> t_q, t_k;
  torch::Tensor q, k, v, upstream, cu_q, cu_k;
};

Packed make_packed(std::vector<int64_t> t_q, std::vector<int64_t> t_k, int64_t heads,
                   int64_t kv_heads, torch::Dtype dtype) {
  Packed p{t_q, t_k, {}, {}, {}, {}, {}, {}};
  std::vector<int64_t> cu_q{0}, cu_k{0};
  for (size_t s = 0; s < t_q.size(); ++s) {
    cu_q.push_back(cu_q.back() + t_q[s]);
    cu_k.push_back(cu_k.back() + t_k[s]);
  }
  const auto opts = torch::TensorOptions().dtype(dtype);
  p.q = torch::randn({cu_q.back(), heads, 16}, opts) * 2;
  p.k = torch::randn({cu_k.back(), kv_heads, 16}, opts);
  p.v = torch::randn({cu_k.back(), kv_heads, 8}, opts);
  p.upstream = torch::randn({cu_q.back(), heads, 8}, opts);
  p.cu_q = torch::tensor(cu_q, torch::kLong);
  p.cu_k = torch::tensor(cu_k, torch::kLong);
  return p;
}

// Output and the gradients of query, key, value and the table.
using Results = std::vector<torch::Tensor>;

Results packed_call(const Packed& p, const Options& options, const torch::Tensor& table) {
  auto q = p.q.clone().requires_grad_(), k = p.k.clone().requires_grad_(),
       v = p.v.clone().requires_grad_(), t = table.clone().requires_grad_();
  const auto out = F::varlen_attention(q, k, v, p.cu_q, p.cu_k, Options(options).relative_bias(t));
  out.backward(p.upstream);
  return {out.detach(), q.grad(), k.grad(), v.grad(), t.grad()};
}

// Each sequence alone on Math, with `each(s)` its options.
template <typename Each>
Results alone(const Packed& p, const Each& each, const torch::Tensor& table) {
  auto q = p.q.clone().requires_grad_(), k = p.k.clone().requires_grad_(),
       v = p.v.clone().requires_grad_(), t = table.clone().requires_grad_();
  std::vector<torch::Tensor> parts;
  int64_t q0 = 0, k0 = 0;
  for (size_t s = 0; s < p.t_q.size(); ++s) {
    const int64_t n = p.t_q[s], m = p.t_k[s];
    const auto heads_first = [](const torch::Tensor& x) { return x.transpose(0, 1); };
    parts.push_back(F::scaled_dot_product_attention(
                        heads_first(q.narrow(0, q0, n)), heads_first(k.narrow(0, k0, m)),
                        heads_first(v.narrow(0, k0, m)),
                        Options(each(static_cast<int64_t>(s))).relative_bias(t))
                        .output.transpose(0, 1));
    q0 += n;
    k0 += m;
  }
  const auto out = torch::cat(parts, 0);
  out.backward(p.upstream);
  return {out.detach(), q.grad(), k.grad(), v.grad(), t.grad()};
}

}  // namespace packed_visibility_test

using namespace packed_visibility_test;

TEST_CASE("varlen_attention: a block mask, a relative bias and a score_mod per sequence",
          "[varlen][block_mask][relative_bias][score_mod]") {
  torch::manual_seed(12);
  const std::vector<int64_t> t_q{37, 0, 120, 1, 70}, t_k{50, 10, 120, 33, 70};
  const int64_t count = 5, heads = 4, kv_heads = 2, max_q = 120, max_k = 120;
  const auto buckets = F::RelativeBuckets::t5(16, 64, true);
  for (const auto dtype : {torch::kDouble, torch::kFloat}) {
    const auto p = make_packed(t_q, t_k, heads, kv_heads, dtype);
    const auto table = torch::randn({buckets.num_buckets(), heads}, dtype);
    for (int variant = 0; variant < 6; ++variant) {
      // One row per sequence or one for all; one head or one per head; made for the longest
      // sequence or for more.
      const int64_t rows = variant % 2 == 0 ? count : 1, mask_heads = variant % 3 == 0 ? 1 : heads;
      const int64_t extra = variant >= 3 ? 9 : 0, block = variant >= 3 ? 16 : 32;
      const auto mask = BlockMask::from_function(
          [rows, mask_heads](int64_t b, int64_t h, int64_t i, int64_t j) {
            return visible(rows == 1 ? 0 : b, mask_heads == 1 ? 0 : h, i, j);
          },
          rows, mask_heads, max_q + extra, max_k + extra, block);
      Options base;
      base.is_causal(variant != 1)
          .causal_alignment(variant == 4 ? F::CausalAlignment::TopLeft
                                         : F::CausalAlignment::BottomRight)
          .relative_buckets(buckets)
          .block_size(variant % 2 == 0 ? 32 : 64);
      const auto mod = golden::score_mod_of("wavy");
      const auto each = [&](int64_t s) {
        const auto own = BlockMask::from_function(
            [s, rows, mask_heads](int64_t, int64_t h, int64_t i, int64_t j) {
              return visible(rows == 1 ? 0 : s, mask_heads == 1 ? 0 : h, i, j);
            },
            1, mask_heads, t_q[s], t_k[s], block);
        return Options(base)
            .backend(F::Backend::Math)
            .block_mask(own)
            .score_mod(in_sequence(mod, s));
      };
      INFO("dtype " << dtype << ", variant " << variant);
      const auto expected = alone(p, each, table);
      for (const auto backend : {F::Backend::Chunked, F::Backend::Math}) {
        INFO("backend " << static_cast<int>(backend));
        const auto got =
            packed_call(p, Options(base).backend(backend).block_mask(mask).score_mod(mod), table);
        CHECK(F::last_path() ==
              (backend == F::Backend::Math ? F::Path::Math : F::Path::ChunkedFused));
        CHECK(test::max_abs_diff(got, expected) < (dtype == torch::kDouble ? 1e-10 : 2e-4));
      }
    }
  }
}

TEST_CASE("varlen_attention: a block mask that does not fit the sequences is refused by name",
          "[varlen][block_mask][bad_input]") {
  const auto packed = torch::randn({10, 2, 8});
  const auto offsets = torch::tensor({0, 4, 10}, torch::kLong);
  const auto call = [&](const BlockMask& mask) {
    return F::varlen_attention(packed, packed, packed, offsets, offsets,
                               Options().block_mask(mask));
  };
  CHECK_THROWS_C10(call(BlockMask::causal(5, 6)), c10::ValueError,
                   "attention::functional::varlen_attention: expected a block_mask made for at "
                   "least the longest sequence's 6 queries and 6 keys (each sequence reads its "
                   "top-left corner), got one made for 5 and 6");
  const auto everything = [](int64_t, int64_t, int64_t, int64_t) { return true; };
  CHECK_THROWS_C10(call(BlockMask::from_function(everything, 3, 1, 6, 6)), c10::ValueError,
                   "attention::functional::varlen_attention: expected a block_mask of batch 1 or "
                   "S = 2 (one row per sequence) and heads 1 or H = 2, got batch 3 and heads 1");
  CHECK_THROWS_C10(call(BlockMask::from_function(everything, 2, 3, 6, 6)), c10::ValueError,
                   "got batch 2 and heads 3");
  // One made for exactly the longest sequence, or for more, is taken.
  CHECK(torch::equal(call(BlockMask::causal(6, 6)), call(BlockMask::causal(100, 100))));
}
