#pragma once

// Catch2 2 (Debian 12) and Catch2 3 (Debian 13) behind one include: the tests use only what
// both have, through the names below.

#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
#define ATTENTION_CATCH_MAJOR 3
namespace test {
using Catch::Approx;
inline auto contains(const std::string& s) {
  return Catch::Matchers::ContainsSubstring(s);
}
inline auto starts_with(const std::string& s) {
  return Catch::Matchers::StartsWith(s);
}
inline auto ends_with(const std::string& s) {
  return Catch::Matchers::EndsWith(s);
}
}  // namespace test
#else
#include <catch2/catch.hpp>
#define ATTENTION_CATCH_MAJOR 2
namespace test {
using Catch::Detail::Approx;
inline auto contains(const std::string& s) {
  return Catch::Contains(s);
}
inline auto starts_with(const std::string& s) {
  return Catch::StartsWith(s);
}
inline auto ends_with(const std::string& s) {
  return Catch::EndsWith(s);
}
}  // namespace test
#endif
