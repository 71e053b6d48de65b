#include <attention/safetensors.h>
#include <attention/testing.h>

#include <torch/autograd.h>
#include <torch/torch.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <exception>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>

namespace attention {
namespace testing {
namespace {

constexpr const char* kLoad = "attention::testing::load_parity_case";
constexpr int kFormatVersion = 1;

std::string read_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  TORCH_CHECK(file, kLoad, ": cannot open '", path, "'");
  return std::string(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
}

std::vector<std::string> strings(const nlohmann::json& manifest, const char* key,
                                 const std::string& path) {
  TORCH_CHECK(manifest.contains(key) && manifest[key].is_array(), kLoad, ": '", path,
              "' has no list '", key, "'");
  std::vector<std::string> out;
  for (const auto& item : manifest[key]) {
    TORCH_CHECK(item.is_string(), kLoad, ": '", path, "': '", key, "' holds a non-string");
    out.push_back(item.get<std::string>());
  }
  return out;
}

// An optional entry of the manifest, checked to have the JSON type that `is_type` tests; `fallback`
// when absent. (nlohmann's value() would throw its own type_error, which names neither file nor
// key.)
template <typename T>
T entry(const nlohmann::json& manifest, const char* key, const std::string& path, T fallback,
        bool (nlohmann::json::*is_type)() const noexcept, const char* type) {
  if (!manifest.contains(key)) return fallback;
  TORCH_CHECK((manifest[key].*is_type)(), kLoad, ": '", path, "': '", key, "' must be ", type,
              ", got ", manifest[key].dump());
  return manifest[key].get<T>();
}

std::string text(const nlohmann::json& manifest, const char* key, const std::string& path) {
  return entry<std::string>(manifest, key, path, "", &nlohmann::json::is_string, "a string");
}

double number(const nlohmann::json& manifest, const char* key, const std::string& path) {
  TORCH_CHECK(manifest.contains(key) && manifest[key].is_number(), kLoad, ": '", path,
              "' has no number '", key, "'");
  const double value = manifest[key].get<double>();
  TORCH_CHECK(std::isfinite(value) && value >= 0, kLoad, ": '", path, "': '", key,
              "' must be a finite number >= 0, got ", value);
  return value;
}

// The name a file's tensor has in the module under the loading options' prefix and renames, as
// load_weights() maps it; empty when the prefix leaves it out.
std::string module_name(const std::string& file_name, const LoadOptions& options) {
  std::string name = file_name;
  if (!options.prefix().empty()) {
    if (name.compare(0, options.prefix().size(), options.prefix()) != 0) return "";
    name = name.substr(options.prefix().size());
  }
  return options.rename() ? options.rename()(name) : name;
}

std::string index_str(const std::vector<int64_t>& index) {
  return fmt::format("[{}]", fmt::join(index, ", "));
}

// torch's Python name of a dtype (`str(dtype)` without "torch."), as the recorder writes it.
at::ScalarType scalar_type_named(const std::string& name, const std::string& path) {
  static const std::map<std::string, at::ScalarType> kNames = {{"float64", at::kDouble},
                                                               {"float32", at::kFloat},
                                                               {"float16", at::kHalf},
                                                               {"bfloat16", at::kBFloat16},
                                                               {"complex64", at::kComplexFloat},
                                                               {"complex128", at::kComplexDouble},
                                                               {"int64", at::kLong},
                                                               {"int32", at::kInt},
                                                               {"int16", at::kShort},
                                                               {"int8", at::kChar},
                                                               {"uint8", at::kByte},
                                                               {"bool", at::kBool}};
  const auto found = kNames.find(name);
  TORCH_CHECK(found != kNames.end(), kLoad, ": '", path,
              "': 'dtype' must name a torch dtype "
              "(float64, float32, float16, bfloat16, ...), got '",
              name, "'");
  return found->second;
}

// Parses the manifest, telling a file cut short (an interrupted copy or recording) from one that
// is not JSON at all.
nlohmann::json parse_manifest(const std::string& text, const std::string& path) {
  TORCH_CHECK(text.find_first_not_of(" \t\r\n") != std::string::npos, kLoad, ": '", path,
              "' is empty");
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    // nlohmann reports the byte after the last when the input ends too early.
    TORCH_CHECK(e.byte <= text.size(), kLoad, ": '", path, "' is truncated: its ", text.size(),
                " bytes end inside the JSON document");
    const std::string what = e.what();
    const size_t at = what.find("parse error");
    TORCH_CHECK(false, kLoad, ": '", path,
                "' is not valid JSON: ", at == std::string::npos ? what : what.substr(at));
  }
}

// |a - e| elementwise in double, where NaN against NaN and an infinity against the same one are
// no difference and NaN or an infinity on one side only is an infinite one.
torch::Tensor differences(const torch::Tensor& a, const torch::Tensor& e) {
  const auto same_special =
      a.isnan().logical_and(e.isnan()).logical_or(a.isinf().logical_and(a == e));
  return torch::where(same_special, torch::zeros_like(a),
                      torch::nan_to_num((a - e).abs(), /*nan=*/INFINITY, /*posinf=*/INFINITY));
}

}  // namespace

ParityCase load_parity_case(const std::string& directory) {
  const std::string manifest_path = directory + "/manifest.json";
  const nlohmann::json manifest = parse_manifest(read_file(manifest_path), manifest_path);
  TORCH_CHECK(manifest.is_object(), kLoad, ": '", manifest_path, "' is not a JSON object");
  const std::string format = text(manifest, "format", manifest_path);
  TORCH_CHECK(format == "attention-parity", kLoad, ": '", manifest_path,
              "' is not a parity case (format '", format, "', expected 'attention-parity')");
  const auto version = entry<int64_t>(manifest, "format_version", manifest_path, 0,
                                      &nlohmann::json::is_number_integer, "an integer");
  TORCH_CHECK(version == kFormatVersion, kLoad, ": '", manifest_path, "' has format version ",
              version, "; this library reads version ", kFormatVersion);

  ParityCase c;
  c.directory = directory;
  c.name = text(manifest, "name", manifest_path);
  c.module = text(manifest, "module", manifest_path);
  c.torch_version = text(manifest, "torch_version", manifest_path);
  c.dtype = text(manifest, "dtype", manifest_path);
  if (!c.dtype.empty()) c.scalar_type = scalar_type_named(c.dtype, manifest_path);
  if (manifest.contains("seed") && manifest["seed"].is_number_integer()) {
    c.seed = manifest["seed"].get<int64_t>();
  }
  c.rtol = number(manifest, "rtol", manifest_path);
  c.atol = number(manifest, "atol", manifest_path);
  c.gradients = entry<bool>(manifest, "gradients", manifest_path, false,
                            &nlohmann::json::is_boolean, "true or false");
  c.input_names = strings(manifest, "inputs", manifest_path);
  c.output_names = strings(manifest, "outputs", manifest_path);
  c.parameter_names = strings(manifest, "parameters", manifest_path);

  const std::string tensors_path = directory + "/tensors.safetensors";
  const std::string bytes = read_file(tensors_path);
  for (auto& [name, tensor] : parse_safetensors(bytes.data(), bytes.size())) {
    c.tensors[name] = tensor;
  }
  auto require = [&](const std::string& name) {
    TORCH_CHECK(c.tensors.count(name), kLoad, ": '", tensors_path, "' lacks '", name, "', which '",
                manifest_path, "' names");
  };
  for (const auto& name : c.input_names) {
    require("input." + name);
    c.inputs.push_back(c.tensors["input." + name]);
  }
  for (const auto& name : c.output_names) require("output." + name);
  return c;
}

std::string to_string(const TensorMismatch& m) {
  if (m.problem != "values") return fmt::format("{}: {}", m.tensor, m.problem);
  return fmt::format(
      "{}: {} of {} elements beyond the tolerance; max |diff| {:.3g}, max rel diff {:.3g}; "
      "worst at {}: C++ {:.9g}, Python {:.9g}",
      m.tensor, m.count, m.numel, m.max_abs_diff, m.max_rel_diff, index_str(m.where), m.actual,
      m.expected);
}

std::string ParityReport::str() const {
  if (passed()) {
    return fmt::format("parity case '{}': all {} tensors match Python's\n", case_name,
                       compared.size());
  }
  std::string out = fmt::format("parity case '{}': {} of {} tensors differ from Python's\n",
                                case_name, mismatches.size(), compared.size());
  for (const auto& m : mismatches) out += "  " + to_string(m) + "\n";
  return out;
}

std::ostream& operator<<(std::ostream& stream, const ParityReport& report) {
  return stream << report.str();
}

namespace {

// compare_tensor(), and the largest |C++ - Python| of a tensor of the right shape folded into
// `largest` on the way, so that check_parity() computes the differences once.
c10::optional<TensorMismatch> compare_values(const std::string& name, const torch::Tensor& actual,
                                             const torch::Tensor& expected, double rtol,
                                             double atol, double* largest) {
  TensorMismatch m;
  m.tensor = name;
  if (!actual.defined()) {
    m.problem = "the C++ side gave no tensor";
    return m;
  }
  if (actual.sizes() != expected.sizes()) {
    m.problem = fmt::format("shape {} in C++, {} in Python", index_str(actual.sizes().vec()),
                            index_str(expected.sizes().vec()));
    return m;
  }
  if (actual.is_floating_point() != expected.is_floating_point()) {
    m.problem = fmt::format("dtype {} in C++, {} in Python", c10::toString(actual.scalar_type()),
                            c10::toString(expected.scalar_type()));
    return m;
  }
  torch::NoGradGuard no_grad;
  const auto a = actual.detach().to(torch::kCPU, torch::kDouble);
  const auto e = expected.detach().to(torch::kCPU, torch::kDouble);
  const auto diff = differences(a, e);
  if (largest != nullptr && diff.numel() > 0) {
    *largest = std::max(*largest, diff.max().item<double>());
  }
  // Beyond the tolerance by how much; an infinite difference always (inf - inf is NaN).
  const auto excess = torch::where(
      diff == 0, diff,
      torch::nan_to_num(diff - (atol + rtol * e.abs()), /*nan=*/INFINITY, /*posinf=*/INFINITY));
  const auto beyond = excess > 0;
  m.count = beyond.sum().item<int64_t>();
  m.numel = a.numel();
  if (m.count == 0) return c10::nullopt;

  m.problem = "values";
  m.max_abs_diff = diff.max().item<double>();
  const auto nonzero = (e != 0).logical_and(e.isfinite());
  if (nonzero.any().item<bool>()) {
    m.max_rel_diff = (diff / e.abs()).masked_select(nonzero).max().item<double>();
  }
  int64_t flat = excess.flatten().argmax().item<int64_t>();
  m.where.assign(static_cast<size_t>(a.dim()), 0);
  for (int64_t d = a.dim() - 1; d >= 0; --d) {
    m.where[static_cast<size_t>(d)] = flat % a.size(d);
    flat /= a.size(d);
  }
  m.actual = a.flatten()[excess.flatten().argmax()].item<double>();
  m.expected = e.flatten()[excess.flatten().argmax()].item<double>();
  return m;
}

}  // namespace

c10::optional<TensorMismatch> compare_tensor(const std::string& name, const torch::Tensor& actual,
                                             const torch::Tensor& expected, double rtol,
                                             double atol) {
  return compare_values(name, actual, expected, rtol, atol, nullptr);
}

ParityReport check_parity(torch::nn::Module& module, const ParityCase& c,
                          const ParityForward& forward, const ParityOptions& options) {
  constexpr const char* kCheck = "attention::testing::check_parity";
  TORCH_CHECK_VALUE(c.inputs.size() == c.input_names.size(), kCheck, ": the case '", c.name,
                    "' has ", c.inputs.size(), " inputs for ", c.input_names.size(),
                    " input names");
  for (const auto& name : c.output_names) {
    TORCH_CHECK_VALUE(c.tensors.count("output." + name), kCheck, ": the case '", c.name,
                      "' has no tensor 'output.", name, "'");
  }
  TORCH_CHECK_VALUE(forward, kCheck, ": no forward function given");
  if (options.load_weights()) load_weights(module, c.weights_path(), options.load());
  const double rtol = options.rtol().value_or(c.rtol);
  const double atol = options.atol().value_or(c.atol);
  TORCH_CHECK_VALUE(std::isfinite(rtol) && rtol >= 0 && std::isfinite(atol) && atol >= 0, kCheck,
                    ": tolerances must be finite and >= 0, got rtol ", rtol, " and atol ", atol);
  const bool gradients = options.gradients() && c.gradients;

  ParityReport report;
  report.case_name = c.name;
  auto compare = [&](const std::string& name, const torch::Tensor& actual) {
    report.compared.push_back(name);
    auto mismatch =
        compare_values(name, actual, c.tensors.at(name), rtol, atol, &report.max_abs_diff);
    if (mismatch) report.mismatches.push_back(*mismatch);
  };

  std::vector<torch::Tensor> inputs;
  for (const auto& input : c.inputs) {
    auto leaf = input.clone();
    if (gradients && leaf.is_floating_point()) leaf.requires_grad_(true);
    inputs.push_back(leaf);
  }
  for (auto& parameter : module.parameters()) parameter.mutable_grad() = torch::Tensor();

  torch::AutoGradMode grad_mode(gradients);
  // The caller's forward: whatever it throws leaves as a c10::Error naming the case (one of its
  // own c10::Errors as it is).
  std::vector<torch::Tensor> outputs;
  try {
    outputs = forward(inputs);
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    TORCH_CHECK(false, kCheck, ": the forward threw on case '", c.name, "': ", e.what());
  } catch (...) {
    TORCH_CHECK(false, kCheck, ": the forward threw on case '", c.name,
                "': an exception of a type not derived from std::exception");
  }
  if (outputs.size() != c.output_names.size()) {
    report.compared.push_back("outputs");
    TensorMismatch m;
    m.tensor = "outputs";
    m.problem = fmt::format("the forward returned {} tensors, the case has {} ({})", outputs.size(),
                            c.output_names.size(), fmt::join(c.output_names, ", "));
    report.mismatches.push_back(m);
    return report;
  }
  std::vector<torch::Tensor> roots, upstream;
  for (size_t i = 0; i < outputs.size(); ++i) {
    compare("output." + c.output_names[i], outputs[i]);
    const auto grad_output = c.tensors.find("grad_output." + c.output_names[i]);
    if (gradients && grad_output != c.tensors.end() && outputs[i].defined() &&
        outputs[i].requires_grad() && outputs[i].sizes() == grad_output->second.sizes()) {
      roots.push_back(outputs[i]);
      upstream.push_back(grad_output->second.to(outputs[i].options()));
    }
  }
  if (!gradients) return report;
  if (roots.empty()) {
    // Python's outputs carried gradients; comparing none would pass a detached forward.
    report.compared.push_back("gradients");
    TensorMismatch m;
    m.tensor = "gradients";
    m.problem = "the case holds gradients, but no output of the forward records one";
    report.mismatches.push_back(m);
    return report;
  }

  torch::autograd::backward(roots, upstream);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string name = "grad.input." + c.input_names[i];
    if (!c.tensors.count(name)) continue;
    const auto& grad = inputs[i].grad();
    compare(name, grad.defined() ? grad : torch::zeros_like(inputs[i]));
  }
  if (!options.parameter_gradients()) return report;
  const auto parameters = module.named_parameters();
  for (const auto& file_name : c.parameter_names) {
    const std::string name = "grad.param." + file_name;
    if (!c.tensors.count(name)) continue;
    const std::string mapped = module_name(file_name, options.load());
    if (mapped.empty()) continue;  // outside the prefix: not a parameter of this module
    const auto* parameter = parameters.find(mapped);
    if (parameter == nullptr) {
      report.compared.push_back(name);
      TensorMismatch m;
      m.tensor = name;
      m.problem = fmt::format(
          "the module has no parameter '{}' (ParityOptions: "
          "parameter_gradients(false) for a layout that renames tensors)",
          mapped);
      report.mismatches.push_back(m);
      continue;
    }
    const auto& grad = parameter->grad();
    compare(name, grad.defined() ? grad : torch::zeros_like(*parameter));
  }
  return report;
}

int parity_main(int argc, char** argv,
                const std::function<ParityReport(const ParityCase&)>& check) {
  if (argc != 2) {
    std::cerr << "usage: " << (argc > 0 ? argv[0] : "parity-test") << " CASE_FOLDER\n";
    return 2;
  }
  try {
    const ParityReport report = check(load_parity_case(argv[1]));
    std::cout << report;
    return report.passed() ? 0 : 1;
  } catch (const c10::Error& error) {
    std::cerr << "parity case '" << argv[1] << "': " << error.what_without_backtrace() << "\n";
    return 2;
  } catch (const std::exception& error) {
    std::cerr << "parity case '" << argv[1] << "': " << error.what() << "\n";
    return 2;
  } catch (...) {
    std::cerr << "parity case '" << argv[1]
              << "': an exception of a type not derived from std::exception\n";
    return 2;
  }
}

}  // namespace testing
}  // namespace attention
