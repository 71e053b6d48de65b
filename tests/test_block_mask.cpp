// Block masks: each builder's classes and dense mask against the definition written here, element
// by element; composition, broadcasting and FlexAttention's index layout against the classes; a
// causal block mask through Math against the library's is_causal; sizes at their extremes and
// bad input refused by name.

#include <attention/block_mask.h>
#include <attention/functional.h>

#include "helpers.h"

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace block_mask_test {

using attention::BlockMask;
using Block = BlockMask::Block;
using Definition = std::function<bool(int64_t, int64_t, int64_t, int64_t)>;
namespace F = attention::functional;

// The dense mask of a definition, true = hidden: (batch, heads, t_q, t_k).
torch::Tensor hidden_by(const Definition& visible, int64_t batch, int64_t heads, int64_t t_q,
                        int64_t t_k) {
  auto hidden = torch::empty({batch, heads, t_q, t_k}, torch::kBool);
  auto a = hidden.accessor<bool, 4>();
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t q = 0; q < t_q; ++q) {
        for (int64_t kv = 0; kv < t_k; ++kv) a[b][h][q][kv] = !visible(b, h, q, kv);
      }
    }
  }
  return hidden;
}

// The class every block of `mask` must have, from the dense mask: whether the block's elements
// are all visible, all hidden, or both.
void check_classes(const BlockMask& mask, const torch::Tensor& hidden, bool exact) {
  const int64_t n = mask.block_size();
  int64_t wrong = 0, loose = 0;
  for (int64_t b = 0; b < mask.batch(); ++b) {
    for (int64_t h = 0; h < mask.heads(); ++h) {
      for (int64_t qb = 0; qb < mask.q_blocks(); ++qb) {
        for (int64_t kb = 0; kb < mask.kv_blocks(); ++kb) {
          const auto tile = hidden[b][h]
                                .narrow(0, qb * n, std::min(n, mask.t_q() - qb * n))
                                .narrow(1, kb * n, std::min(n, mask.t_k() - kb * n));
          const bool all_hidden = tile.all().item<bool>(), any_hidden = tile.any().item<bool>();
          const Block expected =
              all_hidden ? Block::Empty : (any_hidden ? Block::Partial : Block::Full);
          const Block got = mask.block(b, h, qb, kb);
          // A partial class where the block is whole is sound (its elements are asked); a full or
          // empty class that is not is a wrong answer.
          if (got != expected && got != Block::Partial) ++wrong;
          if (got != expected && got == Block::Partial) ++loose;
        }
      }
    }
  }
  CHECK(wrong == 0);
  if (exact) CHECK(loose == 0);
}

// A mask against its definition: the dense mask, every class, and visible() on every element.
void check_mask(const BlockMask& mask, const Definition& visible, bool exact_classes = true) {
  const auto expected = hidden_by(visible, mask.batch(), mask.heads(), mask.t_q(), mask.t_k());
  CHECK(torch::equal(mask.to_attn_mask(), expected));
  check_classes(mask, expected, exact_classes);
  int64_t disagree = 0;
  for (int64_t q = 0; q < mask.t_q(); ++q) {
    for (int64_t kv = 0; kv < mask.t_k(); ++kv) {
      if (mask.visible(mask.batch() - 1, mask.heads() - 1, q, kv) ==
          expected[mask.batch() - 1][mask.heads() - 1][q][kv].item<bool>()) {
        ++disagree;
      }
    }
  }
  CHECK(disagree == 0);
}

int64_t offset_of(int64_t t_q, int64_t t_k, F::CausalAlignment alignment) {
  return alignment == F::CausalAlignment::BottomRight ? t_k - t_q : 0;
}

}  // namespace block_mask_test

using namespace block_mask_test;

