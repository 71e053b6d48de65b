#include <attention/heatmap.h>

#include "helpers.h"

#include <torch/torch.h>

#include <regex>

TEST_CASE("heatmap: one cell per value, carrying the value, labels escaped", "[heatmap]") {
  auto w = torch::tensor({0.25f, 0.75f, 1.0f, 0.0f, 0.5f, 0.125f}).view({2, 3});
  const auto svg = attention::heatmap_svg(w, {"q<0>", "q&1"}, {"a", "b", "c"}, "t \"1\"");
  CHECK_THAT(svg, test::starts_with("<?xml version=\"1.0\""));
  CHECK_THAT(svg, test::ends_with("</svg>\n"));
  CHECK_THAT(svg, test::contains(">q&lt;0&gt;</text>"));
  CHECK_THAT(svg, test::contains(">q&amp;1</text>"));
  CHECK_THAT(svg, test::contains(">t &quot;1&quot;</text>"));
  std::regex cell("data-row=\"(\\d+)\" data-column=\"(\\d+)\" data-value=\"([^\"]+)\"");
  int cells = 0;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), cell); it != std::sregex_iterator();
       ++it, ++cells) {
    const auto r = std::stoi((*it)[1]), c = std::stoi((*it)[2]);
    CHECK(std::stod((*it)[3]) == test::Approx(w[r][c].item<double>()));
  }
  CHECK(cells == 6);
  CHECK_THAT(svg, test::contains(">0.7500</text>"));
}

TEST_CASE("heatmap: labels must match the tensor", "[heatmap][errors]") {
  CHECK_THROWS_C10(attention::heatmap_svg(torch::rand({2, 3}), {"a"}, {"a", "b", "c"}),
                   c10::ValueError, "expected weights (1, 3) matching the labels, got (2, 3)");
  CHECK_THROWS_C10(attention::heatmap_svg(torch::rand({3}), {"a"}, {"a"}), c10::ValueError,
                   "got (3,)");
}
