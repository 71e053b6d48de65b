#pragma once

/// \file
/// Where queries sit among the keys when there are fewer of them: what places the causal
/// diagonal, a sliding window and ALiBi's distances (functional.h, block_mask.h).

namespace attention {
namespace functional {

/// Where the causal diagonal (and a sliding window, and ALiBi's distances) sit when Tq != Tk.
enum class CausalAlignment {
  /// The queries are the last Tq of the Tk positions: query i is at position i + Tk - Tq, as when
  /// new tokens attend to a KV cache (flash-attn's convention, and this library's default).
  BottomRight,
  /// Query i is at position i: PyTorch's `F.scaled_dot_product_attention(is_causal=True)` and
  /// `torch.tril(torch.ones(Tq, Tk))`.
  TopLeft,
};

}  // namespace functional
}  // namespace attention
