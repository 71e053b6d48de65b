// Block masks (attention/block_mask.h): a class per block, kept in one byte, and the pairs of the
// partial blocks, a byte each, so that a kernel reading the mask never calls the function. The
// builders classify a block from its first and last query and key, in O(blocks), and ask the
// function only about the pairs of partial blocks; from_function() asks it about every pair.

#include <attention/block_mask.h>

#include "functional/enum_checks.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace attention {
namespace {

using Block = BlockMask::Block;
using functional::CausalAlignment;

// The most blocks a mask holds (one byte each).
constexpr int64_t kMaxBlocks = int64_t{1} << 32;
// The most calls from_function may make of a mask function: about a minute of a cheap one.
constexpr int64_t kMaxFunctionCalls = int64_t{1} << 36;
// The most pairs its partial blocks hold (one byte each): 16 GiB.
constexpr int64_t kMaxPairs = int64_t{1} << 34;

// ceil(n / block) without overflow.
int64_t blocks_of(int64_t n, int64_t block) {
  return n / block + (n % block != 0 ? 1 : 0);
}

// What the causal builders call a query's position: i + t_k - t_q (bottom-right) or i.
int64_t position_offset(int64_t t_q, int64_t t_k, CausalAlignment alignment) {
  return alignment == CausalAlignment::BottomRight ? t_k - t_q : 0;
}

// Where block `index` of the (batch, heads, q_blocks, kv_blocks) order lies.
struct Place {
  int64_t b, h, qb, kb;
};

Place place_of(int64_t index, int64_t heads, int64_t q_blocks, int64_t kv_blocks) {
  const int64_t row = index / kv_blocks, head_row = row / q_blocks;
  return {head_row / heads, head_row % heads, row % q_blocks, index % kv_blocks};
}

// What a mask function's failure at query q and key kv of a block is reported as.
// What a message says of an exception that does not derive from std::exception (`throw 42`):
// whatever the mask function throws leaves the library as a c10::Error, never as itself (from a
// thread of a parallel region, an exception of its own type could end the process).
constexpr const char* kNotStandard = "an exception of a type not derived from std::exception";

std::string function_threw(const char* caller, const Place& at, int64_t q, int64_t kv,
                           const char* what) {
  std::ostringstream message;
  message << caller << ": the mask function threw at block (b=" << at.b << ", h=" << at.h
          << ", query block " << at.qb << ", key block " << at.kb << "), query " << q << ", key "
          << kv << ": " << what;
  return message.str();
}

Block class_of(bool any_visible, bool any_hidden) {
  if (!any_hidden) return Block::Full;
  return any_visible ? Block::Partial : Block::Empty;
}

// The first failure of the mask function among the blocks evaluated in parallel: the one of the
// lowest block index, so that the error does not depend on the threads.
struct FirstFailure {
  std::mutex mutex;
  int64_t index = std::numeric_limits<int64_t>::max();
  std::string message;
  void record(int64_t at, std::string what) {
    std::lock_guard<std::mutex> lock(mutex);
    if (at < index) {
      index = at;
      message = std::move(what);
    }
  }
};

}  // namespace

BlockMask::BlockMask(MaskFunction visible, int64_t batch, int64_t heads, int64_t t_q, int64_t t_k,
                     int64_t block_size, const char* caller)
    : visible_(std::move(visible)),
      batch_(batch),
      heads_(heads),
      t_q_(t_q),
      t_k_(t_k),
      block_size_(block_size) {
  TORCH_CHECK_VALUE(batch >= 1, caller, ": expected batch >= 1 (1 broadcasts), got ", batch);
  TORCH_CHECK_VALUE(heads >= 1, caller, ": expected heads >= 1 (1 broadcasts), got ", heads);
  TORCH_CHECK_VALUE(t_q >= 0, caller, ": expected t_q >= 0, got ", t_q);
  TORCH_CHECK_VALUE(t_k >= 0, caller, ": expected t_k >= 0, got ", t_k);
  TORCH_CHECK_VALUE(block_size >= 1, caller, ": expected block_size >= 1, got ", block_size);
  TORCH_CHECK_VALUE(static_cast<bool>(visible_), caller, ": expected a mask function, got none");
  q_blocks_ = blocks_of(t_q, block_size);
  kv_blocks_ = blocks_of(t_k, block_size);
  // batch x heads x q_blocks x kv_blocks, refused before it can overflow.
  int64_t total = 1;
  bool fits = true;
  for (const int64_t n : {batch, heads, q_blocks_, kv_blocks_}) {
    if (n != 0 && total > kMaxBlocks / n) fits = false;
    total = fits ? total * n : total;
  }
  TORCH_CHECK_VALUE(fits, caller, ": a mask of ", batch, " x ", heads, " x ", q_blocks_, " x ",
                    kv_blocks_, " blocks of ", block_size,
                    " does not fit: expected at most 2^32 blocks (batch x heads x query blocks x "
                    "key blocks; a larger block_size makes fewer)");
  pair_rows_ = std::min(block_size, t_q);
  pair_cols_ = std::min(block_size, t_k);
  storage_ = std::make_shared<Storage>();
  storage_->blocks.assign(static_cast<size_t>(total), static_cast<uint8_t>(Block::Empty));
}