TEST_CASE("BlockMask: each builder equals its definition, and from_function finds the same classes",
          "[block_mask]") {
  for (const int64_t block : {int64_t{1}, int64_t{7}, int64_t{16}, int64_t{64}}) {
    for (const auto& [t_q, t_k] :
         std::vector<std::pair<int64_t, int64_t>>{{50, 50}, {17, 61}, {61, 17}, {1, 40}, {0, 9}}) {
      for (const auto alignment : {F::CausalAlignment::BottomRight, F::CausalAlignment::TopLeft}) {
        INFO("block " << block << ", t_q " << t_q << ", t_k " << t_k << ", top-left "
                      << (alignment == F::CausalAlignment::TopLeft));
        const int64_t offset = offset_of(t_q, t_k, alignment);
        const Definition causal = [offset](int64_t, int64_t, int64_t q, int64_t kv) {
          return kv <= q + offset;
        };
        check_mask(BlockMask::causal(t_q, t_k, block, alignment), causal);
        check_mask(BlockMask::from_function(causal, 1, 1, t_q, t_k, block), causal);
        for (const int64_t window :
             {int64_t{0}, int64_t{5}, int64_t{20}, std::numeric_limits<int64_t>::max()}) {
          INFO("window " << window);
          const Definition windowed = [offset, window](int64_t, int64_t, int64_t q, int64_t kv) {
            return kv <= q + offset && q + offset - kv <= window;
          };
          check_mask(BlockMask::sliding_window(t_q, t_k, window, block, alignment), windowed);
        }
      }
    }
    for (const int64_t prefix :
         {int64_t{0}, int64_t{1}, int64_t{23}, int64_t{50}, std::numeric_limits<int64_t>::max()}) {
      INFO("block " << block << ", prefix " << prefix);
      check_mask(
          BlockMask::prefix_lm(50, prefix, block),
          [prefix](int64_t, int64_t, int64_t q, int64_t kv) { return kv < prefix || kv <= q; });
    }
  }
}

TEST_CASE("BlockMask: documents, in one row or per batch row, alone and with causal",
          "[block_mask]") {
  // Packed documents of 13, 30, 1 and 26 tokens; a second row with its own boundaries; a third
  // whose ids interleave (blocks whose id ranges meet without a shared id stay partial: sound).
  const std::vector<std::vector<int64_t>> rows = {
      [] {
        std::vector<int64_t> ids;
        for (const auto& [id, n] :
             std::vector<std::pair<int64_t, int64_t>>{{0, 13}, {1, 30}, {2, 1}, {3, 26}}) {
          ids.insert(ids.end(), static_cast<size_t>(n), id);
        }
        return ids;
      }(),
      std::vector<int64_t>(70, 5),
      [] {
        std::vector<int64_t> ids(70);
        for (int64_t t = 0; t < 70; ++t) ids[static_cast<size_t>(t)] = (t / 3) % 4;
        return ids;
      }()};
  std::vector<torch::Tensor> tensors;
  for (const auto& row : rows) tensors.push_back(torch::tensor(row));
  const auto ids = torch::stack(tensors);
  const auto same = [ids](int64_t b, int64_t, int64_t q, int64_t kv) {
    return ids[b][q].item<int64_t>() == ids[b][kv].item<int64_t>();
  };
  for (const int64_t block : {int64_t{1}, int64_t{8}, int64_t{16}}) {
    INFO("block " << block);
    // Nondecreasing ids (rows 0 and 1): every class exact.
    check_mask(BlockMask::document(ids.narrow(0, 0, 2), block), same);
    check_mask(BlockMask::document(ids, block), same, /*exact_classes=*/false);
    const auto both = BlockMask::document(ids, block) & BlockMask::causal(70, 70, block);
    CHECK(both.batch() == 3);
    check_mask(
        both,
        [same](int64_t b, int64_t h, int64_t q, int64_t kv) {
          return same(b, h, q, kv) && kv <= q;
        },
        false);
    // One row, (T,): broadcast over the batch.
    const auto one = BlockMask::document(ids[0], block);
    CHECK(one.batch() == 1);
    check_mask(one,
               [same](int64_t, int64_t h, int64_t q, int64_t kv) { return same(0, h, q, kv); });
  }
}

