#pragma once

/// \file
/// What a shared build of the library exports. A shared build (`-DBUILD_SHARED_LIBS=ON`) compiles
/// with hidden symbols and exports only what is marked: the declarations of the public headers
/// (ATTENTION_API in libattention, ATTENTION_DISTRIBUTED_API in libattention_distributed,
/// ATTENTION_TESTING_API in libattention_testing). The installed package defines ATTENTION_SHARED
/// for its users when the library is shared; a static build leaves the macros empty.

#if defined(ATTENTION_SHARED)
#if defined(_WIN32)
#if defined(ATTENTION_BUILDING)
#define ATTENTION_API __declspec(dllexport)
#else
#define ATTENTION_API __declspec(dllimport)
#endif
#if defined(ATTENTION_DISTRIBUTED_BUILDING)
#define ATTENTION_DISTRIBUTED_API __declspec(dllexport)
#else
#define ATTENTION_DISTRIBUTED_API __declspec(dllimport)
#endif
#if defined(ATTENTION_TESTING_BUILDING)
#define ATTENTION_TESTING_API __declspec(dllexport)
#else
#define ATTENTION_TESTING_API __declspec(dllimport)
#endif
#else
#define ATTENTION_API __attribute__((visibility("default")))
#define ATTENTION_DISTRIBUTED_API __attribute__((visibility("default")))
#define ATTENTION_TESTING_API __attribute__((visibility("default")))
#endif
#else
#define ATTENTION_API
#define ATTENTION_DISTRIBUTED_API
#define ATTENTION_TESTING_API
#endif