uint8_t& BlockMask::at(int64_t b, int64_t h, int64_t q_block, int64_t kv_block) {
  return storage_->blocks[static_cast<size_t>(
      ((b * heads_ + h) * q_blocks_ + q_block) * kv_blocks_ + kv_block)];
}

uint8_t BlockMask::at(int64_t b, int64_t h, int64_t q_block, int64_t kv_block) const {
  return storage_->blocks[static_cast<size_t>(
      ((b * heads_ + h) * q_blocks_ + q_block) * kv_blocks_ + kv_block)];
}

void BlockMask::keep_partial_pairs(const PairSource& source, const char* caller) {
  std::vector<uint8_t>& blocks = storage_->blocks;
  std::vector<int64_t> partial;
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i] == static_cast<uint8_t>(Block::Partial)) {
      partial.push_back(static_cast<int64_t>(i));
    }
  }
  // Each side of a block's pairs is at most the block and its sequence; their product and the
  // total are refused before they can overflow.
  int64_t per_block = 0, total = 0;
  const bool fits =
      partial.empty() ||
      (!__builtin_mul_overflow(pair_rows_, pair_cols_, &per_block) &&
       !__builtin_mul_overflow(per_block, static_cast<int64_t>(partial.size()), &total) &&
       total <= kMaxPairs);
  TORCH_CHECK_VALUE(fits, caller, ": the ", partial.size(), " partial blocks of ", pair_rows_,
                    " x ", pair_cols_,
                    " pairs do not fit: expected at most 2^34 pairs in partial blocks (a smaller "
                    "block_size makes fewer)");
  std::vector<uint8_t> pairs(static_cast<size_t>(total), 0);
  FirstFailure failure;
  const int64_t count = static_cast<int64_t>(partial.size());
  at::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      const int64_t index = partial[static_cast<size_t>(k)];
      const Place at = place_of(index, heads_, q_blocks_, kv_blocks_);
      try {
        source(at.b, at.h, at.qb, at.kb, pairs.data() + k * per_block);
      } catch (const std::exception& e) {
        failure.record(index, e.what());
      } catch (...) {
        failure.record(index, std::string(caller) + ": " + kNotStandard);
      }
    }
  });
  TORCH_CHECK(failure.message.empty(), failure.message);
  // Exact classes: a partial guess whose pairs are all visible is full, all hidden empty. The
  // pairs of the blocks that stay partial move up, in order.
  std::vector<int64_t> kept;
  int64_t written = 0;
  for (int64_t k = 0; k < count; ++k) {
    const int64_t index = partial[static_cast<size_t>(k)];
    const Place at = place_of(index, heads_, q_blocks_, kv_blocks_);
    const int64_t rows = std::min(t_q_ - at.qb * block_size_, pair_rows_);
    const int64_t cols = std::min(t_k_ - at.kb * block_size_, pair_cols_);
    const uint8_t* own = pairs.data() + k * per_block;
    int64_t seen = 0;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) seen += own[r * pair_cols_ + c];
    }
    if (seen == 0 || seen == rows * cols) {
      blocks[static_cast<size_t>(index)] =
          static_cast<uint8_t>(seen == 0 ? Block::Empty : Block::Full);
      continue;
    }
    if (written != k * per_block) {
      std::copy(own, own + per_block, pairs.data() + written);
    }
    written += per_block;
    kept.push_back(index);
  }
  pairs.resize(static_cast<size_t>(written));
  pairs.shrink_to_fit();
  storage_->partial = std::move(kept);
  storage_->pairs = std::move(pairs);
}

