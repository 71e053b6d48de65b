#pragma once

// Per-sequence options of the paged tests (test_paged_attention.cpp,
// test_shared_prefix_attention.cpp): a tree of draft tokens per sequence, as a block mask, and a
// score modification that depends on the head and the sequence.

#include <attention/block_mask.h>
#include <attention/score_mod.h>

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace test {

/// Whether query i of a sequence of `queries` queries and `keys` keys sees key j, where the last
/// `queries` keys are draft tokens on a tree: every query sees the keys before the drafts and the
/// drafts on its own branch (those whose index shares i's parity and is no later).
inline bool sees_in_draft_tree(int64_t queries, int64_t keys, int64_t i, int64_t j) {
  const int64_t draft = j - (keys - queries);
  return draft < 0 || (draft <= i && (i - draft) % 2 == 0);
}

/// The trees of a packed step as one block mask: batch s is sequence s (t_q[s] queries, t_k[s]
/// keys), blocks of `block` positions.
inline attention::BlockMask draft_tree_mask(const std::vector<int64_t>& t_q,
                                            const std::vector<int64_t>& t_k, int64_t block) {
  const int64_t count = static_cast<int64_t>(t_q.size());
  const int64_t most_q = *std::max_element(t_q.begin(), t_q.end());
  const int64_t most_k = *std::max_element(t_k.begin(), t_k.end());
  return attention::BlockMask::from_function(
      [t_q, t_k](int64_t s, int64_t, int64_t i, int64_t j) {
        return sees_in_draft_tree(t_q[s], t_k[s], i, j);
      },
      count, 1, most_q, most_k, block);
}

/// Scores times 1 + 0.1 head + 0.2 sequence, the sequence being the tile's batch, or `fixed`
/// where it is >= 0 (a sequence computed alone).
inline attention::ScoreMod scaled_by_head_and_sequence(int64_t fixed) {
  return attention::ScoreMod([fixed](const torch::Tensor& x, const attention::ScoreTile& t) {
    return x.mul(1 + 0.1 * static_cast<double>(t.head) +
                 0.2 * static_cast<double>(fixed >= 0 ? fixed : t.batch));
  });
}

}  // namespace test
