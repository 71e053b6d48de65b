// attention::distributed in one process: each rank is a thread with its own c10d Gloo group, the
// ranks meeting through one c10d::HashStore. Results are compared with one process computing
// the whole problem. (tests/CMakeLists.txt also runs examples/ring_attention over torchrun.)

#include <attention/attention.h>
#include <attention/distributed.h>

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "helpers.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

using attention::distributed::Group;
using attention::distributed::GroupOptions;
using torch::Tensor;
namespace F = attention::functional;

// Runs `body(group)` on `world` threads, one rank each, and returns what each returned; the
// first exception of any rank is rethrown here (Catch's assertions stay on this thread).
template <typename Result>
std::vector<Result> run_ranks(int64_t world, const std::function<Result(const Group&)>& body,
                              std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<Result> results(world);
  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        torch::set_num_threads(1);
        auto group =
            Group::create(store, r, world, GroupOptions().hostname("127.0.0.1").timeout(timeout));
        results[r] = body(group);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return results;
}

struct RingCase {
  int64_t batch = 2, heads = 4, kv_heads = 2, length = 48, d = 8, dv = 8;
  bool causal = true, padding = false;
  bool balanced = true;  // how the shards are made (shard_sequence's `balanced`)
  int64_t block = 256;
  torch::Dtype dtype = torch::kFloat;
};

struct Grads {
  Tensor out, dq, dk, dv;
};

// The inputs of a case, the same on every rank (seeded), and the upstream gradient.
std::vector<Tensor> ring_inputs(const RingCase& c) {
  torch::manual_seed(7);
  auto opts = torch::TensorOptions().dtype(c.dtype);
  auto q = torch::randn({c.batch, c.heads, c.length, c.d}, opts);
  auto k = torch::randn({c.batch, c.kv_heads, c.length, c.d}, opts);
  auto v = torch::randn({c.batch, c.kv_heads, c.length, c.dv}, opts);
  auto g = torch::randn({c.batch, c.heads, c.length, c.dv}, opts);
  // Padding at the end of the second sequence, and one padded key early in the first.
  auto padding = torch::zeros({c.batch, c.length}, torch::kBool);
  padding[c.batch - 1].narrow(0, c.length - c.length / 3, c.length / 3).fill_(true);
  padding[0][1] = true;
  return {q, k, v, g, padding};
}

Grads one_process(const RingCase& c) {
  auto in = ring_inputs(c);
  auto q = in[0].requires_grad_(), k = in[1].requires_grad_(), v = in[2].requires_grad_();
  auto options =
      F::ScaledDotProductAttentionOptions().is_causal(c.causal).backend(F::Backend::Math);
  if (c.padding) options.attn_mask(in[4].view({c.batch, 1, 1, c.length}));
  auto out = F::scaled_dot_product_attention(q, k, v, options).output;
  out.backward(in[3]);
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}

// The ring's output and gradients, each gathered back into the whole sequence.
Grads ring(const RingCase& c, const std::vector<Tensor>& in, const Group& group) {
  using attention::distributed::gather_sequence;
  using attention::distributed::shard_sequence;
  const bool balanced = c.balanced;
  auto shard = [&](const Tensor& t, int64_t dim) {
    return shard_sequence(t, dim, group, balanced).contiguous();
  };
  auto q = shard(in[0], 2).requires_grad_(), k = shard(in[1], 2).requires_grad_(),
       v = shard(in[2], 2).requires_grad_();
  auto options = attention::distributed::RingAttentionOptions()
                     .is_causal(c.causal)
                     .balanced(c.balanced)
                     .block_size(c.block);
  if (c.padding) options.key_padding_mask(shard(in[4], 1));
  auto out = attention::distributed::ring_attention(q, k, v, group, options);
  out.backward(shard(in[3], 2));
  auto gather = [&](const Tensor& t) { return gather_sequence(t, 2, group, balanced); };
  return {gather(out), gather(q.grad()), gather(k.grad()), gather(v.grad())};
}

