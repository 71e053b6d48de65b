#pragma once

/// \file
/// Attention of packed queries against keys and values kept in the pages of a cache.

#include <attention/export.h>
#include <attention/functional.h>

#include <torch/types.h>

namespace attention {
namespace functional {

/// Attention of packed queries against keys and values in the pages of a cache (FlashAttention's
/// `flash_attn_with_kvcache` with a `block_table`; vLLM's PagedAttention): `query` (total_q, H, d)
/// holds the new tokens of every sequence, those of sequence s in rows [cu_seqlens_q[s],
/// cu_seqlens_q[s + 1]); its keys are positions [0, key_lengths[s]), key j in slot j % P of page
/// page_table[s][j / P] of `key_pages` (num_pages, Hkv, P, d), its values the same of
/// `value_pages` (num_pages, Hkv, P, d_v). Returns (total_q, H, d_v): for each sequence what
/// scaled_dot_product_attention() gives for its queries (H, Tq_s, d) against its keys alone (the
/// queries are the last Tq_s of its positions, as with a KV cache, unless causal_alignment is
/// TopLeft). A PagedKVCache's PagedBatch holds the offsets, lengths and table of a step, its
/// keys() and values() the pages.
///
/// On the CPU in float, double and bfloat16, Backend::Auto and Chunked read the keys and values
/// through the table where they lie (no gathered copy), every sequence in one parallel pass, some
/// prefilling a chunk of queries and others decoding one. When there are fewer (sequence,
/// key/value head) pieces of work than threads, each one's keys are split across threads and the
/// parts merged through their log-sum-exp, so that one sequence's decoding step uses every core.
/// Backend::Math and Native, and other devices, gather each sequence's keys and compute as
/// varlen_attention does (Math is the reference).
///
/// cu_seqlens_q: as varlen_attention's. key_lengths: 1-D int32 or int64 of S entries, each in
/// [0, max_pages x P]. page_table: 2-D int32 or int64 (S, max_pages). Both on the CPU or on the
/// queries' device. The entries of every page that holds a key some query of its sequence sees
/// must lie in [0, num_pages); others (pages a sliding window let go, or past the sequence's
/// length) may hold anything, -1 by convention. The options hold per sequence as in
/// varlen_attention (is_causal with its alignment, window, ALiBi, soft-capping, sinks, GQA,
/// scale, and a block_mask, relative_bias and score_mod as varlen_attention takes them, all read
/// in place); attn_mask, need_weights and dropout are refused, and so are gradients: the pages
/// hold none (call it under torch::NoGradGuard).
///
/// Throws c10::ValueError for shapes, offsets, lengths, page entries and option values,
/// c10::TypeError for dtypes, c10::Error for devices and for a call that records gradients; every
/// message names this function, what it expected and what it got.
///
/// Thread safety: as scaled_dot_product_attention(); the pages are only read, so calls may read a
/// PagedKVCache's layer while another thread writes a different layer (docs/THREADS.md).
///
/// Example:
/// \code
/// namespace F = attention::functional;
/// torch::NoGradGuard no_grad;
/// // Two sequences in pages of 4 tokens: 6 keys in pages 2 and 0, and 3 keys in page 1; the
/// // first decodes one token, the second prefills its three.
/// torch::Tensor pages = torch::randn({3, 2, 4, 16});  // (num_pages, Hkv, P, d)
/// torch::Tensor q = torch::randn({4, 4, 16});         // (total_q, H, d)
/// torch::Tensor out = F::paged_attention(q, pages, pages, torch::tensor({0, 1, 4}),
///                                        torch::tensor({6, 3}),
///                                        torch::tensor({2, 0, 1, -1}).view({2, 2}),
///                                        F::ScaledDotProductAttentionOptions().is_causal(true));
/// // out: (4, 4, 16)
/// \endcode
ATTENTION_API torch::Tensor paged_attention(
    const torch::Tensor& query, const torch::Tensor& key_pages, const torch::Tensor& value_pages,
    const torch::Tensor& cu_seqlens_q, const torch::Tensor& key_lengths,
    const torch::Tensor& page_table, const ScaledDotProductAttentionOptions& options = {});

/// paged_attention() over 8-bit pages (a PagedKVCache of dtype torch::kChar): `key_pages` and
/// `value_pages` hold int8 codes, `key_scales` and `value_scales`, float (num_pages, Hkv, P), the
/// scale of each row, and a key is its codes times its scale. On the CPU with float or bfloat16
/// queries, Backend::Auto and Chunked read the codes in place and widen them in registers (a
/// quarter of float's bytes per key, plus 4 for the scale); other backends, dtypes and devices
/// compute on the keys the codes stand for. The same checks as paged_attention(), and
/// c10::TypeError for pages that are not both Char or scales not Float, c10::ValueError for
/// scales missing or of another shape.
///
/// Thread safety: as the overload above.
///
/// Example:
/// \code
/// namespace F = attention::functional;
/// torch::NoGradGuard no_grad;
/// attention::PagedKVCache cache(
///     attention::PagedKVCacheOptions(64, 16, 2, 32).dtype(torch::kChar));
/// int64_t a = cache.add_sequence();
/// attention::PagedBatch step = cache.extend({a}, {5});
/// cache.write(0, step, torch::randn({5, 2, 32}), torch::randn({5, 2, 32}));  // quantized here
/// torch::Tensor out = F::paged_attention(
///     torch::randn({5, 4, 32}), cache.keys(0), cache.key_scales(0), cache.values(0),
///     cache.value_scales(0), step.query_starts(), step.key_lengths(), step.page_table(),
///     F::ScaledDotProductAttentionOptions().is_causal(true));  // (5, 4, 32)
/// \endcode
ATTENTION_API torch::Tensor paged_attention(
    const torch::Tensor& query, const torch::Tensor& key_pages, const torch::Tensor& key_scales,
    const torch::Tensor& value_pages, const torch::Tensor& value_scales,
    const torch::Tensor& cu_seqlens_q, const torch::Tensor& key_lengths,
    const torch::Tensor& page_table, const ScaledDotProductAttentionOptions& options = {});

}  // namespace functional
}  // namespace attention
