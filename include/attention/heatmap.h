#pragma once

/// \file
/// Attention maps as pictures: a small SVG writer for 2-D weight tensors.

#include <attention/export.h>
#include <torch/types.h>

#include <string>
#include <vector>

namespace attention {

/// Renders a 2-D tensor (rows x columns, e.g. the attention weights of one head: queries x keys)
/// as a labelled SVG heatmap: one cell per value, coloured on a white-to-blue scale from the
/// tensor's minimum to its maximum, the value written in each cell (4 decimals), row labels on
/// the left, column labels on top, a colour bar with the scale's ends, and `title` above.
///
/// Each cell is a `<rect>` with a `data-value` attribute holding the value, for tools that read
/// the picture back. Labels are XML-escaped.
///
/// Throws c10::ValueError unless `weights` is 2-D with as many rows as `row_labels` and as many
/// columns as `column_labels`, c10::TypeError for complex weights, c10::Error for weights without
/// data (meta).
///
/// Thread safety: keeps no state; any number of calls may run at once.
///
/// Example:
/// \code
/// attention::MultiHeadAttention mha(
///     attention::MultiHeadAttentionOptions(/*d_in=*/16, /*d_out=*/16, /*num_heads=*/2));
/// auto out = mha(torch::randn({1, 3, 16}), attention::MultiHeadAttentionForwardOptions()
///                                              .need_weights(true)
///                                              .average_attn_weights(false));
/// std::vector<std::string> tokens = {"Your", "journey", "starts"};
/// std::string svg = attention::heatmap_svg(out.weights[0][0], tokens, tokens, "head 0");
/// std::ofstream("head0.svg") << svg;
/// \endcode
ATTENTION_API std::string heatmap_svg(const torch::Tensor& weights,
                                      const std::vector<std::string>& row_labels,
                                      const std::vector<std::string>& column_labels,
                                      const std::string& title = "");

}  // namespace attention
