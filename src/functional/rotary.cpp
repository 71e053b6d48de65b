// Rotary position embeddings: frequencies (with Llama 3.1's scaling), their cos and sin tables in
// float64, and the rotation of feature pairs. The tables are computed in float64 and rounded once,
// so positions far into a long context keep their angle to within the dtype's rounding.

#include <attention/rotary.h>

#include "checks.h"
#include "functional/rotary_cache.h"

#include <torch/torch.h>

#include <cmath>

namespace attention {
namespace functional {
namespace {

constexpr const char* kApply = "attention::functional::apply_rotary";
constexpr const char* kFrequencies = "attention::functional::rotary_frequencies";
constexpr const char* kTables = "attention::functional::rotary_tables";
constexpr double kPi = 3.14159265358979323846;

// theta > 1: at theta = 1 every frequency is 1 (no position is told apart beyond 2 pi), below
// 1 the frequencies grow with the feature index instead of falling.
void check_theta(double theta, const char* caller) {
  TORCH_CHECK_VALUE(std::isfinite(theta) && theta > 1.0, caller,
                    ": expected a finite rotary theta > 1, got ", theta);
}

// factor >= 1: the scaling lowers the low frequencies (a longer context), never raises them.
void check_scaling(const Llama3RopeScaling& s, const char* caller) {
  TORCH_CHECK_VALUE(std::isfinite(s.factor()) && s.factor() >= 1.0, caller,
                    ": expected a finite llama3_scaling factor >= 1, got ", s.factor());
  TORCH_CHECK_VALUE(std::isfinite(s.low_freq_factor()) && std::isfinite(s.high_freq_factor()) &&
                        s.low_freq_factor() > 0.0 && s.high_freq_factor() > s.low_freq_factor(),
                    caller,
                    ": expected llama3_scaling with 0 < low_freq_factor < high_freq_factor, got ",
                    s.low_freq_factor(), " and ", s.high_freq_factor());
  TORCH_CHECK_VALUE(s.original_context_length() > 0, caller,
                    ": expected llama3_scaling original_context_length > 0, got ",
                    s.original_context_length());
}

// YaRN: beta_fast above beta_slow > 0 (turns within the original context), an attention factor
// that scales and does not flip.
void check_yarn(const YarnRopeScaling& s, const char* caller) {
  TORCH_CHECK_VALUE(std::isfinite(s.factor()) && s.factor() >= 1.0, caller,
                    ": expected a finite yarn_scaling factor >= 1, got ", s.factor());
  TORCH_CHECK_VALUE(s.original_context_length() > 0, caller,
                    ": expected yarn_scaling original_context_length > 0, got ",
                    s.original_context_length());
  TORCH_CHECK_VALUE(std::isfinite(s.beta_fast()) && std::isfinite(s.beta_slow()) &&
                        s.beta_slow() > 0.0 && s.beta_fast() > s.beta_slow(),
                    caller, ": expected yarn_scaling with 0 < beta_slow < beta_fast, got ",
                    s.beta_slow(), " and ", s.beta_fast());
  TORCH_CHECK_VALUE(!s.attention_factor() ||
                        (std::isfinite(*s.attention_factor()) && *s.attention_factor() > 0.0),
                    caller, ": expected a finite yarn_scaling attention_factor > 0, got ",
                    s.attention_factor().value_or(0.0));
}

// What every caller checks of the options besides rotary_dim: theta, the rotated pairs of a
// rotary_dim, the scalings.
void check_common(const RotaryOptions& options, const char* caller) {
  check_theta(options.theta(), caller);
  TORCH_CHECK_VALUE(
      options.rotated_pairs() >= 0 && options.rotated_pairs() <= options.rotary_dim() / 2, caller,
      ": expected rotated_pairs in [0, ", options.rotary_dim() / 2,
      "] (rotary_dim / 2; 0 for all), got ", options.rotated_pairs());
  TORCH_CHECK_VALUE(!(options.llama3_scaling() && options.yarn_scaling()), caller,
                    ": expected at most one of llama3_scaling and yarn_scaling, got both");
  if (options.llama3_scaling()) check_scaling(*options.llama3_scaling(), caller);
  if (options.yarn_scaling()) check_yarn(*options.yarn_scaling(), caller);
}

// The options of the tables, rotary_dim resolved: what rotary_frequencies and rotary_tables
// check before they compute.
void check_resolved(const RotaryOptions& options, const char* caller) {
  TORCH_CHECK_VALUE(options.rotary_dim() > 0 && options.rotary_dim() % 2 == 0, caller,
                    ": expected an even rotary_dim > 0, got ", options.rotary_dim());
  check_common(options, caller);
}

// YaRN's attention factor, 1 without yarn_scaling.
double attention_factor(const RotaryOptions& options) {
  if (!options.yarn_scaling()) return 1.0;
  const auto& s = *options.yarn_scaling();
  return s.attention_factor().value_or(0.1 * std::log(s.factor()) + 1.0);
}

void check_position_dtype(const torch::Tensor& positions, const char* caller) {
  TORCH_CHECK_TYPE(!positions.is_floating_point() && !positions.is_complex() &&
                       positions.scalar_type() != at::kBool,
                   caller, ": expected integer positions, got ", positions.scalar_type());
}

// The frequencies of checked options.
torch::Tensor frequencies(const RotaryOptions& options) {
  const int64_t r = options.rotary_dim();
  auto freq = torch::pow(options.theta(),
                         -torch::arange(0, r, 2, torch::TensorOptions().dtype(torch::kDouble)) / r);
  if (options.rotated_pairs() > 0)
    freq.narrow(0, options.rotated_pairs(), r / 2 - options.rotated_pairs()).zero_();
  if (options.yarn_scaling()) {
    // The pair whose wavelength turns `turns` times within the original context: its index in
    // the exponents, rotary_dim ln(L / (turns 2 pi)) / (2 ln theta), bounded to the pairs.
    const auto& s = *options.yarn_scaling();
    const double log_theta = std::log(options.theta());
    const auto pair_turning = [&](double turns) {
      return r * std::log(static_cast<double>(s.original_context_length()) / (turns * 2 * kPi)) /
             (2 * log_theta);
    };
    const double low = std::max(std::floor(pair_turning(s.beta_fast())), 0.0);
    const double high =
        std::min(std::ceil(pair_turning(s.beta_slow())), static_cast<double>(r - 1));
    // Pairs before `low` keep their frequency, those after `high` are divided by the factor.
    const auto ramp = ((torch::arange(r / 2, torch::TensorOptions().dtype(torch::kDouble)) - low) /
                       (high > low ? high - low : 0.001))
                          .clamp(0.0, 1.0);
    return freq / s.factor() * ramp + freq * (1 - ramp);
  }
  if (!options.llama3_scaling()) return freq;
  const auto& s = *options.llama3_scaling();
  const double old = static_cast<double>(s.original_context_length());
  const double low_wavelength = old / s.low_freq_factor();
  const double high_wavelength = old / s.high_freq_factor();
  const auto wavelength = 2 * kPi / freq;
  // Between the two wavelengths the scaled and the kept frequency are blended linearly in
  // old / wavelength.
  const auto smooth =
      (old / wavelength - s.low_freq_factor()) / (s.high_freq_factor() - s.low_freq_factor());
  const auto blended = (1 - smooth) * freq / s.factor() + smooth * freq;
  auto scaled = torch::where(wavelength > low_wavelength, freq / s.factor(), blended);
  return torch::where(wavelength < high_wavelength, freq, scaled);
}

// The tables of checked options and positions.
std::pair<torch::Tensor, torch::Tensor> tables(const torch::Tensor& positions,
                                               const RotaryOptions& options, at::ScalarType dtype) {
  const auto freq = frequencies(options).to(positions.device());
  const auto angles = positions.to(torch::kDouble).unsqueeze(-1) * freq;
  const double factor = attention_factor(options);
  if (factor == 1.0) return {angles.cos().to(dtype), angles.sin().to(dtype)};
  return {(angles.cos() * factor).to(dtype), (angles.sin() * factor).to(dtype)};
}

}  // namespace

}  // namespace functional

namespace detail {

// Checks `options` against a head of `head_dim` features and resolves rotary_dim 0 to it.
functional::RotaryOptions resolve_rotary(functional::RotaryOptions options, int64_t head_dim,
                                         const char* caller) {
  functional::check_theta(options.theta(), caller);
  if (options.rotary_dim() == 0) options.rotary_dim(head_dim);
  TORCH_CHECK_VALUE(
      options.rotary_dim() > 0 && options.rotary_dim() % 2 == 0 && options.rotary_dim() <= head_dim,
      caller, ": expected an even rotary_dim in [2, ", head_dim,
      "] (the head size; 0 for all of it), got ", options.rotary_dim());
  functional::check_common(options, caller);
  return options;
}

at::ScalarType rotary_compute_dtype(at::ScalarType dtype) {
  return dtype == at::kBFloat16 || dtype == at::kHalf ? at::kFloat : dtype;
}

torch::Tensor rotate(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                     functional::RotaryLayout layout) {
  const int64_t half = cos.size(-1), rotated = 2 * half;
  const auto wide = x.to(rotary_compute_dtype(x.scalar_type()));
  const auto part = wide.narrow(-1, 0, rotated);
  torch::Tensor out;
  if (layout == functional::RotaryLayout::HalfSplit) {
    const auto x1 = part.narrow(-1, 0, half), x2 = part.narrow(-1, half, half);
    out = torch::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1);
  } else {
    auto pairs = part.unflatten(-1, {half, 2});
    const auto x1 = pairs.select(-1, 0), x2 = pairs.select(-1, 1);
    out = torch::stack({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1).flatten(-2);
  }
  if (rotated < x.size(-1))
    out = torch::cat({out, wide.narrow(-1, rotated, x.size(-1) - rotated)}, -1);
  return out.to(x.scalar_type());
}

RotaryCache::RotaryCache(const functional::RotaryOptions& options) : options_(options) {}

std::pair<torch::Tensor, torch::Tensor> RotaryCache::rows(int64_t start, int64_t count,
                                                          at::ScalarType dtype,
                                                          const at::Device& device) {
  const auto compute = rotary_compute_dtype(dtype);
  if (start + count > kMaxCachedPositions) {
    // Far into a long generation (a sliding-window cache keeps its memory constant; the tables
    // should too): these rows are computed for this call alone.
    const auto positions =
        torch::arange(start, start + count, torch::TensorOptions().dtype(torch::kLong));
    auto [cos, sin] = functional::tables(positions, options_, compute);
    return {cos.to(device), sin.to(device)};
  }
  const std::string key = device.str() + "/" + c10::toString(compute);
  std::lock_guard<std::mutex> lock(mutex_);
  auto& table = tables_[key];
  const int64_t have = table.first.defined() ? table.first.size(0) : 0;
  if (start + count > have) {
    const int64_t length =
        std::min(kMaxCachedPositions, std::max<int64_t>(start + count, 2 * have));
    const auto positions = torch::arange(length, torch::TensorOptions().dtype(torch::kLong));
    auto [cos, sin] = functional::tables(positions, options_, compute);
    table = {cos.to(device), sin.to(device)};
  }
  return {table.first.narrow(0, start, count), table.second.narrow(0, start, count)};
}

}  // namespace detail

namespace functional {

torch::Tensor rotary_frequencies(const RotaryOptions& options) {
  check_resolved(options, kFrequencies);
  return frequencies(options);
}

std::pair<torch::Tensor, torch::Tensor> rotary_tables(const torch::Tensor& positions,
                                                      const RotaryOptions& options,
                                                      at::ScalarType dtype) {
  TORCH_CHECK_VALUE(positions.defined(), kTables, ": expected a defined positions tensor");
  check_position_dtype(positions, kTables);
  TORCH_CHECK_VALUE(positions.dim() == 1, kTables, ": expected positions (T,), got ",
                    detail::shape_str(positions.sizes()));
  TORCH_CHECK_TYPE(c10::isFloatingType(dtype), kTables, ": expected a floating dtype, got ", dtype);
  check_resolved(options, kTables);
  return tables(positions, options, dtype);
}

torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& positions,
                           const RotaryOptions& options) {
  TORCH_CHECK_VALUE(x.defined() && positions.defined(), kApply,
                    ": expected defined x and positions tensors");
  TORCH_CHECK_VALUE(x.dim() >= 2, kApply, ": expected x (..., T, d), got ",
                    detail::shape_str(x.sizes()));
  TORCH_CHECK_TYPE(x.is_floating_point(), kApply, ": expected floating-point x, got ",
                   x.scalar_type());
  check_position_dtype(positions, kApply);
  TORCH_CHECK_VALUE(positions.dim() == 1 && positions.size(0) == x.size(-2), kApply,
                    ": expected positions (", x.size(-2), ",), one per token of x ",
                    detail::shape_str(x.sizes()), ", got ", detail::shape_str(positions.sizes()));
  TORCH_CHECK(positions.device() == x.device(), kApply, ": expected positions on device ",
              x.device(), ", got ", positions.device());
  const auto resolved = detail::resolve_rotary(options, x.size(-1), kApply);
  auto [cos, sin] = tables(positions, resolved, detail::rotary_compute_dtype(x.scalar_type()));
  return detail::rotate(x, cos, sin, resolved.layout());
}

}  // namespace functional
}  // namespace attention
