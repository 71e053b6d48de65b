#pragma once

// From a file's names to a module's: the prefix, rename and layout steps of load_weights().

#include <attention/safetensors.h>
#include <attention/weights.h>

#include <torch/types.h>

#include <string>
#include <vector>

namespace attention {
namespace detail {

/// The function that load_weights()'s messages name, from every file of the loading steps.
inline constexpr const char* kLoadWeights = "attention::load_weights";

/// A tensor of the file under the module's name. A layout that concatenates tensors (the book's
/// wrapper's heads) keeps the parts here, and the concatenation is made only once its shape has
/// been checked against the module's tensor: a file of views (a stride-0 tensor of any size over
/// one element) cannot make a load allocate more than the module holds.
struct FileTensor {
  std::string name;
  /// One tensor, or the parts to concatenate along the first dimension (checked to agree in
  /// dtype and in every other dimension).
  std::vector<torch::Tensor> parts;

  std::vector<int64_t> sizes() const;
  c10::ScalarType scalar_type() const;
  bool is_floating_point() const { return c10::isFloatingType(scalar_type()); }
  /// The tensor; a concatenation is made here.
  torch::Tensor value() const;
};

/// The entries whose names start with `prefix`, without it. Throws c10::ValueError listing the
/// file's prefixes when none does.
NamedTensors select_prefix(NamedTensors file, const std::string& prefix, const std::string& source);

/// Every name through `map`; throws c10::ValueError when two names map to one, or one to "".
NamedTensors rename_all(NamedTensors file, const LoadOptions::NameMap& map,
                        const std::string& source);

/// A layout's names and tensors converted to this library's; `derived` receives the names the
/// layout drops because the module computes them itself.
std::vector<FileTensor> convert_layout(NamedTensors file, WeightLayout layout,
                                       const std::string& source,
                                       std::vector<std::string>& derived);

}  // namespace detail
}  // namespace attention