TEST_CASE("BlockMask: composition broadcasts over batch and heads", "[block_mask]") {
  // A window that depends on the head (2, 5, 9) and a mask per batch row.
  const Definition by_head = [](int64_t, int64_t h, int64_t q, int64_t kv) {
    const int64_t window = std::vector<int64_t>{2, 5, 9}[h];
    return q - kv <= window && kv - q <= window;
  };
  const Definition by_row = [](int64_t b, int64_t, int64_t q, int64_t kv) {
    return (q + kv + b) % 3 != 0 || q == kv;
  };
  const auto heads = BlockMask::from_function(by_head, 1, 3, 40, 40, 8);
  const auto batch = BlockMask::from_function(by_row, 2, 1, 40, 40, 8);
  const auto causal = BlockMask::causal(40, 40, 8);
  const auto both = heads & batch;
  CHECK(both.batch() == 2);
  CHECK(both.heads() == 3);
  // A block partial in a part may be whole in the combination: it stays partial (sound).
  check_mask(
      both,
      [&](int64_t b, int64_t h, int64_t q, int64_t kv) {
        return by_head(b, h, q, kv) && by_row(b, h, q, kv);
      },
      false);
  check_mask(
      heads | causal,
      [&](int64_t b, int64_t h, int64_t q, int64_t kv) { return by_head(b, h, q, kv) || kv <= q; },
      false);
  check_mask((heads | causal) & batch,
             [&](int64_t b, int64_t h, int64_t q, int64_t kv) {
               return (by_head(b, h, q, kv) || kv <= q) && by_row(b, h, q, kv);
             },
             false);
  // Composition keeps the classes its parts know: a causal block past the diagonal stays empty
  // whatever the other mask holds there, a block full in both stays full.
  const auto with_all =
      causal & BlockMask::from_function([](int64_t, int64_t, int64_t, int64_t) { return true; }, 1,
                                        1, 40, 40, 8);
  for (int64_t qb = 0; qb < 5; ++qb) {
    for (int64_t kb = 0; kb < 5; ++kb)
      CHECK(with_all.block(0, 0, qb, kb) == causal.block(0, 0, qb, kb));
  }
}

namespace block_mask_test {

// Row `row` of an index layout (counts (1, 1, rows), indices (1, 1, rows, cols)) lists, first
// and in order, the blocks of class `which` along that row: query blocks' key blocks, or
// (by_key_block) key blocks' query blocks. Returns how many it lists.
int64_t check_layout_row(const BlockMask& mask, const torch::Tensor& counts,
                         const torch::Tensor& indices, int64_t row, Block which,
                         bool by_key_block) {
  std::vector<int64_t> expected;
  const int64_t cols = by_key_block ? mask.q_blocks() : mask.kv_blocks();
  for (int64_t c = 0; c < cols; ++c) {
    const Block got = by_key_block ? mask.block(0, 0, c, row) : mask.block(0, 0, row, c);
    if (got == which) expected.push_back(c);
  }
  CHECK(counts[0][0][row].item<int64_t>() == static_cast<int64_t>(expected.size()));
  for (size_t i = 0; i < expected.size(); ++i) {
    CHECK(indices[0][0][row][static_cast<int64_t>(i)].item<int64_t>() == expected[i]);
  }
  return static_cast<int64_t>(expected.size());
}

}  // namespace block_mask_test

TEST_CASE("BlockMask: FlexAttention's index layout lists each row's partial and full blocks",
          "[block_mask]") {
  const auto mask = BlockMask::sliding_window(100, 100, 30, 16) | BlockMask::prefix_lm(100, 10, 16);
  CHECK(mask.kv_num_blocks().sizes() == torch::IntArrayRef({1, 1, 7}));
  CHECK(mask.kv_indices().sizes() == torch::IntArrayRef({1, 1, 7, 7}));
  CHECK(mask.kv_indices().scalar_type() == torch::kInt);
  int64_t listed = 0, listed_by_key = 0;
  for (int64_t r = 0; r < 7; ++r) {
    listed +=
        check_layout_row(mask, mask.kv_num_blocks(), mask.kv_indices(), r, Block::Partial, false);
    listed += check_layout_row(mask, mask.full_kv_num_blocks(), mask.full_kv_indices(), r,
                               Block::Full, false);
    // The transposed view: each key block's query blocks.
    listed_by_key +=
        check_layout_row(mask, mask.q_num_blocks(), mask.q_indices(), r, Block::Partial, true);
    listed_by_key += check_layout_row(mask, mask.full_q_num_blocks(), mask.full_q_indices(), r,
                                      Block::Full, true);
  }
  CHECK(listed == mask.count(Block::Partial) + mask.count(Block::Full));
  CHECK(listed_by_key == listed);
  CHECK(mask.count(Block::Empty) + listed == 49);
  CHECK(mask.count(Block::Empty) > 0);  // the case has every class
  CHECK(mask.count(Block::Partial) > 0);
  CHECK(mask.count(Block::Full) > 0);
}