BlockMask::PairSource BlockMask::function_pairs(const char* caller) const {
  const MaskFunction visible = visible_;
  const int64_t block = block_size_, t_q = t_q_, t_k = t_k_, ld = pair_cols_;
  return [visible, block, t_q, t_k, ld, caller](int64_t b, int64_t h, int64_t qb, int64_t kb,
                                                uint8_t* pairs) {
    const int64_t q0 = qb * block, q1 = std::min(t_q, q0 + block);
    const int64_t k0 = kb * block, k1 = std::min(t_k, k0 + block);
    int64_t q = q0, kv = k0;
    try {
      for (q = q0; q < q1; ++q) {
        for (kv = k0; kv < k1; ++kv) pairs[(q - q0) * ld + (kv - k0)] = visible(b, h, q, kv);
      }
    } catch (const std::exception& e) {
      throw std::runtime_error(function_threw(caller, {b, h, qb, kb}, q, kv, e.what()));
    } catch (...) {
      throw std::runtime_error(function_threw(caller, {b, h, qb, kb}, q, kv, kNotStandard));
    }
  };
}

const uint8_t* BlockMask::partial_pairs(int64_t b, int64_t h, int64_t q_block,
                                        int64_t kv_block) const {
  const int64_t index =
      (((b % batch_) * heads_ + h % heads_) * q_blocks_ + q_block) * kv_blocks_ + kv_block;
  const auto& partial = storage_->partial;
  const auto found = std::lower_bound(partial.begin(), partial.end(), index);
  if (found == partial.end() || *found != index) return nullptr;
  return storage_->pairs.data() + (found - partial.begin()) * pair_rows_ * pair_cols_;
}

void BlockMask::classify_blocks(
    const std::function<Block(int64_t, int64_t, int64_t, int64_t)>& classify) {
  for (int64_t qb = 0; qb < q_blocks_; ++qb) {
    const int64_t q0 = qb * block_size_, q1 = std::min(t_q_, q0 + block_size_);
    for (int64_t kb = 0; kb < kv_blocks_; ++kb) {
      const int64_t k0 = kb * block_size_, k1 = std::min(t_k_, k0 + block_size_);
      at(0, 0, qb, kb) = static_cast<uint8_t>(classify(q0, q1, k0, k1));
    }
  }
}

BlockMask BlockMask::from_function(MaskFunction visible, int64_t batch, int64_t heads, int64_t t_q,
                                   int64_t t_k, int64_t block_size) {
  constexpr const char* kName = "BlockMask::from_function";
  // Up to a call per query and key of every (b, h): bounded before any is made, so that sizes
  // the block limits allow cannot ask for a call count no one can wait for.
  if (batch >= 1 && heads >= 1 && t_q >= 0 && t_k >= 0) {
    int64_t calls = 1;
    bool fits = true;
    for (const int64_t factor : {batch, heads, t_q, t_k}) {
      fits = fits && !__builtin_mul_overflow(calls, factor, &calls);
    }
    TORCH_CHECK_VALUE(fits && calls <= kMaxFunctionCalls, kName, ": a mask of ", batch, " x ",
                      heads, " x ", t_q, " x ", t_k,
                      " (batch x heads x queries x keys) may take that many calls of the mask "
                      "function: expected at most 2^36 (causal, sliding_window, document and "
                      "prefix_lm make larger masks without calls)");
  }
  BlockMask mask(std::move(visible), batch, heads, t_q, t_k, block_size, kName);
  const int64_t total = static_cast<int64_t>(mask.storage_->blocks.size());
  FirstFailure failure;
  at::parallel_for(0, total, 1, [&](int64_t begin, int64_t end) {
    for (int64_t index = begin; index < end; ++index) {
      const Place at = place_of(index, heads, mask.q_blocks_, mask.kv_blocks_);
      const int64_t q0 = at.qb * block_size, q1 = std::min(t_q, q0 + block_size);
      const int64_t k0 = at.kb * block_size, k1 = std::min(t_k, k0 + block_size);
      bool any_visible = false, any_hidden = false;
      int64_t q = q0, kv = k0;
      try {
        for (q = q0; q < q1 && !(any_visible && any_hidden); ++q) {
          for (kv = k0; kv < k1; ++kv) {
            (mask.visible_(at.b, at.h, q, kv) ? any_visible : any_hidden) = true;
            if (any_visible && any_hidden) break;
          }
        }
      } catch (const std::exception& e) {
        failure.record(index, function_threw(kName, at, q, kv, e.what()));
        continue;
      } catch (...) {
        failure.record(index, function_threw(kName, at, q, kv, kNotStandard));
        continue;
      }
      mask.storage_->blocks[static_cast<size_t>(index)] =
          static_cast<uint8_t>(class_of(any_visible, any_hidden));
    }
  });
  TORCH_CHECK(failure.message.empty(), failure.message);
  mask.keep_partial_pairs(mask.function_pairs(kName), kName);
  return mask;
}

