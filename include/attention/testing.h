#pragma once

/// \file
/// The parity kit's C++ side (target `attention::testing`, a library of its own so that
/// applications need not link it): checks that a C++ module computes what a PyTorch module
/// computed, on a case that the kit's Python side recorded (`attention_parity.record()`, installed
/// with the package under share/attention/python). A case holds the weights, the inputs, the
/// outputs and, for a fixed upstream gradient, the gradients of the inputs and parameters.
///
/// Example:
/// \code
/// #include <attention/testing.h>
///
/// // Python: attention_parity.record(model, {"x": x}, "parity/block")
/// attention::testing::ParityCase recorded = attention::testing::load_parity_case("parity/block");
/// attention::MultiHeadAttention mha(attention::MultiHeadAttentionOptions(64, 64, 4));
/// attention::testing::ParityReport report = attention::testing::check_parity(
///     *mha, recorded, [&](const std::vector<torch::Tensor>& inputs) {
///       return std::vector<torch::Tensor>{mha(inputs[0]).output};
///     });
/// if (!report.passed()) std::cerr << report;  // every tensor that differs, and by how much
/// \endcode

#include <attention/export.h>
#include <attention/weights.h>

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <c10/util/Optional.h>

#include <functional>
#include <map>
#include <ostream>
#include <string>
#include <vector>

namespace attention {
namespace testing {

/// A case as `attention_parity.record()` wrote it: a folder with manifest.json,
/// weights.safetensors and tensors.safetensors.
struct ParityCase {
  /// The folder's name.
  std::string name;
  /// The folder, as given to load_parity_case().
  std::string directory;
  /// The Python module's class name.
  std::string module;
  /// The torch version that recorded the case.
  std::string torch_version;
  /// The outputs' dtype, as Python names it ("float32", "float64", ...).
  std::string dtype;
  /// The same dtype as LibTorch's type (e.g. torch::kFloat64 for "float64"), to convert a module
  /// or inputs with; unset when the manifest names no dtype. load_parity_case() refuses a name
  /// that is not one of torch's dtypes.
  c10::optional<at::ScalarType> scalar_type;
  /// The seed the recording script said it used, if it said.
  c10::optional<int64_t> seed;
  /// Relative tolerance of every comparison: |C++ - Python| <= atol + rtol * |Python|,
  /// elementwise.
  double rtol = 0;
  /// Absolute tolerance of every comparison.
  double atol = 0;
  /// Whether the case holds gradients (it has a floating output that required one).
  bool gradients = false;
  /// The forward's inputs by name, in order.
  std::vector<std::string> input_names;
  /// The forward's outputs by name, in order.
  std::vector<std::string> output_names;
  /// The parameters whose gradients the case holds, by their names in the weight file.
  std::vector<std::string> parameter_names;
  /// The inputs, in the order the forward takes them.
  std::vector<torch::Tensor> inputs;
  /// Every tensor of tensors.safetensors: `input.NAME`, `output.NAME`, `grad_output.NAME`,
  /// `grad.input.NAME`, `grad.param.NAME`.
  std::map<std::string, torch::Tensor> tensors;

  /// The case's weight file, for load_weights().
  std::string weights_path() const { return directory + "/weights.safetensors"; }
};

/// Reads a recorded case. Throws c10::Error naming the file and what is wrong: a missing file, a
/// manifest of another format or version, or tensors the manifest names but the file lacks.
/// Thread safety: keeps no state; any number of calls may run at once.
ATTENTION_TESTING_API ParityCase load_parity_case(const std::string& directory);

/// One tensor that differs from Python's.
struct TensorMismatch {
  /// The tensor's name in the case (output.0, grad.param.W_query, ...).
  std::string tensor;
  /// What differs: "values", or a description (shape, dtype, missing).
  std::string problem;
  /// The largest |C++ - Python|. Elements where both are NaN or the same infinity count as no
  /// difference; a NaN or infinity on one side only as an infinite one.
  double max_abs_diff = 0;
  /// The largest |C++ - Python| / |Python| over the elements where Python's value is finite
  /// and not 0.
  double max_rel_diff = 0;
  /// The element where the tolerance is exceeded the most.
  std::vector<int64_t> where;
  /// The C++ value at `where`.
  double actual = 0;
  /// Python's value at `where`.
  double expected = 0;
  /// How many elements are beyond the tolerance.
  int64_t count = 0;
  /// How many elements the tensor has.
  int64_t numel = 0;
};

/// One line for a mismatch: "<tensor>: <count> of <numel> elements beyond the tolerance; max
/// |diff| ...; worst at [i, j]: C++ <value>, Python <value>", or "<tensor>: <problem>".
ATTENTION_TESTING_API std::string to_string(const TensorMismatch& mismatch);

/// What check_parity() found.
struct ATTENTION_TESTING_API ParityReport {
  /// The case's name.
  std::string case_name;
  /// Every tensor compared, in order.
  std::vector<std::string> compared;
  /// Every tensor that differs beyond the tolerance.
  std::vector<TensorMismatch> mismatches;
  /// The largest |C++ - Python| over every compared tensor of the right shape (NaN against NaN
  /// and an infinity against the same one count as no difference), to see the margin.
  double max_abs_diff = 0;