void check_ring(const RingCase& c, int64_t world, double tolerance) {
  const Grads expected = one_process(c);
  // Drawn here: the threads share LibTorch's default generator.
  const auto inputs = ring_inputs(c);
  const auto ranks = run_ranks<Grads>(world, [&](const Group& g) { return ring(c, inputs, g); });
  for (int64_t r = 0; r < world; ++r) {
    INFO("rank " << r << " of " << world << ", causal " << c.causal << ", balanced " << c.balanced
                 << ", padding " << c.padding);
    CHECK(test::max_abs_diff(ranks[r].out, expected.out) <= tolerance);
    CHECK(test::max_abs_diff(ranks[r].dq, expected.dq) <= tolerance);
    CHECK(test::max_abs_diff(ranks[r].dk, expected.dk) <= tolerance);
    CHECK(test::max_abs_diff(ranks[r].dv, expected.dv) <= tolerance);
  }
}

}  // namespace

TEST_CASE("ring attention equals one process, forward and backward, on 1 to 4 ranks",
          "[distributed]") {
  for (int64_t world = 1; world <= 4; ++world) {
    for (bool causal : {false, true}) {
      for (bool balanced : {true, false}) {
        for (bool padding : {false, true}) {
          RingCase c;
          c.causal = causal;
          c.balanced = balanced;
          c.padding = padding;
          c.length = 48;  // 2 x 4 x 6: both splits of every world size here
          check_ring(c, world, 1e-5);
        }
      }
    }
  }
}

TEST_CASE("causal ring attention over the contiguous split: odd local lengths, GQA",
          "[distributed]") {
  RingCase c;
  c.balanced = false;
  c.length = 45;  // 15 positions per rank on 3 ranks, 9 on 5
  c.heads = 6;
  c.kv_heads = 2;
  c.block = 4;
  c.padding = true;
  check_ring(c, 3, 1e-5);
  check_ring(c, 5, 1e-5);
}

TEST_CASE("gather_sequence carries the gradient of a loss over the whole sequence",
          "[distributed]") {
  for (const bool causal : {true, false}) {
    RingCase c;
    c.causal = causal;
    const Grads expected = one_process(c);
    const auto in = ring_inputs(c);
    const auto ranks = run_ranks<Grads>(3, [&](const Group& g) {
      using attention::distributed::gather_sequence;
      using attention::distributed::shard_sequence;
      auto shard = [&](const Tensor& t) {
        return shard_sequence(t, 2, g, causal).contiguous().requires_grad_();
      };
      auto q = shard(in[0]), k = shard(in[1]), v = shard(in[2]);
      auto out = attention::distributed::ring_attention(
          q, k, v, g,
          attention::distributed::RingAttentionOptions().is_causal(causal).balanced(causal));
      // Every rank computes the same loss on the whole output.
      auto whole = gather_sequence(out, 2, g, causal);
      (whole * in[3]).sum().backward();
      auto gather = [&](const Tensor& t) { return gather_sequence(t, 2, g, causal); };
      return Grads{whole.detach(), gather(q.grad()), gather(k.grad()), gather(v.grad())};
    });
    for (const auto& r : ranks) {
      INFO("causal " << causal);
      CHECK(test::max_abs_diff(r.out, expected.out) <= 1e-5);
      CHECK(test::max_abs_diff(r.dq, expected.dq) <= 1e-5);
      CHECK(test::max_abs_diff(r.dk, expected.dk) <= 1e-5);
      CHECK(test::max_abs_diff(r.dv, expected.dv) <= 1e-5);
    }
  }
}