BlockMask BlockMask::causal(int64_t t_q, int64_t t_k, int64_t block_size,
                            CausalAlignment alignment) {
  detail::check_alignment(alignment, "BlockMask::causal");
  const int64_t offset = position_offset(t_q, t_k, alignment);
  BlockMask mask([offset](int64_t, int64_t, int64_t q, int64_t kv) { return kv <= q + offset; }, 1,
                 1, t_q, t_k, block_size, "BlockMask::causal");
  mask.classify_blocks([offset](int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
    // Its first query sees its last key: full; its last query does not see its first: empty.
    return class_of(k0 <= q1 - 1 + offset, k1 - 1 > q0 + offset);
  });
  mask.keep_partial_pairs(mask.function_pairs("BlockMask::causal"), "BlockMask::causal");
  return mask;
}

BlockMask BlockMask::sliding_window(int64_t t_q, int64_t t_k, int64_t window_left,
                                    int64_t block_size, CausalAlignment alignment) {
  constexpr const char* kName = "BlockMask::sliding_window";
  TORCH_CHECK_VALUE(window_left >= 0, kName, ": expected window_left >= 0, got ", window_left);
  detail::check_alignment(alignment, kName);
  const int64_t offset = position_offset(t_q, t_k, alignment);
  // pos - kv is at most t_q + |offset|: no overflow against any window.
  BlockMask mask(
      [offset, window_left](int64_t, int64_t, int64_t q, int64_t kv) {
        const int64_t pos = q + offset;
        return kv <= pos && pos - kv <= window_left;
      },
      1, 1, t_q, t_k, block_size, kName);
  mask.classify_blocks([offset, window_left](int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
    const int64_t first = q0 + offset, last = q1 - 1 + offset;
    // Some query sees some key: the last query reaches the first key and the first query's
    // window reaches the last key. Every query sees every key: the first query sees the last key
    // and the last query's window reaches back to the first key.
    const bool any = k0 <= last && first - (k1 - 1) <= window_left;
    const bool all = k1 - 1 <= first && last - k0 <= window_left;
    return class_of(any, !all);
  });
  mask.keep_partial_pairs(mask.function_pairs(kName), kName);
  return mask;
}

