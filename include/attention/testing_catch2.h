#pragma once

/// \file
/// A Catch2 matcher for parity reports, for Catch2 2 and Catch2 3 alike:
/// `CHECK_THAT(attention::testing::check_parity(...), attention::testing::MatchesPython())`.
/// On a failure Catch2 prints the report (every tensor that differs, and by how much). Include it
/// in test files of a program that links Catch2 and `attention::testing`.

#include <attention/testing.h>

#include <string>

#if __has_include(<catch2/matchers/catch_matchers.hpp>)
#include <catch2/matchers/catch_matchers.hpp>
#else
#include <catch2/catch.hpp>
#endif

namespace attention {
namespace testing {

/// Catch2's matcher base class: Catch::Matchers::MatcherBase in Catch2 3, Catch::MatcherBase in 2.
#if __has_include(<catch2/matchers/catch_matchers.hpp>)
template <typename T>
using CatchMatcherBase = Catch::Matchers::MatcherBase<T>;
#else
template <typename T>
using CatchMatcherBase = Catch::MatcherBase<T>;
#endif

/// Matches a ParityReport that found no mismatch.
class MatchesPythonMatcher : public CatchMatcherBase<ParityReport> {
 public:
  /// Whether the report passed.
  bool match(const ParityReport& report) const override { return report.passed(); }
  /// What the matcher expects, as Catch2 prints it after the report.
  std::string describe() const override { return "matches Python within the case's tolerance"; }
};

/// The matcher, as Catch2's own are made.
inline MatchesPythonMatcher MatchesPython() {
  return {};
}

}  // namespace testing
}  // namespace attention
