// The executable-code cache behind the libxsmm route: one generation per key, kept failures, the
// bound on keys, code that runs, and concurrent requests for the same keys.

#include "gemm/code_cache.h"

#include "catch_compat.h"

#include <atomic>
#include <map>
#include <thread>
#include <vector>

namespace cpu = attention::kernels::cpu;

namespace {

cpu::CodeCache::Key key_of(int64_t id) {
  return {4, id, 16, 16, 16, 16, 16, 0};
}

// x86-64 machine code for `int f() { return value; }`: mov eax, imm32; ret.
std::vector<unsigned char> returning(int32_t value) {
  std::vector<unsigned char> code = {0xB8, 0, 0, 0, 0, 0xC3};
  for (int byte = 0; byte < 4; ++byte)
    code[1 + byte] =
        static_cast<unsigned char>((static_cast<uint32_t>(value) >> (8 * byte)) & 0xFF);
  return code;
}

}  // namespace

TEST_CASE("cpu::CodeCache generates each key once and keeps what it generated", "[code_cache]") {
  cpu::CodeCache cache(8);
  int calls = 0;
  const auto generator = [&] {
    ++calls;
    return returning(7);
  };
  const void* first = cache.get(key_of(1), generator);
  REQUIRE(first != nullptr);
  CHECK(cache.get(key_of(1), generator) == first);
  CHECK(calls == 1);
  const void* second = cache.get(key_of(2), generator);
  CHECK(second != nullptr);
  CHECK(second != first);
  CHECK(calls == 2);
  CHECK(cache.size() == 2);
  CHECK(cache.mapped_bytes() > 0);
}

TEST_CASE("cpu::CodeCache keeps a failed generation and does not retry it", "[code_cache]") {
  cpu::CodeCache cache(8);
  int calls = 0;
  const auto failing = [&] {
    ++calls;
    return std::vector<unsigned char>();
  };
  CHECK(cache.get(key_of(1), failing) == nullptr);
  CHECK(cache.get(key_of(1), failing) == nullptr);
  CHECK(calls == 1);
  CHECK(cache.size() == 1);
  CHECK(cache.mapped_bytes() == 0);
}

TEST_CASE("cpu::CodeCache holds at most its capacity of keys", "[code_cache]") {
  cpu::CodeCache cache(2);
  int calls = 0;
  const auto generator = [&] {
    ++calls;
    return returning(1);
  };
  const void* one = cache.get(key_of(1), generator);
  const void* two = cache.get(key_of(2), generator);
  REQUIRE(one != nullptr);
  REQUIRE(two != nullptr);
  CHECK(cache.get(key_of(3), generator) == nullptr);
  CHECK(calls == 2);  // past the bound the generator is not even asked
  CHECK(cache.get(key_of(1), generator) == one);
  CHECK(cache.get(key_of(2), generator) == two);
  CHECK(cache.size() == 2);
}

TEST_CASE("cpu::CodeCache's code runs", "[code_cache]") {
#if defined(__x86_64__)
  cpu::CodeCache cache(4);
  using Function = int (*)();
  const auto f = reinterpret_cast<Function>(
      const_cast<void*>(cache.get(key_of(1), [] { return returning(42); })));
  const auto g = reinterpret_cast<Function>(
      const_cast<void*>(cache.get(key_of(2), [] { return returning(-5); })));
  REQUIRE(f != nullptr);
  REQUIRE(g != nullptr);
  CHECK(f() == 42);
  CHECK(g() == -5);
#else
  WARN("skipped: the test's machine code is x86-64");
#endif
}

TEST_CASE("cpu::CodeCache generates a key once when threads ask for it together", "[code_cache]") {
  constexpr int kKeys = 64, kThreads = 4;
  cpu::CodeCache cache(kKeys);
  std::vector<std::atomic<int>> calls(kKeys);
  for (auto& count : calls) count = 0;
  std::vector<std::vector<const void*>> seen(kThreads, std::vector<const void*>(kKeys));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) {
        for (int i = 0; i < kKeys; ++i) {
          const int id = (i * (2 * t + 1) + t + round) % kKeys;  // every key, in its own order
          seen[t][id] = cache.get(key_of(id), [&] {
            ++calls[id];
            return returning(id);
          });
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int id = 0; id < kKeys; ++id) {
    INFO("key " << id);
    CHECK(calls[id] == 1);
    for (int t = 0; t < kThreads; ++t) CHECK(seen[t][id] == seen[0][id]);
    CHECK(seen[0][id] != nullptr);
  }
  CHECK(cache.size() == static_cast<size_t>(kKeys));
}