TEST_CASE("pad_to_split: ring attention over a length no split divides, cut back after",
          "[distributed]") {
  using attention::distributed::gather_sequence;
  using attention::distributed::pad_to_split;
  using attention::distributed::RingAttentionOptions;
  using attention::distributed::shard_sequence;
  struct Padded {
    Tensor out;
    int64_t length, padded_length;
  };
  for (const bool causal : {true, false}) {
    RingCase c;
    c.causal = causal;
    c.length = 50;  // 3 ranks: padded to 54 (balanced) and 51 (contiguous)
    const auto in = ring_inputs(c);
    const Grads expected = one_process(c);
    const auto ranks = run_ranks<Padded>(3, [&](const Group& g) {
      const auto padded = pad_to_split(in[0], 2, g, causal);
      auto part = [&](const Tensor& t) {
        return shard_sequence(pad_to_split(t, 2, g, causal).padded, 2, g, causal);
      };
      const auto& padding = padded.padding;
      const auto mask = shard_sequence(padding.expand({c.batch, padding.size(0)}), 1, g, causal);
      const auto out = attention::distributed::ring_attention(
          part(in[0]), part(in[1]), part(in[2]), g,
          RingAttentionOptions().is_causal(causal).balanced(causal).key_padding_mask(mask));
      return Padded{gather_sequence(out, 2, g, causal).narrow(2, 0, padded.length), padded.length,
                    padded.padded.size(2)};
    });
    for (const auto& r : ranks) {
      INFO("causal " << causal);
      CHECK(r.length == 50);
      CHECK(r.padded_length == (causal ? 54 : 51));
      CHECK(test::max_abs_diff(r.out, expected.out) <= 1e-5);
    }
  }
  run_ranks<int>(1, [](const Group& g) {
    // Already divisible: the same tensor, no padding.
    const auto x = torch::randn({2, 8, 3});
    const auto p = pad_to_split(x, 1, g, true);
    CHECK(p.padded.data_ptr() == x.data_ptr());
    CHECK(p.padding.sum().item<int64_t>() == 0);
    CHECK(pad_to_split(x, 0, g, true).padding.equal(torch::tensor({false, false})));
    CHECK(pad_to_split(x, 2, g, true).padding.equal(torch::tensor({false, false, false, true})));
    CHECK_THROWS_C10(pad_to_split(x, 3, g, true), c10::ValueError,
                     "attention::distributed::pad_to_split: expected dim in [-3, 3) for a tensor "
                     "of rank 3, got 3");
    CHECK_THROWS_C10(pad_to_split(torch::Tensor(), 0, g, true), c10::ValueError,
                     "expected a tensor of rank >= 1, got an undefined tensor");
    return 0;
  });
}

TEST_CASE("ring attention: long local blocks, GQA, double precision", "[distributed]") {
  RingCase c;
  c.length = 1200;  // 300 keys per chunk on 2 ranks: blocks of 128 do not divide them
  c.block = 128;
  c.heads = 6;
  c.kv_heads = 2;
  c.dv = 12;
  c.batch = 1;
  c.padding = true;
  check_ring(c, 2, 1e-5);
  c.dtype = torch::kDouble;
  c.length = 96;
  check_ring(c, 3, 1e-12);
}

TEST_CASE("ring attention: a problem that differs between ranks is refused on every rank",
          "[distributed]") {
  auto errors = run_ranks<std::string>(2, [](const Group& g) {
    const int64_t length = g.rank() == 0 ? 8 : 10;
    auto q = torch::ones({1, 2, length, 4});
    try {
      attention::distributed::ring_attention(q, q, q, g);
    } catch (const c10::ValueError& e) {
      return test::message(e);
    }
    return std::string("no error");
  });
  CHECK_THAT(errors[0], test::contains("every rank must pass the same sizes and options"));
  CHECK_THAT(errors[0], test::contains("rank 0 has [1, 2, 2, 8,"));
  CHECK_THAT(errors[0], test::contains("rank 1 has [1, 2, 2, 10,"));
  CHECK_THAT(errors[1], test::contains("every rank must pass the same sizes and options"));
}