BlockMask BlockMask::document(const torch::Tensor& document_ids, int64_t block_size) {
  constexpr const char* kName = "BlockMask::document";
  TORCH_CHECK_VALUE(document_ids.defined(), kName,
                    ": expected document_ids, got an undefined tensor");
  TORCH_CHECK_VALUE(document_ids.dim() == 1 || document_ids.dim() == 2, kName,
                    ": expected document_ids of shape (T,) or (B, T), got ", document_ids.sizes());
  TORCH_CHECK_TYPE(!document_ids.is_floating_point() && !document_ids.is_complex() &&
                       document_ids.scalar_type() != at::kBool,
                   kName, ": expected integer document_ids, got ", document_ids.scalar_type());
  const auto ids2d = document_ids.dim() == 1 ? document_ids.unsqueeze(0) : document_ids;
  const int64_t batch = ids2d.size(0), t = ids2d.size(1);
  TORCH_CHECK_VALUE(batch >= 1, kName, ": expected document_ids with at least one row, got ",
                    document_ids.sizes());
  // The mask's sizes are checked (its blocks counted) before the ids are copied: ids of more
  // blocks than a mask may have are refused without a copy of them.
  auto ids = std::make_shared<std::vector<int64_t>>();
  BlockMask mask(
      [ids, t](int64_t b, int64_t, int64_t q, int64_t kv) {
        return (*ids)[static_cast<size_t>(b * t + q)] == (*ids)[static_cast<size_t>(b * t + kv)];
      },
      batch, 1, t, t, block_size, kName);
  const auto host = ids2d.to(torch::kCPU, torch::kLong).contiguous();
  ids->assign(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
  // Each block's smallest and largest id: blocks whose ranges do not meet share no document
  // (empty); a block of one id on both sides is full; the others are partial (also when the
  // ranges meet without a shared id: the function decides there).
  const int64_t blocks = mask.q_blocks_;
  std::vector<int64_t> low(static_cast<size_t>(blocks)), high(static_cast<size_t>(blocks));
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t* row = ids->data() + b * t;
    for (int64_t k = 0; k < blocks; ++k) {
      const int64_t* first = row + k * block_size;
      const int64_t* last = row + std::min(t, (k + 1) * block_size);
      low[k] = *std::min_element(first, last);
      high[k] = *std::max_element(first, last);
    }
    for (int64_t qb = 0; qb < blocks; ++qb) {
      for (int64_t kb = 0; kb < blocks; ++kb) {
        const bool apart = high[qb] < low[kb] || high[kb] < low[qb];
        const bool one = low[qb] == high[qb] && low[kb] == high[kb] && low[qb] == low[kb];
        mask.at(b, 0, qb, kb) =
            static_cast<uint8_t>(one ? Block::Full : (apart ? Block::Empty : Block::Partial));
      }
    }
  }
  mask.keep_partial_pairs(mask.function_pairs(kName), kName);
  return mask;
}

BlockMask BlockMask::prefix_lm(int64_t t, int64_t prefix, int64_t block_size) {
  constexpr const char* kName = "BlockMask::prefix_lm";
  TORCH_CHECK_VALUE(prefix >= 0, kName, ": expected prefix >= 0, got ", prefix);
  BlockMask mask(
      [prefix](int64_t, int64_t, int64_t q, int64_t kv) { return kv < prefix || kv <= q; }, 1, 1, t,
      t, block_size, kName);
  mask.classify_blocks([prefix](int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
    const bool any = k0 < prefix || k0 <= q1 - 1;
    const bool all = k1 - 1 < prefix || k1 - 1 <= q0;
    return class_of(any, !all);
  });
  mask.keep_partial_pairs(mask.function_pairs(kName), kName);
  return mask;
}

