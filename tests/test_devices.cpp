// Tensors on different devices, at every public entry point: each call is first made with every
// tensor on the CPU (it must work, so that what follows is about the device alone), then once per
// tensor with that one tensor on the meta device. Every such call must be refused with a c10::Error
// that names the function and the meta device, before it computes anything: never a result of
// the right shape and undefined values (a meta tensor has no data, so any read of it is a bug).
// The operators are called through the dispatcher, which picks the kernel by the highest device
// among the tensors (meta above the CPU): their CPU, Meta and Autograd kernels alike.

#include <attention/attention.h>

#include "helpers.h"
#include "operators/kernels.h"

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

namespace {

namespace F = attention::functional;
namespace ops = attention::operators;
using Tensors = std::vector<torch::Tensor>;

struct DeviceEntry {
  std::string name;    // what the test prints
  std::string caller;  // what the message must name
  Tensors tensors;     // every tensor the call takes, on the CPU
  std::function<void(const Tensors&)> call;
};

torch::Tensor longs(std::vector<int64_t> values) {
  return torch::tensor(values, torch::kLong);
}

template <typename Signature>
c10::TypedOperatorHandle<Signature> op(const char* name) {
  attention::register_operators();
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

std::vector<DeviceEntry> functional_entries() {
  using O = F::ScaledDotProductAttentionOptions;
  const auto q = torch::randn({2, 2, 5, 4}), k = torch::randn({2, 2, 6, 4}),
             v = torch::randn({2, 2, 6, 3});
  const auto packed_q = torch::randn({7, 2, 4}), packed_k = torch::randn({9, 1, 4});
  const auto pages = torch::randn({3, 1, 4, 4});
  const auto codes = torch::randint(-127, 128, {3, 1, 4, 4}, torch::kChar);
  const auto scales = torch::rand({3, 1, 4});
  const auto paged_q = torch::randn({4, 2, 4});
  return {
      {"sdpa",
       "scaled_dot_product_attention",
       {q, k, v},
       [](const Tensors& t) { F::scaled_dot_product_attention(t[0], t[1], t[2]); }},
      {"sdpa with a mask, sinks and ALiBi",
       "scaled_dot_product_attention",
       {q, k, v, torch::randn({5, 6}), torch::randn({2}), F::alibi_slopes(2).to(torch::kFloat)},
       [](const Tensors& t) {
         F::scaled_dot_product_attention(t[0], t[1], t[2],
                                         O().attn_mask(t[3]).sinks(t[4]).alibi_slopes(t[5]));
       }},
      {"sdpa with a relative bias",
       "scaled_dot_product_attention",
       {q, k, v, torch::randn({5, 2})},
       [](const Tensors& t) {
         F::scaled_dot_product_attention(
             t[0], t[1], t[2],
             O().relative_bias(t[3]).relative_buckets(F::RelativeBuckets::distance(2)));
       }},
      {"projected_attention",
       "projected_attention",
       {torch::randn({6, 3}), torch::randn({6, 3}), torch::randn({3, 2}), torch::randn({3, 2}),
        torch::randn({3, 4})},
       [](const Tensors& t) { F::projected_attention(t[0], t[1], t[2], t[3], t[4]); }},
      {"varlen_attention",
       "varlen_attention",
       {packed_q, packed_k, packed_k, longs({0, 3, 7}), longs({0, 4, 9})},
       [](const Tensors& t) { F::varlen_attention(t[0], t[1], t[2], t[3], t[4]); }},
      {"paged_attention",
       "paged_attention",
       {paged_q, pages, pages, longs({0, 1, 4}), longs({6, 3}), longs({2, 0, 1, -1}).view({2, 2})},
       [](const Tensors& t) { F::paged_attention(t[0], t[1], t[2], t[3], t[4], t[5]); }},
      {"paged_attention over 8-bit pages",
       "paged_attention",
       {paged_q, codes, scales, codes, scales, longs({0, 1, 4}), longs({6, 3}),
        longs({2, 0, 1, -1}).view({2, 2})},
       [](const Tensors& t) {
         F::paged_attention(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]);
       }},
      {"apply_rotary",
       "apply_rotary",
       {torch::randn({2, 5, 8}), torch::arange(5)},
       [](const Tensors& t) { F::apply_rotary(t[0], t[1]); }},
      {"gated_delta_rule",
       "gated_delta_rule",
       {torch::randn({1, 2, 5, 4}), torch::randn({1, 2, 5, 4}), torch::randn({1, 2, 5, 3}),
        -torch::rand({1, 2, 5}), torch::rand({1, 2, 5}), torch::zeros({1, 2, 4, 3})},
       [](const Tensors& t) {
         F::gated_delta_rule(t[0], t[1], t[2], t[3], t[4],
                             F::GatedDeltaRuleOptions().initial_state(t[5]));
       }},
      {"sparse_attention",
       "sparse_attention",
       {torch::randn({1, 2, 3, 4}), torch::randn({1, 2, 3, 4}), torch::randn({1, 2, 3, 4}),
        longs({0, -1, 0, 1, 1, 2}).view({1, 3, 2})},
       [](const Tensors& t) { F::sparse_attention(t[0], t[1], t[2], t[3]); }},
  };
}

std::vector<DeviceEntry> module_and_cache_entries() {
  using attention::MultiHeadAttentionForwardOptions;
  using attention::MultiHeadAttentionOptions;
  auto mha = attention::MultiHeadAttention(MultiHeadAttentionOptions(8, 8, 2).causal(false));
  auto cross =
      attention::MultiHeadAttention(MultiHeadAttentionOptions(8, 8, 2).d_in_kv(4).causal(false));
  auto mla = attention::MultiHeadLatentAttention(8, 8, 2);
  auto delta_net = attention::GatedDeltaNet(8, 8, 2);
  auto sparse = attention::DeepSeekSparseAttention(
      attention::DeepSeekSparseAttentionOptions(8, 8, 2).index_head_dim(4).topk(3));
  auto sa = attention::SelfAttention(3, 2, 4);
  const auto x = torch::randn({2, 5, 8});
  return {
      {"SelfAttention",
       "SelfAttention",
       {torch::randn({6, 3})},
       [sa](const Tensors& t) mutable { sa(t[0]); }},
      {"MultiHeadAttention with masks",
       "MultiHeadAttention",
       {x, torch::zeros({5, 5}), torch::zeros({2, 5}, torch::kBool)},
       [mha](const Tensors& t) mutable {
         mha(t[0], MultiHeadAttentionForwardOptions().attn_mask(t[1]).key_padding_mask(t[2]));
       }},
      {"MultiHeadAttention with a context",
       "MultiHeadAttention",
       {x, torch::randn({2, 7, 4})},
       [cross](const Tensors& t) mutable {
         cross(t[0], MultiHeadAttentionForwardOptions().context(t[1]));
       }},
      {"KVCache",
       "KVCache",
       {torch::randn({1, 2, 3, 4}), torch::randn({1, 2, 3, 4}), torch::randn({1, 2, 1, 4}),
        torch::randn({1, 2, 1, 4})},
       [](const Tensors& t) {
         attention::KVCache cache(8);
         cache.append(t[0], t[1]);
         cache.append(t[2], t[3]);
       }},
      {"8-bit KVCache",
       "KVCache",
       {torch::randn({1, 2, 3, 4}), torch::randn({1, 2, 3, 4}), torch::randn({1, 2, 1, 4}),
        torch::randn({1, 2, 1, 4})},
       [](const Tensors& t) {
         attention::KVCache cache(8, torch::kChar);
         cache.append(t[0], t[1]);
         cache.append(t[2], t[3]);
       }},
      {"MultiHeadLatentAttention",
       "MultiHeadLatentAttention",
       {x},
       [mla](const Tensors& t) mutable { mla(t[0]); }},
      {"GatedDeltaNet",
       "GatedDeltaNet",
       {x},
       [delta_net](const Tensors& t) mutable { delta_net(t[0]); }},
      {"DeepSeekSparseAttention",
       "DeepSeekSparseAttention",
       {x},
       [sparse](const Tensors& t) mutable { sparse(t[0]); }},
      {"SlidingKVCache",
       "SlidingKVCache",
       {torch::randn({1, 2, 3, 4}), torch::randn({1, 2, 3, 4}), torch::randn({1, 2, 1, 4}),
        torch::randn({1, 2, 1, 4})},
       [](const Tensors& t) {
         attention::SlidingKVCache cache(4);
         cache.append(t[0], t[1]);
         cache.append(t[2], t[3]);
       }},
      {"LatentCache",
       "LatentCache",
       {torch::randn({1, 3, 4}), torch::randn({1, 1, 4})},
       [](const Tensors& t) {
         attention::LatentCache cache(8);
         cache.append(t[0]);
         cache.append(t[1]);
       }},
      {"PagedKVCache::write",
       "PagedKVCache",
       {torch::randn({3, 2, 4}), torch::randn({3, 2, 4})},
       [](const Tensors& t) {
         attention::PagedKVCache cache(attention::PagedKVCacheOptions(4, 4, 2, 4));
         const int64_t s = cache.add_sequence();
         cache.write(0, cache.extend({s}, {3}), t[0], t[1]);
       }},
  };
}

std::vector<DeviceEntry> operator_entries() {
  const auto q = torch::randn({1, 2, 5, 4}), k = torch::randn({1, 2, 6, 4}),
             v = torch::randn({1, 2, 6, 4});
  const auto packed_q = torch::randn({7, 2, 4}), packed_k = torch::randn({9, 1, 4});
  const auto sdpa = op<decltype(ops::attention_cpu)>("attention::scaled_dot_product_attention");
  const auto varlen = op<decltype(ops::varlen_cpu)>("attention::varlen_attention");
  const auto forward = op<decltype(ops::fused_forward_cpu)>("attention::_fused_attention_forward");
  const auto backward =
      op<decltype(ops::fused_backward_cpu)>("attention::_fused_attention_backward");
  const auto rotary = op<decltype(ops::apply_rotary)>("attention::apply_rotary");
  const auto [out, lse] =
      forward.call(q, k, v, {}, {}, {}, true, "bottom_right", {}, {}, {}, {}, {}, {}, 256);
  return {
      {"operator scaled_dot_product_attention",
       "attention::scaled_dot_product_attention",
       {q, k, v, torch::randn({5, 6}), F::alibi_slopes(2).to(torch::kFloat), torch::randn({2})},
       [sdpa](const Tensors& t) {
         sdpa.call(t[0], t[1], t[2], t[3], false, "bottom_right", {}, {}, t[4], {}, t[5], {}, 0.0,
                   "auto", 256);
       }},
      {"operator scaled_dot_product_attention, with gradients",
       "attention::scaled_dot_product_attention",
       {q.clone().requires_grad_(), k.clone().requires_grad_(), v.clone().requires_grad_()},
       [sdpa](const Tensors& t) {
         sdpa.call(t[0], t[1], t[2], {}, true, "bottom_right", {}, {}, {}, {}, {}, {}, 0.0, "auto",
                   256);
       }},
      {"operator varlen_attention",
       "attention::varlen_attention",
       {packed_q, packed_k, packed_k, longs({0, 3, 7}), longs({0, 4, 9})},
       [varlen](const Tensors& t) {
         varlen.call(t[0], t[1], t[2], t[3], t[4], true, "bottom_right", {}, {}, {}, {}, {}, {},
                     0.0, "auto", 256);
       }},
      {"operator _fused_attention_forward",
       "attention::scaled_dot_product_attention",
       {q, k, v, torch::randn({5, 6})},
       [forward](const Tensors& t) {
         forward.call(t[0], t[1], t[2], {}, {}, t[3], false, "bottom_right", {}, {}, {}, {}, {}, {},
                      256);
       }},
      {"operator _fused_attention_backward",
       "attention::scaled_dot_product_attention",
       {torch::randn_like(out), q, k, v, out, lse},
       [backward](const Tensors& t) {
         backward.call(t[0], t[1], t[2], t[3], t[4], t[5], {}, {}, {}, true, "bottom_right", {}, {},
                       {}, {}, {}, {}, 256);
       }},
      {"operator apply_rotary",
       "apply_rotary",
       {torch::randn({2, 5, 8}), torch::arange(5)},
       [rotary](const Tensors& t) { rotary.call(t[0], t[1], 10000.0, 0, "half_split"); }},
  };
}

void check_each_tensor_on_meta(const DeviceEntry& entry) {
  INFO(entry.name);
  REQUIRE_NOTHROW(entry.call(entry.tensors));
  for (size_t i = 0; i < entry.tensors.size(); ++i) {
    INFO("tensor " << i << " on the meta device");
    auto moved = entry.tensors;
    moved[i] = moved[i].detach().to(torch::kMeta).requires_grad_(moved[i].requires_grad());
    bool refused = false;
    try {
      entry.call(moved);
    } catch (const c10::Error& e) {
      refused = true;
      const std::string message = e.what_without_backtrace();
      INFO(message);
      CHECK(message.find(entry.caller) != std::string::npos);
      CHECK(message.find("meta") != std::string::npos);
    }
    CHECK(refused);
  }
}

}  // namespace