TEST_CASE("ring attention: bad inputs are refused before any transfer", "[distributed]") {
  run_ranks<int>(1, [](const Group& g) {
    using attention::distributed::ring_attention;
    using attention::distributed::RingAttentionOptions;
    auto q = torch::randn({1, 4, 6, 8}), k = torch::randn({1, 3, 6, 8});
    CHECK_THROWS_C10(ring_attention(q.view({4, 6, 8}), q, q, g), c10::ValueError,
                     "expected query of rank 4 (B, heads, T_local, features), got (4, 6, 8)");
    CHECK_THROWS_C10(ring_attention(q, k, k, g), c10::ValueError,
                     "expected key and value with the same number of heads, dividing the "
                     "query's");
    CHECK_THROWS_C10(ring_attention(q, q.to(torch::kDouble), q, g), c10::TypeError,
                     "expected query, key and value of one dtype");
    CHECK_THROWS_C10(ring_attention(q.to(torch::kInt), q, q, g), c10::TypeError,
                     "expected query of dtype float or double, got (1, 4, 6, 8) Int");
    CHECK_THROWS_C10(ring_attention(q, q, q, g, RingAttentionOptions().is_causal(true)),
                     c10::ValueError,
                     "a causal call needs to know how the shards were made: set "
                     "RingAttentionOptions::balanced to shard_sequence's `balanced` (true or "
                     "false)");
    CHECK_THROWS_C10(ring_attention(q.narrow(2, 0, 5), q.narrow(2, 0, 5), q.narrow(2, 0, 5), g,
                                    RingAttentionOptions().is_causal(true).balanced(true)),
                     c10::ValueError,
                     "shards of the balanced split (an early and a late chunk per rank) have an "
                     "even local length; got 5");
    CHECK_THROWS_C10(
        ring_attention(q, q, q, g, RingAttentionOptions().key_padding_mask(torch::zeros({1, 6}))),
        c10::TypeError, "expected a bool key_padding_mask (true = padding)");
    CHECK_THROWS_C10(
        ring_attention(q, q, q, g,
                       RingAttentionOptions().key_padding_mask(torch::zeros({1, 5}, torch::kBool))),
        c10::ValueError, "expected key_padding_mask of shape (1, 6) for this rank's keys");
    CHECK_THROWS_C10(ring_attention(q, q, q, g, RingAttentionOptions().block_size(0)),
                     c10::ValueError, "expected a positive block_size, got 0");
    CHECK_THROWS_C10(attention::distributed::shard_sequence(q.narrow(2, 0, 5), 2, g, true),
                     c10::ValueError,
                     "expected a length along dim 2 divisible by 2 (2 x 1 ranks), got 5");
    CHECK_THROWS_C10(attention::distributed::shard_sequence(q, 4, g, false), c10::ValueError,
                     "expected dim in [-4, 4) for a tensor of rank 4, got 4");
    return 0;
  });
}

TEST_CASE("a rank that stops makes the others fail within the timeout, naming the transfer",
          "[distributed]") {
  const auto start = std::chrono::steady_clock::now();
  auto errors = run_ranks<std::vector<std::string>>(
      3,
      [](const Group& g) -> std::vector<std::string> {
        if (g.rank() == 2) return {"stopped"};  // leaves without taking part
        auto q = torch::ones({1, 2, 8, 4});
        std::vector<std::string> messages;
        for (int i = 0; i < 2; ++i) {
          try {
            attention::distributed::ring_attention(q, q, q, g);
            messages.push_back("no error");
          } catch (const c10::Error& e) {
            messages.push_back(test::message(e));
          }
        }
        return messages;
      },
      std::chrono::milliseconds(3000));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(seconds < 20.0);
  // The survivors' writes to the stopped rank raise SIGPIPE, which the group ignores: an error
  // to report, not the end of the process.
  struct sigaction action {};
  REQUIRE(sigaction(SIGPIPE, nullptr, &action) == 0);
  CHECK(action.sa_handler == SIG_IGN);
  for (int r = 0; r < 2; ++r) {
    REQUIRE(errors[r].size() == 2);
    INFO(errors[r][0]);
    CHECK_THAT(errors[r][0], test::contains("attention::distributed::ring_attention: rank " +
                                            std::to_string(r) + " of 3 failed while"));
    CHECK_THAT(errors[r][0], test::contains("the check that every rank has the same sizes"));
    CHECK_THAT(errors[r][0], test::contains("rank 2 has closed its connection"));
    CHECK_THAT(errors[r][0], test::contains("The group cannot be used any more"));
    CHECK(errors[r][0].find("Exception raised from") == std::string::npos);
    // The group says so at once on the next call.
    CHECK_THAT(errors[r][1], test::contains("this group failed earlier and cannot be used any "
                                            "more (make a new one)"));
  }
}

