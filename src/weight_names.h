#pragma once

// From a file's names to a module's: the prefix, rename and layout steps of load_weights().

#include <attention/safetensors.h>
#include <attention/weights.h>

#include <string>
#include <vector>

namespace attention {
namespace detail {

/// The entries whose names start with `prefix`, without it. Throws c10::ValueError listing the
/// file's prefixes when none does.
NamedTensors select_prefix(const NamedTensors& file, const std::string& prefix,
                           const std::string& source);

/// Every name through `map`; throws c10::ValueError when two names map to one, or one to "".
NamedTensors rename_all(const NamedTensors& file, const LoadOptions::NameMap& map,
                        const std::string& source);

/// A layout's names and tensors converted to this library's; `derived` receives the names the
/// layout drops because the module computes them itself.
NamedTensors convert_layout(const NamedTensors& file, WeightLayout layout,
                            const std::string& source, std::vector<std::string>& derived);

}  // namespace detail
}  // namespace attention