TEST_CASE("BlockMask: a causal block mask through Math gives is_causal's attention",
          "[block_mask]") {
  torch::manual_seed(3);
  for (const auto& [t_q, t_k] : std::vector<std::pair<int64_t, int64_t>>{{33, 33}, {9, 40}}) {
    const auto q = torch::randn({2, 4, t_q, 8}, torch::kDouble);
    const auto k = torch::randn({2, 4, t_k, 8}, torch::kDouble);
    const auto v = torch::randn({2, 4, t_k, 8}, torch::kDouble);
    const auto math = F::ScaledDotProductAttentionOptions().backend(F::Backend::Math);
    const auto expected =
        F::scaled_dot_product_attention(
            q, k, v, F::ScaledDotProductAttentionOptions(math).is_causal(true).window_left(6))
            .output;
    const auto mask = BlockMask::sliding_window(t_q, t_k, 6, 16);
    const auto got =
        F::scaled_dot_product_attention(
            q, k, v, F::ScaledDotProductAttentionOptions(math).attn_mask(mask.to_attn_mask()))
            .output;
    CHECK(test::max_abs_diff(got, expected) < 1e-12);
  }
}

TEST_CASE("BlockMask: sizes at their extremes", "[block_mask]") {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  // No queries or keys: no blocks.
  const auto none = BlockMask::causal(0, 0);
  CHECK(none.q_blocks() == 0);
  CHECK(none.to_attn_mask().sizes() == torch::IntArrayRef({1, 1, 0, 0}));
  // One block covers everything however long the block is.
  const auto one = BlockMask::causal(5, 5, kMax);
  CHECK(one.q_blocks() == 1);
  CHECK(one.block(0, 0, 0, 0) == Block::Partial);
  CHECK(BlockMask::causal(1, 1, 1).block(0, 0, 0, 0) == Block::Full);
  // Positions near the int64 limit classify without overflow (one block each way): a whole
  // block is kept in one byte; a partial one's pairs would not fit, refused by name.
  const auto far = BlockMask::prefix_lm(kMax, kMax, kMax);
  CHECK(far.q_blocks() == 1);
  CHECK(far.block(0, 0, 0, 0) == Block::Full);
  CHECK(far.visible(0, 0, 0, kMax - 1));
  CHECK(BlockMask::causal(kMax, 1, kMax, F::CausalAlignment::TopLeft).block(0, 0, 0, 0) ==
        Block::Full);
  CHECK_THROWS_C10(BlockMask::causal(kMax, kMax, kMax), c10::ValueError,
                   "BlockMask::causal: the 1 partial blocks of 9223372036854775807 x "
                   "9223372036854775807 pairs do not fit: expected at most 2^34 pairs in partial "
                   "blocks");
  CHECK_THROWS_C10(BlockMask::sliding_window(kMax, kMax, 3, kMax), c10::ValueError,
                   "do not fit: expected at most 2^34 pairs in partial blocks");
  // 2^31 positions in blocks of 1 would be 2^62 blocks: refused by name, before any memory.
  CHECK_THROWS_C10(BlockMask::causal(int64_t{1} << 31, int64_t{1} << 31, 1), c10::ValueError,
                   "BlockMask::causal: a mask of 1 x 1 x 2147483648 x 2147483648 blocks of 1 "
                   "does not fit: expected at most 2^32 blocks");
  CHECK_THROWS_C10(BlockMask::causal(kMax, kMax, 1), c10::ValueError,
                   "does not fit: expected at most 2^32 blocks");
  // One block of 2^31 x 2^31 positions is within the block limits, but a mask function would be
  // asked up to 2^62 times: refused before the first call.
  int64_t calls = 0;
  const auto counting = [&calls](int64_t, int64_t, int64_t, int64_t) {
    ++calls;
    return true;
  };
  const int64_t k2to31 = int64_t{1} << 31;
  CHECK_THROWS_C10(BlockMask::from_function(counting, 1, 1, k2to31, k2to31, k2to31),
                   c10::ValueError,
                   "BlockMask::from_function: a mask of 1 x 1 x 2147483648 x 2147483648 (batch x "
                   "heads x queries x keys) may take that many calls of the mask function: "
                   "expected at most 2^36");
  CHECK_THROWS_C10(BlockMask::from_function(counting, kMax, kMax, 1, 1), c10::ValueError,
                   "a mask of 9223372036854775807 x 9223372036854775807 x 1 x 1");
  CHECK(calls == 0);
  // Document ids of more blocks than a mask may have are refused before they are copied (an
  // expanded tensor of 2^40 ids would take 8 TiB).
  CHECK_THROWS_C10(BlockMask::document(torch::zeros({1}, torch::kLong).expand({int64_t{1} << 40})),
                   c10::ValueError,
                   "BlockMask::document: a mask of 1 x 1 x 8589934592 x 8589934592 blocks of 128 "
                   "does not fit: expected at most 2^32 blocks");
  // A mask moved from stays the mask it was.
  auto moved_from = BlockMask::causal(300, 300, 64);
  const BlockMask moved_to = std::move(moved_from);
  CHECK(moved_from.count(Block::Partial) == moved_to.count(Block::Partial));
  CHECK(torch::equal(moved_from.to_attn_mask(), moved_to.to_attn_mask()));
  BlockMask assigned = BlockMask::causal(1, 1);
  assigned = std::move(moved_from);
  CHECK(torch::equal(moved_from.to_attn_mask(), assigned.to_attn_mask()));
}