TEST_CASE("an input one rank refuses stops every rank at once, with the same message",
          "[distributed]") {
  namespace dist = attention::distributed;
  const std::string path = "distributed_refusal.safetensors";
  attention::save_weights(
      *attention::MultiHeadAttention(attention::MultiHeadAttentionOptions(6, 6, 3)), path);
  // The group's timeout is far above the time allowed: no rank may wait it out.
  const auto start = std::chrono::steady_clock::now();
  const auto results = run_ranks<std::vector<std::string>>(
      3,
      [&](const Group& g) {
        std::vector<std::string> messages;
        const auto record = [&](const std::function<void()>& call) {
          try {
            call();
            messages.push_back("no error");
          } catch (const c10::Error& e) {
            messages.push_back(test::message(e));
          }
        };
        const auto q = torch::ones({1, 2, 12, 4});
        // Rank 1's query has the wrong rank: it refuses, and so must the others.
        record([&] { dist::ring_attention(g.rank() == 1 ? q.view({2, 12, 4}) : q, q, q, g); });
        // The group stays in step: the next call works on every rank.
        messages.push_back(std::to_string(dist::ring_attention(q, q, q, g).size(2)));
        // A weight file one rank cannot read.
        record([&] {
          dist::load_sharded(g.rank() == 2 ? "no_such_file.safetensors" : path,
                             attention::MultiHeadAttentionOptions(6, 6, 3), g);
        });
        // A gather one rank refuses (a dim its shard does not have).
        record([&] { dist::gather_sequence(q, g.rank() == 0 ? 4 : 2, g, false); });
        // A head-parallel input one rank refuses (7 features where the module takes 6).
        dist::HeadParallelMultiHeadAttention part(attention::MultiHeadAttentionOptions(6, 6, 3), g);
        record([&] { part->forward(torch::ones({1, 3, g.rank() == 2 ? 7 : 6})); });
        record([&] { part->forward(torch::ones({1, 3, 6})); });
        return messages;
      },
      std::chrono::seconds(60));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(seconds < 20.0);
  std::remove(path.c_str());
  REQUIRE(results[0].size() == 6);
  for (const auto& r : results) CHECK(r == results[0]);
  CHECK_THAT(results[0][0],
             test::contains("attention::distributed::ring_attention: rank 1 of 3 failed, so "
                            "every rank stops here. Rank 1: "));
  CHECK_THAT(results[0][0], test::contains("expected query of rank 4"));
  CHECK(results[0][1] == "12");
  CHECK_THAT(results[0][2], test::contains("attention::distributed::load_sharded: rank 2 of 3 "
                                           "failed, so every rank stops here. Rank 2: "));
  CHECK_THAT(results[0][2], test::contains("no_such_file.safetensors"));
  CHECK_THAT(results[0][3], test::contains("attention::distributed::gather_sequence: rank 0 of 3 "
                                           "failed, so every rank stops here. Rank 0: "));
  CHECK_THAT(results[0][3], test::contains("expected dim in [-4, 4)"));
  CHECK_THAT(results[0][4], test::contains("HeadParallelMultiHeadAttention: rank 2 of 3 failed, so "
                                           "every rank stops here. Rank 2: "));
  CHECK(results[0][5] == "no error");
}

TEST_CASE("check_same: many values, and errors of other types, reach every rank alike",
          "[distributed]") {
  // More values than fit the first exchange: the second carries them.
  auto errors = run_ranks<std::string>(3, [](const Group& g) -> std::string {
    std::vector<int64_t> values(40, 7);
    if (g.rank() == 2) values[39] = 8;
    try {
      g.check_same(values, "many values", "test");
    } catch (const c10::ValueError& e) {
      return test::message(e);
    }
    return "no error";
  });
  for (const auto& e : errors) {
    CHECK(e == errors[0]);
    CHECK_THAT(e, test::contains("test: every rank must pass the same many values; rank 0 has "
                                 "[7, 7,"));
    CHECK_THAT(e, test::contains("rank 2 has [7, "));
    CHECK_THAT(e, test::contains(", 8]"));
  }
  // A type error on one rank arrives as a type error on every rank.
  const auto types = run_ranks<std::string>(2, [](const Group& g) -> std::string {
    std::exception_ptr error;
    if (g.rank() == 0) {
      try {
        TORCH_CHECK_TYPE(false, "rank zero's own type error");
      } catch (...) {
        error = std::current_exception();
      }
    }
    try {
      g.check_same({1, 2}, "values", "test", error);
    } catch (const c10::TypeError& e) {
      return test::message(e);
    }
    return "no type error";
  });
  CHECK(types[0] == types[1]);
  CHECK_THAT(types[1], test::contains("Rank 0: rank zero's own type error"));
}

