#pragma once

// Fuzz inputs read as small programs that write the bytes under test, so that a few bytes of input
// reach the shapes that cost readers their stack, memory or time: deep nesting, long repetition,
// a memoized value used again and again, many distinct keys, long texts. The instructions:
//
//   0xF0 a b   replay the (a + 1) instructions before this one, (b + 1) times
//   0xF1       a decimal counter, one more each time it runs (distinct names and keys)
//   0xF2 a b   (a + 256 b + 1) bytes of 'a' (a long text)
//   any other  itself
//
// Replays may replay replays: the output grows geometrically with a few bytes of input, up to
// kMaxStructuredOutput bytes or kMaxStructuredSteps instructions run, where the program stops.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fuzz {

/// The first byte of an input that is such a program (the targets read any other as it is).
constexpr uint8_t kStructured = 0xF5;

constexpr std::size_t kMaxStructuredOutput = std::size_t{8} << 20;
// A step costs a few microseconds under the sanitizers and the fuzzer's coverage, and a program
// that runs to this bound must end well inside the fuzzer's 30 s for an input: 32 Mi steps took
// over 120 s, 4 Mi 16 s; at 2 Mi, byte instructions alone still write 2 MiB, and long texts the
// whole output.
constexpr std::size_t kMaxStructuredSteps = std::size_t{2} << 20;

class StructuredInput {
 public:
  StructuredInput(const uint8_t* data, std::size_t size) {
    for (std::size_t i = 0; i < size; ++i) {
      Instruction in{data[i], 0, 0};
      if ((data[i] == 0xF0 || data[i] == 0xF2) && i + 2 < size) {
        in.a = data[i + 1];
        in.b = data[i + 2];
        i += 2;
      }
      program_.push_back(in);
    }
  }

  /// The bytes the program writes.
  std::string run() {
    out_.clear();
    counter_ = 0;
    steps_ = 0;
    for (std::size_t i = 0; i < program_.size() && !done(); ++i) {
      execute(i, 0);
    }
    if (out_.size() > kMaxStructuredOutput) out_.resize(kMaxStructuredOutput);
    return out_;
  }

 private:
  struct Instruction {
    uint8_t op, a, b;
  };

  bool done() const { return out_.size() >= kMaxStructuredOutput || steps_ >= kMaxStructuredSteps; }

  void execute(std::size_t at, int depth) {
    const Instruction& in = program_[at];
    if (done()) return;
    ++steps_;
    switch (in.op) {
      case 0xF0: {
        // Depth bounds the recursion of replays that replay replays, the step count the work.
        if (depth >= 8) return;
        const std::size_t count = static_cast<std::size_t>(in.a) + 1;
        const std::size_t first = at >= count ? at - count : 0;
        for (int r = 0; r <= in.b && !done(); ++r) {
          for (std::size_t j = first; j < at; ++j) execute(j, depth + 1);
        }
        return;
      }
      case 0xF1:
        out_ += std::to_string(counter_++);
        return;
      case 0xF2:
        out_.append(static_cast<std::size_t>(in.a) + 256 * in.b + 1, 'a');
        return;
      default:
        out_ += static_cast<char>(in.op);
    }
  }

  std::vector<Instruction> program_;
  std::string out_;
  uint64_t counter_ = 0;
  std::size_t steps_ = 0;
};

}  // namespace fuzz
