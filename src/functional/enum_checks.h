#pragma once

// Enumerations reach the library as values a caller may have cast from any integer: a value no
// case handles would take whichever branch its comparisons fall to. Checked where options are
// first read.

#include <attention/causal_alignment.h>
#include <attention/functional.h>

#include <c10/util/Exception.h>

namespace attention {
namespace detail {

inline void check_backend(functional::Backend backend, const char* caller) {
  using functional::Backend;
  TORCH_CHECK_VALUE(backend == Backend::Auto || backend == Backend::Math ||
                        backend == Backend::Chunked || backend == Backend::Native,
                    caller, ": expected a Backend (Auto, Math, Chunked or Native), got the value ",
                    static_cast<int>(backend));
}

inline void check_alignment(functional::CausalAlignment alignment, const char* caller) {
  using functional::CausalAlignment;
  TORCH_CHECK_VALUE(
      alignment == CausalAlignment::BottomRight || alignment == CausalAlignment::TopLeft, caller,
      ": expected a CausalAlignment (BottomRight or TopLeft), got the value ",
      static_cast<int>(alignment));
}

}  // namespace detail
}  // namespace attention
