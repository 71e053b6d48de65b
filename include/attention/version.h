#pragma once

/// \file
/// The library's version, and the LibTorch it was built with. The CMake package takes its version
/// from the three macros below; a shared build's SOVERSION follows from them.
///
/// Example:
/// \code
/// #include <attention/version.h>
///
/// static_assert(ATTENTION_VERSION >= 100, "needs attention-cpp 0.1 or later");
/// // The header a program was compiled with against the library it runs with:
/// if (attention::version() != ATTENTION_VERSION) std::abort();
/// std::cout << attention::version_string() << " built on LibTorch "
///           << attention::torch_version_string() << "\n";
/// \endcode

#include <attention/export.h>

/// Major version: changes when the API changes incompatibly (while 0, the minor version does).
#define ATTENTION_VERSION_MAJOR 0
/// Minor version: changes when the API grows.
#define ATTENTION_VERSION_MINOR 2
/// Patch version: changes with fixes alone.
#define ATTENTION_VERSION_PATCH 0

/// The version as one number: major * 10000 + minor * 100 + patch (0.1.0 is 100).
#define ATTENTION_VERSION \
  (ATTENTION_VERSION_MAJOR * 10000 + ATTENTION_VERSION_MINOR * 100 + ATTENTION_VERSION_PATCH)

namespace attention {

/// ATTENTION_VERSION as the library was compiled: differs from the macro when a program runs with
/// another build of the shared library than the headers it was compiled with.
ATTENTION_API int version();

/// The library's version as "major.minor.patch".
ATTENTION_API const char* version_string();

/// The LibTorch the library was compiled against, as "major.minor.patch" (TORCH_VERSION_MAJOR,
/// _MINOR and _PATCH of its headers). A program must use the same LibTorch major and minor version:
/// LibTorch's C++ ABI is not stable across them.
ATTENTION_API const char* torch_version_string();

/// TORCH_VERSION_MAJOR * 10000 + TORCH_VERSION_MINOR * 100 + TORCH_VERSION_PATCH of the LibTorch
/// the library was compiled against (2.6.0 is 20600).
ATTENTION_API int torch_version();

}  // namespace attention