BlockMask BlockMask::combined(const BlockMask& other, bool both, const char* caller) const {
  TORCH_CHECK_VALUE(t_q_ == other.t_q_ && t_k_ == other.t_k_ && block_size_ == other.block_size_,
                    caller, ": expected masks of the same t_q, t_k and block_size, got (", t_q_,
                    ", ", t_k_, ", ", block_size_, ") and (", other.t_q_, ", ", other.t_k_, ", ",
                    other.block_size_, ")");
  TORCH_CHECK_VALUE(batch_ == other.batch_ || batch_ == 1 || other.batch_ == 1, caller,
                    ": expected the same batch or 1 (broadcast), got ", batch_, " and ",
                    other.batch_);
  TORCH_CHECK_VALUE(heads_ == other.heads_ || heads_ == 1 || other.heads_ == 1, caller,
                    ": expected the same heads or 1 (broadcast), got ", heads_, " and ",
                    other.heads_);
  const MaskFunction a = visible_, b = other.visible_;
  const int64_t a_batch = batch_, a_heads = heads_, b_batch = other.batch_, b_heads = other.heads_;
  MaskFunction function;
  if (both) {
    function = [a, b, a_batch, a_heads, b_batch, b_heads](int64_t n, int64_t h, int64_t q,
                                                          int64_t kv) {
      return a(n % a_batch, h % a_heads, q, kv) && b(n % b_batch, h % b_heads, q, kv);
    };
  } else {
    function = [a, b, a_batch, a_heads, b_batch, b_heads](int64_t n, int64_t h, int64_t q,
                                                          int64_t kv) {
      return a(n % a_batch, h % a_heads, q, kv) || b(n % b_batch, h % b_heads, q, kv);
    };
  }
  BlockMask result(std::move(function), std::max(batch_, other.batch_),
                   std::max(heads_, other.heads_), t_q_, t_k_, block_size_, caller);
  for (int64_t n = 0; n < result.batch_; ++n) {
    for (int64_t h = 0; h < result.heads_; ++h) {
      for (int64_t qb = 0; qb < q_blocks_; ++qb) {
        for (int64_t kb = 0; kb < kv_blocks_; ++kb) {
          const auto x = static_cast<Block>(at(n % batch_, h % heads_, qb, kb));
          const auto y = static_cast<Block>(other.at(n % other.batch_, h % other.heads_, qb, kb));
          Block z;
          if (both) {
            z = (x == Block::Empty || y == Block::Empty)
                    ? Block::Empty
                    : (x == Block::Full && y == Block::Full ? Block::Full : Block::Partial);
          } else {
            z = (x == Block::Full || y == Block::Full)
                    ? Block::Full
                    : (x == Block::Empty && y == Block::Empty ? Block::Empty : Block::Partial);
          }
          result.at(n, h, qb, kb) = static_cast<uint8_t>(z);
        }
      }
    }
  }
  // A partial block's pairs from the parts' pairs (a whole part's block all 1 or all 0).
  const int64_t rows = pair_rows_, cols = pair_cols_;
  const auto pairs_of = [rows, cols](const BlockMask& part, int64_t n, int64_t h, int64_t qb,
                                     int64_t kb, uint8_t* out) {
    const auto which = static_cast<Block>(part.at(n % part.batch_, h % part.heads_, qb, kb));
    if (which == Block::Partial) {
      const uint8_t* own = part.partial_pairs(n, h, qb, kb);
      std::copy(own, own + rows * cols, out);
    } else {
      std::fill(out, out + rows * cols, which == Block::Full ? 1 : 0);
    }
  };
  result.keep_partial_pairs(
      [&](int64_t n, int64_t h, int64_t qb, int64_t kb, uint8_t* pairs) {
        std::vector<uint8_t> theirs(static_cast<size_t>(rows * cols));
        pairs_of(*this, n, h, qb, kb, pairs);
        pairs_of(other, n, h, qb, kb, theirs.data());
        for (int64_t e = 0; e < rows * cols; ++e) {
          pairs[e] = both ? (pairs[e] & theirs[e]) : (pairs[e] | theirs[e]);
        }
      },
      caller);
  return result;
}

BlockMask BlockMask::operator&(const BlockMask& other) const {
  return combined(other, true, "BlockMask::operator&");
}

BlockMask BlockMask::operator|(const BlockMask& other) const {
  return combined(other, false, "BlockMask::operator|");
}

BlockMask::Block BlockMask::block(int64_t b, int64_t h, int64_t q_block, int64_t kv_block) const {
  constexpr const char* kName = "BlockMask::block";
  TORCH_CHECK_VALUE(b >= 0 && h >= 0, kName, ": expected b >= 0 and h >= 0, got b=", b, ", h=", h);
  TORCH_CHECK_VALUE(q_block >= 0 && q_block < q_blocks_ && kv_block >= 0 && kv_block < kv_blocks_,
                    kName, ": expected a query block in [0, ", q_blocks_,
                    ") and a key block in [0, ", kv_blocks_, "), got ", q_block, " and ", kv_block);
  return static_cast<Block>(at(b % batch_, h % heads_, q_block, kv_block));
}

bool BlockMask::visible(int64_t b, int64_t h, int64_t q, int64_t kv) const {
  constexpr const char* kName = "BlockMask::visible";
  TORCH_CHECK_VALUE(b >= 0 && h >= 0, kName, ": expected b >= 0 and h >= 0, got b=", b, ", h=", h);
  TORCH_CHECK_VALUE(q >= 0 && q < t_q_ && kv >= 0 && kv < t_k_, kName, ": expected a query in [0, ",
                    t_q_, ") and a key in [0, ", t_k_, "), got ", q, " and ", kv);
  const int64_t qb = q / block_size_, kb = kv / block_size_;
  const auto which = static_cast<Block>(at(b % batch_, h % heads_, qb, kb));
  if (which != Block::Partial) return which == Block::Full;
  const uint8_t* pairs = partial_pairs(b, h, qb, kb);
  return pairs[(q - qb * block_size_) * pair_cols_ + (kv - kb * block_size_)] != 0;
}