TEST_CASE("devices: every function refuses a tensor on another device, naming it",
          "[devices][errors]") {
  for (const auto& entry : functional_entries()) check_each_tensor_on_meta(entry);
}

TEST_CASE("devices: every module and cache refuses a tensor on another device, naming it",
          "[devices][errors]") {
  torch::NoGradGuard no_grad;
  for (const auto& entry : module_and_cache_entries()) check_each_tensor_on_meta(entry);
}

TEST_CASE("devices: every operator kernel refuses a tensor on another device, naming it",
          "[devices][errors][operators]") {
  for (const auto& entry : operator_entries()) check_each_tensor_on_meta(entry);
}

TEST_CASE("devices: the operators on meta tensors alone give meta tensors of the right shape",
          "[devices][operators]") {
  // What torch.compile's fake tensors and torch.export rely on: the Meta kernels.
  const auto sdpa = op<decltype(ops::attention_cpu)>("attention::scaled_dot_product_attention");
  const auto meta = [](std::vector<int64_t> shape) { return torch::empty(shape, torch::kMeta); };
  const auto out =
      sdpa.call(meta({1, 2, 5, 4}), meta({1, 2, 6, 4}), meta({1, 2, 6, 3}), meta({5, 6}), false,
                "bottom_right", {}, {}, {}, {}, {}, {}, 0.0, "auto", 256);
  CHECK(out.device().is_meta());
  CHECK(out.sizes() == c10::IntArrayRef({1, 2, 5, 3}));
}
