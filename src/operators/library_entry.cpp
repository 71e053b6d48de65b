// libattention_ops: the operators for a process that loads them at run time (Python's
// torch.ops.load_library, or dlopen), registered when the library is loaded.

#include <attention/operators.h>

namespace {

const bool registered = [] {
  attention::register_operators();
  return true;
}();

}  // namespace