int64_t BlockMask::count(Block which) const {
  const auto& blocks = storage_->blocks;
  return std::count(blocks.begin(), blocks.end(), static_cast<uint8_t>(which));
}

std::pair<torch::Tensor, torch::Tensor> BlockMask::indices_of(Block which,
                                                              bool by_key_block) const {
  // Rows are query blocks (or key blocks, by_key_block), columns the other side's blocks.
  const int64_t rows = by_key_block ? kv_blocks_ : q_blocks_;
  const int64_t cols = by_key_block ? q_blocks_ : kv_blocks_;
  auto counts = torch::zeros({batch_, heads_, rows}, torch::kInt);
  auto indices = torch::zeros({batch_, heads_, rows, cols}, torch::kInt);
  int32_t* n = counts.data_ptr<int32_t>();
  int32_t* index = indices.data_ptr<int32_t>();
  for (int64_t b = 0; b < batch_; ++b) {
    for (int64_t h = 0; h < heads_; ++h) {
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t row = (b * heads_ + h) * rows + r;
        int32_t found = 0;
        for (int64_t c = 0; c < cols; ++c) {
          const uint8_t got = by_key_block ? at(b, h, c, r) : at(b, h, r, c);
          if (got == static_cast<uint8_t>(which)) {
            index[row * cols + found++] = static_cast<int32_t>(c);
          }
        }
        n[row] = found;
      }
    }
  }
  return {counts, indices};
}

torch::Tensor BlockMask::kv_num_blocks() const {
  return indices_of(Block::Partial, false).first;
}

torch::Tensor BlockMask::kv_indices() const {
  return indices_of(Block::Partial, false).second;
}

torch::Tensor BlockMask::full_kv_num_blocks() const {
  return indices_of(Block::Full, false).first;
}

torch::Tensor BlockMask::full_kv_indices() const {
  return indices_of(Block::Full, false).second;
}

torch::Tensor BlockMask::q_num_blocks() const {
  return indices_of(Block::Partial, true).first;
}

torch::Tensor BlockMask::q_indices() const {
  return indices_of(Block::Partial, true).second;
}

torch::Tensor BlockMask::full_q_num_blocks() const {
  return indices_of(Block::Full, true).first;
}

torch::Tensor BlockMask::full_q_indices() const {
  return indices_of(Block::Full, true).second;
}

torch::Tensor BlockMask::to_attn_mask() const {
  auto hidden = torch::empty({batch_, heads_, t_q_, t_k_}, torch::kBool);
  bool* out = hidden.data_ptr<bool>();
  at::parallel_for(0, batch_ * heads_ * q_blocks_, 1, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t qb = row % q_blocks_, h = row / q_blocks_ % heads_,
                    b = row / q_blocks_ / heads_;
      const int64_t q0 = qb * block_size_, q1 = std::min(t_q_, q0 + block_size_);
      for (int64_t kb = 0; kb < kv_blocks_; ++kb) {
        const auto which = static_cast<Block>(at(b, h, qb, kb));
        const uint8_t* pairs = which == Block::Partial ? partial_pairs(b, h, qb, kb) : nullptr;
        const int64_t k0 = kb * block_size_, k1 = std::min(t_k_, k0 + block_size_);
        for (int64_t q = q0; q < q1; ++q) {
          bool* line = out + ((b * heads_ + h) * t_q_ + q) * t_k_;
          const uint8_t* row = pairs ? pairs + (q - q0) * pair_cols_ - k0 : nullptr;
          for (int64_t kv = k0; kv < k1; ++kv) {
            line[kv] = row ? row[kv] == 0 : which == Block::Empty;
          }
        }
      }
    }
  });
  return hidden;
}

std::ostream& operator<<(std::ostream& out, const BlockMask& mask) {
  using B = BlockMask::Block;
  return out << "BlockMask(batch=" << mask.batch() << ", heads=" << mask.heads()
             << ", t_q=" << mask.t_q() << ", t_k=" << mask.t_k()
             << ", block_size=" << mask.block_size() << ": " << mask.count(B::Full) << " full, "
             << mask.count(B::Partial) << " partial, " << mask.count(B::Empty) << " empty blocks)";
}

}  // namespace attention