TEST_CASE("BlockMask: bad input is refused by name", "[block_mask][bad_input]") {
  const auto all = [](int64_t, int64_t, int64_t, int64_t) { return true; };
  CHECK_THROWS_C10(BlockMask::from_function(all, 0, 1, 4, 4), c10::ValueError,
                   "BlockMask::from_function: expected batch >= 1 (1 broadcasts), got 0");
  CHECK_THROWS_C10(BlockMask::from_function(all, 1, -2, 4, 4), c10::ValueError,
                   "BlockMask::from_function: expected heads >= 1 (1 broadcasts), got -2");
  CHECK_THROWS_C10(BlockMask::from_function(all, 1, 1, -1, 4), c10::ValueError,
                   "BlockMask::from_function: expected t_q >= 0, got -1");
  CHECK_THROWS_C10(BlockMask::from_function(all, 1, 1, 4, std::numeric_limits<int64_t>::min()),
                   c10::ValueError,
                   "BlockMask::from_function: expected t_k >= 0, got -9223372036854775808");
  CHECK_THROWS_C10(BlockMask::causal(4, 4, 0), c10::ValueError,
                   "BlockMask::causal: expected block_size >= 1, got 0");
  CHECK_THROWS_C10(BlockMask::from_function(nullptr, 1, 1, 4, 4), c10::ValueError,
                   "BlockMask::from_function: expected a mask function, got none");
  CHECK_THROWS_C10(BlockMask::sliding_window(4, 4, -1), c10::ValueError,
                   "BlockMask::sliding_window: expected window_left >= 0, got -1");
  CHECK_THROWS_C10(BlockMask::prefix_lm(4, -3), c10::ValueError,
                   "BlockMask::prefix_lm: expected prefix >= 0, got -3");
  CHECK_THROWS_C10(BlockMask::document(torch::rand({4})), c10::TypeError,
                   "BlockMask::document: expected integer document_ids, got Float");
  CHECK_THROWS_C10(BlockMask::document(torch::zeros({2, 2, 2}, torch::kLong)), c10::ValueError,
                   "BlockMask::document: expected document_ids of shape (T,) or (B, T), got "
                   "[2, 2, 2]");
  CHECK_THROWS_C10(BlockMask::document(torch::zeros({0, 5}, torch::kLong)), c10::ValueError,
                   "BlockMask::document: expected document_ids with at least one row, got [0, 5]");
  // Composition of masks made for other sizes, another block or other heads.
  CHECK_THROWS_C10(BlockMask::causal(4, 4) & BlockMask::causal(4, 5), c10::ValueError,
                   "BlockMask::operator&: expected masks of the same t_q, t_k and block_size, got "
                   "(4, 4, 128) and (4, 5, 128)");
  CHECK_THROWS_C10(BlockMask::causal(4, 4, 2) | BlockMask::causal(4, 4, 4), c10::ValueError,
                   "BlockMask::operator|: expected masks of the same t_q, t_k and block_size, got "
                   "(4, 4, 2) and (4, 4, 4)");
  CHECK_THROWS_C10(
      BlockMask::from_function(all, 1, 2, 4, 4) & BlockMask::from_function(all, 1, 3, 4, 4),
      c10::ValueError,
      "BlockMask::operator&: expected the same heads or 1 (broadcast), got 2 and 3");
  CHECK_THROWS_C10(
      BlockMask::from_function(all, 2, 1, 4, 4) & BlockMask::from_function(all, 3, 1, 4, 4),
      c10::ValueError,
      "BlockMask::operator&: expected the same batch or 1 (broadcast), got 2 and 3");
  // Reading outside the mask.
  const auto mask = BlockMask::causal(10, 10, 4);
  CHECK_THROWS_C10(mask.block(0, 0, 3, 0), c10::ValueError,
                   "BlockMask::block: expected a query block in [0, 3) and a key block in [0, 3), "
                   "got 3 and 0");
  CHECK_THROWS_C10(mask.visible(0, 0, 0, 10), c10::ValueError,
                   "BlockMask::visible: expected a query in [0, 10) and a key in [0, 10), got 0 "
                   "and 10");
  CHECK_THROWS_C10(mask.visible(-1, 0, 0, 0), c10::ValueError,
                   "BlockMask::visible: expected b >= 0 and h >= 0, got b=-1, h=0");
  // A mask function that throws: the error names the first block (in block order) where it did,
  // its query and key, and what the function said.
  const auto throws_late = [](int64_t, int64_t h, int64_t q, int64_t kv) -> bool {
    if (h == 1 && q >= 5 && kv == 2) throw std::runtime_error("no rule for this pair");
    return true;
  };
  CHECK_THROWS_C10(BlockMask::from_function(throws_late, 1, 2, 8, 8, 4), c10::Error,
                   "BlockMask::from_function: the mask function threw at block (b=0, h=1, query "
                   "block 1, key block 0), query 5, key 2: no rule for this pair");
  // Whatever it throws (here an int, not a std::exception) leaves as a c10::Error: while the
  // blocks are classified, and while a partial block's pairs are asked (a causal function seen
  // to be partial at its first query, before it reaches query 3, key 3).
  const auto throws_int = [](int64_t, int64_t, int64_t, int64_t) -> bool { throw 42; };
  CHECK_THROWS_C10(BlockMask::from_function(throws_int, 1, 2, 8, 8, 4), c10::Error,
                   "BlockMask::from_function: the mask function threw at block (b=0, h=0, query "
                   "block 0, key block 0), query 0, key 0: an exception of a type not derived "
                   "from std::exception");
  const auto throws_int_late = [](int64_t, int64_t, int64_t q, int64_t kv) -> bool {
    if (q == 3 && kv == 3) throw 42;
    return kv <= q;
  };
  CHECK_THROWS_C10(BlockMask::from_function(throws_int_late, 1, 1, 8, 8, 4), c10::Error,
                   "BlockMask::from_function: the mask function threw at block (b=0, h=0, query "
                   "block 0, key block 0), query 3, key 3: an exception of a type not derived "
                   "from std::exception");
}
