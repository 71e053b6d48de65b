#include <attention/heatmap.h>

#include "checks.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace attention {
namespace {

constexpr int kCell = 56, kLeft = 110, kTop = 110, kBar = 16;

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// White at 0, a deep blue at 1.
std::string colour(double t) {
  t = std::clamp(std::isfinite(t) ? t : 0.0, 0.0, 1.0);
  const auto mix = [t](int from, int to) {
    return static_cast<int>(std::lround(from + (to - from) * t));
  };
  return fmt::format("#{:02x}{:02x}{:02x}", mix(255, 8), mix(255, 48), mix(255, 107));
}

}  // namespace

std::string heatmap_svg(const torch::Tensor& weights, const std::vector<std::string>& row_labels,
                        const std::vector<std::string>& column_labels, const std::string& title) {
  TORCH_CHECK_VALUE(weights.defined() && weights.dim() == 2 &&
                        weights.size(0) == static_cast<int64_t>(row_labels.size()) &&
                        weights.size(1) == static_cast<int64_t>(column_labels.size()),
                    "attention::heatmap_svg: expected weights (", row_labels.size(), ", ",
                    column_labels.size(), ") matching the labels, got ",
                    weights.defined() ? detail::shape_str(weights.sizes()) : "undefined");
  TORCH_CHECK_TYPE(!weights.is_complex(), "attention::heatmap_svg: expected real weights, got ",
                   weights.scalar_type());
  TORCH_CHECK(
      !weights.is_meta(),
      "attention::heatmap_svg: expected weights with data, got a tensor on the meta device");
  const auto values = weights.detach().to(torch::kCPU, torch::kDouble).contiguous();
  const double* v = values.data_ptr<double>();
  const int64_t rows = values.size(0), cols = values.size(1);
  double lo = 0, hi = 0;
  if (values.numel() > 0) {
    lo = values.min().item<double>();
    hi = values.max().item<double>();
  }
  const double span = hi > lo ? hi - lo : 1.0;
  const int width = kLeft + static_cast<int>(cols) * kCell + 3 * kBar + 60;
  const int height = kTop + static_cast<int>(rows) * kCell + 20;

  std::string svg = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"22\" font-size=\"15\">{3}</text>\n",
      width, height, kLeft, escape(title));
  for (int64_t c = 0; c < cols; ++c) {
    const int x = kLeft + static_cast<int>(c) * kCell + kCell / 2;
    svg += fmt::format("<text x=\"{0}\" y=\"{1}\" transform=\"rotate(-45 {0} {1})\">{2}</text>\n",
                       x, kTop - 8, escape(column_labels[c]));
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int y = kTop + static_cast<int>(r) * kCell;
    svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", kLeft - 8,
                       y + kCell / 2 + 4, escape(row_labels[r]));
    for (int64_t c = 0; c < cols; ++c) {
      const double value = v[r * cols + c];
      const double t = (value - lo) / span;
      const int x = kLeft + static_cast<int>(c) * kCell;
      svg += fmt::format(
          "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" stroke=\"white\" "
          "data-row=\"{}\" data-column=\"{}\" data-value=\"{:.6g}\"/>\n",
          x, y, kCell, kCell, colour(t), r, c, value);
      svg += fmt::format(
          "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"11\" "
          "fill=\"{}\">{:.4f}</text>\n",
          x + kCell / 2, y + kCell / 2 + 4, t > 0.55 ? "white" : "black", value);
    }
  }
  // The colour bar: the scale from the minimum (bottom) to the maximum (top).
  const int bar_x = kLeft + static_cast<int>(cols) * kCell + kBar;
  const int bar_h = std::max(kCell, static_cast<int>(rows) * kCell);
  constexpr int kSteps = 20;
  for (int i = 0; i < kSteps; ++i) {
    svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"/>\n", bar_x,
                       kTop + bar_h * (kSteps - 1 - i) / kSteps, kBar, bar_h / kSteps + 1,
                       colour((i + 0.5) / kSteps));
  }
  svg += fmt::format("<text x=\"{}\" y=\"{}\">{:.4f}</text>\n", bar_x + kBar + 4, kTop + 10, hi);
  svg += fmt::format("<text x=\"{}\" y=\"{}\">{:.4f}</text>\n", bar_x + kBar + 4, kTop + bar_h, lo);
  svg += "</svg>\n";
  return svg;
}

}  // namespace attention