TEST_CASE("Group::all_gather and all_reduce_sum refuse shapes that differ between ranks",
          "[distributed]") {
  auto errors = run_ranks<std::string>(2, [](const Group& g) -> std::string {
    try {
      g.all_gather(torch::ones({g.rank() + 1}), "test");
    } catch (const c10::ValueError& e) {
      return test::message(e);
    }
    return "no error";
  });
  CHECK(errors[0] == errors[1]);
  CHECK_THAT(errors[0], test::contains("test: every rank must pass the same dtype and shape of "
                                       "the tensor to gather; rank 0 has [6, 1], rank 1 has [6, "
                                       "2]"));
  errors = run_ranks<std::string>(3, [](const Group& g) -> std::string {
    auto t = torch::full({5}, static_cast<double>(g.rank()), torch::kDouble);
    g.all_reduce_sum(t, "test");
    TORCH_CHECK(torch::equal(t, torch::full({5}, 3.0, torch::kDouble)), "wrong sum ", t);
    auto bad = g.rank() == 1 ? torch::ones({4, 4}).t() : torch::ones({4, 4});
    try {
      g.all_reduce_sum(bad, "test");
    } catch (const c10::ValueError& e) {
      return test::message(e);
    }
    return "no error";
  });
  for (const auto& e : errors) {
    CHECK(e == errors[0]);
    CHECK_THAT(e, test::contains("test: rank 1 of 3 failed, so every rank stops here. Rank 1: "
                                 "test: all_reduce_sum expected a contiguous tensor"));
  }
}

