#pragma once

// Attention over keys and values kept in the pages of a cache (functional::paged_attention):
// the validated problem, and the fused CPU kernel that reads the pages in place.

#include "kernels/problem.h"

#include <torch/types.h>

#include <cstdint>

namespace attention {
namespace kernels {

/// The problem of paged attention: query (total_q, H, d), key_pages (num_pages, Hkv, P, d),
/// value_pages (num_pages, Hkv, P, dv), cu_seqlens_q (S + 1 offsets, as read_offsets), key_lengths
/// (S,) and page_table (S, max_pages), both int32 or int64 on the CPU or the queries' device.
/// Described as a packed problem (make_varlen_problem's) whose key offsets are the running sum of
/// key_lengths: the keys of every sequence gathered one after another, (total_k, Hkv, d), would be
/// its packed keys. Checks that key_lengths[s] <= max_pages x P and that every page holding a key
/// some query of sequence s sees is in [0, num_pages) (others, such as pages a sliding window let
/// go, may hold anything). Refuses attn_mask, need_weights, dropout and gradients by name. Pages
/// of dtype Char (8-bit, with float, double or bfloat16 queries) need key_scales and value_scales,
/// float (num_pages, Hkv, page_size) on the pages' device; other pages take none.
Problem make_paged_problem(const torch::Tensor& query, const torch::Tensor& key_pages,
                           const torch::Tensor& value_pages, const torch::Tensor& cu_seqlens_q,
                           const torch::Tensor& key_lengths, const torch::Tensor& page_table,
                           const functional::ScaledDotProductAttentionOptions& options,
                           const char* caller, const torch::Tensor& key_scales = {},
                           const torch::Tensor& value_scales = {});

/// The page table of a problem made by make_paged_problem, (S, max_pages) int64 on the CPU,
/// contiguous: what make_paged_problem read and checked.
torch::Tensor paged_table(const torch::Tensor& page_table);

/// The most query rows (query heads of a key/value head x queries) of one work item of
/// paged_forward() for a decoding step (a prompt chunk's items hold more, for the matrix
/// products): each key and value is read once for all of them. A sequence whose query heads x
/// queries per key/value head exceed it is a prompt chunk.
constexpr int64_t kPagedItemRows = 16;

/// Whether paged_forward() takes these queries: on the CPU, float, double or bfloat16.
bool paged_forward_applies(const torch::Tensor& query);

/// The forward of a paged problem on the CPU, reading keys and values where they lie in their
/// pages. Work items are (sequence, key/value head, block of query rows, part of the keys); when
/// there are fewer (sequence, key/value head, block) items than threads, each one's keys are split
/// into parts computed on different threads and merged through their running maximum and sum
/// (their log-sum-exp). `num_splits` 0 decides by the threads and the work; n > 0 asks for n parts
/// (at most one per 16 keys of the longest item), for tests. Returns (total_q, H, dv) in the
/// queries' dtype.
///
/// 8-bit pages (int8, with float queries or bfloat16 ones) come with their rows' scales,
/// key_scales (num_pages, Hkv, P) and value_scales alike, float: a key is its codes times its
/// scale. Undefined for pages of the queries' dtype.
///
/// Sequences whose tables begin with the same pages (find_shared_prefixes) meet those pages in
/// items of their own, each holding rows of several sequences, merged with each sequence's own
/// keys through the log-sum-exp (cascade attention); `share_prefixes` false reads every
/// sequence's pages on their own (to compare).
torch::Tensor paged_forward(const Problem& p, const torch::Tensor& query,
                            const torch::Tensor& key_pages, const torch::Tensor& value_pages,
                            const torch::Tensor& table, int64_t num_splits = 0,
                            const torch::Tensor& key_scales = {},
                            const torch::Tensor& value_scales = {}, bool share_prefixes = true);

/// How many parts the calling thread's last paged_forward() split each item's keys into (1: no
/// split; 0: no call yet). For tests and diagnostics.
int64_t paged_forward_last_parts();

/// How many tiles of keys the calling thread's last paged_forward() met in matrix products: the
/// route of items whose rows (query heads of a key/value head x queries) are a multiple of 16, on
/// the tiles all of an item's rows see whole. For tests and diagnostics.
int64_t paged_forward_last_matrix_tiles();

/// Whether paged_attention() stacks shared prefixes (paged_forward's `share_prefixes`): yes,
/// unless ATTENTION_CPU_SHARED_PREFIXES=off, read once per process (to compare).
bool paged_shares_prefixes();

/// Whether paged_forward() meets 8-bit keys with float or bfloat16 queries of d features (values
/// of dv) in integer products, each query row coded in 16 bits after the softmax scale
/// (kernels/cpu/query_codes.h): where the processor's vector products run (not
/// ATTENTION_CPU_VECTOR=portable), a register of 16-bit codes divides d, and not
/// ATTENTION_CPU_INT8=widened. For tests, which then make their references of the coded queries.
bool paged_codes_int8_queries(int64_t d, int64_t dv);

/// Whether paged_forward() weighs 8-bit values on integer products for float or bfloat16 queries
/// (values of dv features), each row's weights over a run of keys coded in 16 bits
/// (cpu::DecodeProducts::values_coded): as paged_codes_int8_queries, where a register of 16-bit
/// codes divides dv.
bool paged_codes_int8_weights(int64_t d, int64_t dv);

/// How many rows the calling thread's last paged_forward() stacked into shared prefixes' items
/// (0: none shared). For tests and diagnostics.
int64_t paged_forward_last_shared_rows();

}  // namespace kernels
}  // namespace attention
