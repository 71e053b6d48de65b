#include <attention/format.h>

#include <ATen/ATen.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace attention {
namespace {

// PyTorch prints a floating tensor whose values are all whole numbers as "1.", else with a
// fixed number of decimals, every element padded to the width of the widest.
std::vector<std::string> format_elements(const at::Tensor& flat, int precision) {
  std::vector<std::string> out;
  out.reserve(flat.numel());
  if (!flat.is_floating_point()) {
    auto values = flat.to(at::kLong);
    for (int64_t i = 0; i < values.numel(); ++i) {
      out.push_back(std::to_string(values[i].item<int64_t>()));
    }
    return out;
  }
  auto values = flat.to(at::kDouble).contiguous();
  const double* v = values.data_ptr<double>();
  const int64_t n = values.numel();
  const bool whole =
      std::all_of(v, v + n, [](double x) { return !std::isfinite(x) || std::nearbyint(x) == x; });
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(v[i])) {
      out.emplace_back("nan");
    } else if (std::isinf(v[i])) {
      out.emplace_back(v[i] > 0 ? "inf" : "-inf");
    } else if (whole) {
      out.push_back(fmt::format("{:.0f}.", v[i]));
    } else {
      out.push_back(fmt::format("{:.{}f}", v[i], precision));
    }
  }
  return out;
}

void append(std::string& s, const std::vector<std::string>& items, size_t width,
            c10::IntArrayRef sizes, size_t dim, size_t& index, size_t indent) {
  if (dim == sizes.size()) {
    s += fmt::format("{:>{}}", items[index++], width);
    return;
  }
  s += '[';
  for (int64_t i = 0; i < sizes[dim]; ++i) {
    if (i > 0) {
      s += ',';
      if (dim + 1 == sizes.size()) {
        s += ' ';
      } else {
        s.append(sizes.size() - dim - 1, '\n');
        s.append(indent + dim + 1, ' ');
      }
    }
    append(s, items, width, sizes, dim + 1, index, indent);
  }
  s += ']';
}

}  // namespace

std::string format_tensor(const at::Tensor& tensor, int precision) {
  TORCH_CHECK_VALUE(precision >= 0 && precision <= 17,
                    "attention::format_tensor: expected a precision in [0, 17], got ", precision);
  if (!tensor.defined()) return "[ Tensor (undefined) ]";
  TORCH_CHECK_TYPE(!tensor.is_complex(), "attention::format_tensor: expected a real tensor, got ",
                   tensor.scalar_type());
  TORCH_CHECK(!tensor.is_meta(),
              "attention::format_tensor: expected a tensor with data, got one on the meta device");
  at::Tensor t = tensor.detach().cpu();
  auto items = format_elements(t.reshape({-1}), precision);
  size_t width = 0;
  for (const auto& item : items) width = std::max(width, item.size());
  std::string s = "tensor(";
  size_t index = 0;
  if (t.dim() == 0) {
    s += items[0];
  } else if (t.numel() == 0) {
    s += "[]";
  } else {
    append(s, items, width, t.sizes(), 0, index, /*indent=*/7);
  }
  if (t.scalar_type() == at::kDouble) s += ", dtype=torch.float64";
  s += ')';
  return s;
}

std::string format_shape(const at::Tensor& tensor) {
  TORCH_CHECK_VALUE(tensor.defined(), "attention::format_shape: expected a defined tensor");
  return fmt::format("torch.Size([{}])", fmt::join(tensor.sizes(), ", "));
}

}  // namespace attention