TEST_CASE("Group::from_env names what torchrun should have set", "[distributed]") {
  for (const char* name :
       {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE"}) {
    unsetenv(name);
  }
  CHECK_THROWS_C10(Group::from_env(), c10::ValueError,
                   "Group::from_env: the environment variable WORLD_SIZE is not set");
  setenv("WORLD_SIZE", "2", 1);
  setenv("RANK", "2", 1);
  CHECK_THROWS_C10(Group::from_env(), c10::ValueError,
                   "expected RANK to be an integer in [0, 1], got '2'");
  setenv("RANK", "1", 1);
  setenv("MASTER_PORT", "http", 1);
  CHECK_THROWS_C10(Group::from_env(), c10::ValueError,
                   "expected MASTER_PORT to be an integer in [1, 65535], got 'http'");
  setenv("MASTER_PORT", "29500", 1);
  CHECK_THROWS_C10(Group::from_env(), c10::ValueError,
                   "the environment variable MASTER_ADDR is not set");
  for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_PORT"}) unsetenv(name);
}

namespace {

struct ModuleCase {
  int64_t heads, kv_heads, world;
};

struct ModuleResult {
  Tensor y, dx;
  std::vector<Tensor> grads;  // gathered to full shapes: W_query, W_key, W_value, out_proj
  Tensor gathered_query;
};

attention::MultiHeadAttentionOptions module_options(const ModuleCase& c) {
  return attention::MultiHeadAttentionOptions(12, 4 * c.heads, c.heads)
      .num_kv_heads(c.kv_heads)
      .qkv_bias(true);
}

Tensor module_input() {
  torch::manual_seed(3);
  return torch::randn({2, 9, 12});
}

}  // namespace

TEST_CASE("head-parallel MultiHeadAttention equals the full module, forward and backward",
          "[distributed]") {
  for (const ModuleCase c : {ModuleCase{4, 2, 1}, ModuleCase{4, 2, 2}, ModuleCase{6, 3, 3},
                             ModuleCase{8, 4, 4}, ModuleCase{8, 2, 2}}) {
    INFO(c.heads << " heads, " << c.kv_heads << " key/value heads, " << c.world << " ranks");
    torch::manual_seed(11);
    attention::MultiHeadAttention full(module_options(c));
    auto x = module_input().requires_grad_();
    auto y = full->forward(x).output;
    const auto upstream = torch::randn_like(y);
    y.backward(upstream);

    const auto ranks = run_ranks<ModuleResult>(c.world, [&](const Group& g) {
      auto part = attention::distributed::shard_heads(*full, g);
      auto x_r = x.detach().clone().requires_grad_();
      auto y_r = part->forward(x_r).output;
      y_r.backward(upstream);
      ModuleResult result{y_r.detach(), x_r.grad(), {}, {}};
      for (const auto& [linear, dim] : {std::pair{part->W_query, 0},
                                        {part->W_key, 0},
                                        {part->W_value, 0},
                                        {part->out_proj, 1}}) {
        result.grads.push_back(torch::cat(g.all_gather(linear->weight.grad(), "test"), dim));
      }
      result.gathered_query = part->gather()->W_query->weight.detach();
      return result;
    });
    const std::vector<Tensor> expected{full->W_query->weight.grad(), full->W_key->weight.grad(),
                                       full->W_value->weight.grad(), full->out_proj->weight.grad()};
    for (const auto& r : ranks) {
      CHECK(test::max_abs_diff(r.y, y) <= 1e-5);
      CHECK(test::max_abs_diff(r.dx, x.grad()) <= 1e-5);
      for (size_t i = 0; i < expected.size(); ++i) {
        CHECK(test::max_abs_diff(r.grads[i], expected[i]) <= 1e-5);
      }
      CHECK(torch::equal(r.gathered_query, full->W_query->weight.detach()));
    }
  }
}

TEST_CASE("head-parallel decoding with a KV cache per rank equals the full forward",
          "[distributed]") {
  torch::manual_seed(5);
  const ModuleCase c{4, 2, 2};
  attention::MultiHeadAttention full(module_options(c));
  const auto x = module_input();
  const auto expected = full->forward(x).output.detach();
  const auto ranks = run_ranks<Tensor>(2, [&](const Group& g) {
    auto part = attention::distributed::shard_heads(*full, g);
    torch::NoGradGuard no_grad;
    attention::KVCache cache(16);
    std::vector<Tensor> steps;
    for (int64_t t = 0; t < x.size(1); ++t) {
      steps.push_back(part->forward(x.narrow(1, t, 1),
                                    attention::MultiHeadAttentionForwardOptions().kv_cache(&cache))
                          .output);
    }
    return torch::cat(steps, 1);
  });
  for (const auto& r : ranks) CHECK(test::max_abs_diff(r, expected) <= 1e-5);
}

TEST_CASE("head-parallel: each rank loads its share of a full weight file", "[distributed]") {
  torch::manual_seed(9);
  const ModuleCase c{4, 2, 2};
  attention::MultiHeadAttention full(module_options(c));
  const std::string path = "distributed_full.safetensors";
  attention::save_weights(*full, path);
  const auto x = module_input();
  const auto expected = full->forward(x).output.detach();
  const auto ranks = run_ranks<Tensor>(2, [&](const Group& g) {
    auto part = attention::distributed::load_sharded(path, module_options(c), g);
    return part->forward(x).output.detach();
  });
  for (const auto& r : ranks) CHECK(test::max_abs_diff(r, expected) <= 1e-5);
  std::remove(path.c_str());
}

TEST_CASE("head-parallel: heads that the ranks cannot split, and weights, are refused",
          "[distributed]") {
  auto errors = run_ranks<std::vector<std::string>>(2, [](const Group& g) {
    std::vector<std::string> messages;
    try {
      attention::distributed::HeadParallelMultiHeadAttention(
          attention::MultiHeadAttentionOptions(8, 12, 3), g);
    } catch (const c10::ValueError& e) {
      messages.push_back(test::message(e));
    }
    attention::distributed::HeadParallelMultiHeadAttention part(
        attention::MultiHeadAttentionOptions(8, 8, 2), g);
    try {
      part->forward(torch::ones({1, 3, 8}),
                    attention::MultiHeadAttentionForwardOptions().need_weights(true));
    } catch (const c10::ValueError& e) {
      messages.push_back(test::message(e));
    }
    try {
      part->forward(torch::ones({1, 3, 7}));
    } catch (const c10::ValueError& e) {
      messages.push_back(test::message(e));
    }
    return messages;
  });
  REQUIRE(errors[0].size() == 3);
  CHECK_THAT(errors[0][0], test::contains("expected the 2 ranks to divide num_heads and "
                                          "num_kv_heads, got num_heads 3 and num_kv_heads 3"));
  CHECK_THAT(errors[0][1], test::contains("need_weights is not available here"));
  CHECK_THAT(errors[0][2], test::contains("attention::MultiHeadAttention"));
}