  /// No mismatch.
  bool passed() const { return mismatches.empty(); }
  /// One line per mismatch (name, largest differences, where), or a line saying all matched.
  std::string str() const;
};

/// Prints ParityReport::str().
ATTENTION_TESTING_API std::ostream& operator<<(std::ostream& stream, const ParityReport& report);

/// Options of check_parity().
struct ParityOptions {
  /// Load the case's weights into the module first. Off for a module that already holds them
  /// (loaded from a TorchScript archive or a file of its own, say).
  TORCH_ARG(bool, load_weights) = true;
  /// How the case's weights load into the module (prefix, renames; load_weights()'s options).
  /// Parameter gradients are compared under the same prefix and renames; those of parameters
  /// outside the prefix are not compared.
  TORCH_ARG(LoadOptions, load) = {};
  /// Compare gradients when the case has them (a backward pass with its upstream gradient).
  TORCH_ARG(bool, gradients) = true;
  /// Compare the parameters' gradients too. Off for a module whose parameters do not map one to
  /// one onto the file's names (a LoadOptions layout that splits or fuses tensors).
  TORCH_ARG(bool, parameter_gradients) = true;
  /// Tolerances instead of the case's.
  TORCH_ARG(c10::optional<double>, rtol) = c10::nullopt;
  /// Absolute tolerance instead of the case's.
  TORCH_ARG(c10::optional<double>, atol) = c10::nullopt;
};

/// The module's forward as the case sees it: the inputs in the case's order (floating ones
/// requiring gradients when gradients are compared), the outputs in the case's order.
using ParityForward = std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>&)>;

/// Loads the case's weights into `module` by name, runs `forward` on the case's inputs, and
/// compares the outputs and, with the case's upstream gradient, the gradients of the inputs and
/// of the parameters with Python's. Every tensor is compared (the report lists every mismatch,
/// not the first). Throws c10::Error when the weights do not load (the module then stays as it
/// was) or the forward throws, c10::ValueError for a negative or non-finite tolerance; a wrong
/// number of outputs, or outputs recording no gradient for a case that holds gradients, is a
/// mismatch.
///
/// Thread safety: it loads weights into `module`, clears its gradients and runs a backward, so
/// no other thread may use `module` meanwhile; checks of different modules may run at once.
ATTENTION_TESTING_API ParityReport check_parity(torch::nn::Module& module, const ParityCase& c,
                                                const ParityForward& forward,
                                                const ParityOptions& options = {});

/// Compares one tensor with Python's: shape, then values within |a - e| <= atol + rtol * |e|
/// (NaN matches NaN, an infinity the same infinity). Returns the mismatch, or nullopt.
ATTENTION_TESTING_API c10::optional<TensorMismatch> compare_tensor(const std::string& name,
                                                                   const torch::Tensor& actual,
                                                                   const torch::Tensor& expected,
                                                                   double rtol, double atol);

/// A main() for one CTest test per case (attention_add_parity_test in the package's CMake):
/// argv[1] is the case's folder; `check` builds the module and returns check_parity()'s report.
/// Prints the report; returns 0 when it passed, 1 when it did not, 2 on an error (printed).
ATTENTION_TESTING_API int parity_main(int argc, char** argv,
                                      const std::function<ParityReport(const ParityCase&)>& check);

}  // namespace testing
}  // namespace attention
