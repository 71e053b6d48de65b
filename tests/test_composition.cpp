// The modules inside LibTorch's containers: Sequential, ModuleList, ModuleDict and AnyModule
// (MultiHeadAttention's options argument has a default there, as LibTorch declares its own), and
// clone() as an independent deep copy.

#include <attention/attention.h>

#include "helpers.h"

#include <torch/torch.h>

using attention::functional::AttentionOutput;

namespace {

// Sets every parameter of `module` to `value`.
void fill_parameters(torch::nn::Module& module, double value) {
  torch::NoGradGuard no_grad;
  for (auto& p : module.parameters()) p.fill_(value);
}

}  // namespace

TEST_CASE("the Tensor-to-Tensor modules chain in Sequential and print as LibTorch's do",
          "[composition]") {
  torch::manual_seed(11);
  torch::nn::Sequential chain(torch::nn::Linear(5, 3), attention::SelfAttention(3, 2, 4),
                              attention::CausalSelfAttention(4, 2, 4),
                              attention::MultiHeadAttentionWrapper(4, 2, 3, 2));
  const auto x = torch::randn({6, 5});
  auto expected = chain[0]->as<torch::nn::Linear>()->forward(x);
  expected = chain[1]->as<attention::SelfAttention>()->forward(expected);
  expected = chain[2]->as<attention::CausalSelfAttention>()->forward(expected);
  expected = chain[3]->as<attention::MultiHeadAttentionWrapper>()->forward(expected);
  CHECK(torch::equal(chain->forward(x), expected));
  CHECK(expected.sizes() == c10::IntArrayRef({6, 6}));

  std::ostringstream printed;
  printed << *chain;
  CHECK_THAT(printed.str(), test::contains("(1): attention::SelfAttention("));
  CHECK_THAT(printed.str(), test::contains("(3): attention::MultiHeadAttentionWrapper("));
  // Parameter names as Python's nn.Sequential gives them, so weights move by name.
  CHECK(chain->named_parameters().contains("1.W_query"));
  CHECK(chain->named_parameters().contains("3.heads.1.W_value"));
}

TEST_CASE("MultiHeadAttention and CrossAttention in AnyModule, ModuleList and ModuleDict",
          "[composition]") {
  torch::manual_seed(12);
  auto mha = attention::MultiHeadAttention(8, 8, 2);
  auto cross = attention::CrossAttention(attention::CrossAttentionOptions(8, 4, 6).d_in_kv(3));
  const auto x = torch::randn({2, 5, 8}), context = torch::randn({2, 7, 3});

  torch::nn::AnyModule any_mha(mha);
  // forward(x) alone: the options argument takes its declared default.
  CHECK(torch::equal(any_mha.forward<AttentionOutput>(x).output, mha(x).output));
  CHECK(torch::equal(
      any_mha.forward<AttentionOutput>(x, attention::MultiHeadAttentionForwardOptions()).output,
      mha(x).output));
  torch::nn::AnyModule any_cross(cross);
  CHECK(torch::equal(any_cross.forward(x, context), cross(x, context)));

  torch::nn::ModuleList list(mha, cross);
  CHECK(list->size() == 2);
  CHECK(
      torch::equal(list[0]->as<attention::MultiHeadAttention>()->forward(x).output, mha(x).output));
  CHECK(list->named_parameters().contains("0.W_query.weight"));
  CHECK(list->named_parameters().contains("1.W_key"));

  torch::nn::ModuleDict dict(
      std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>>{
          {"self", mha.ptr()}, {"cross", cross.ptr()}});
  CHECK(torch::equal(dict["cross"]->as<attention::CrossAttention>()->forward(x, context),
                     cross(x, context)));
  CHECK(dict->named_parameters().contains("self.out_proj.bias"));
}

TEST_CASE("clone() gives an independent deep copy of every module", "[composition]") {
  torch::manual_seed(13);
  const auto x = torch::randn({2, 5, 8});
  const auto check = [&](auto module, auto run) {
    const auto before = run(*module, x);
    auto copy = std::dynamic_pointer_cast<typename decltype(module)::Impl>(module->clone());
    REQUIRE(copy);
    CHECK(torch::equal(run(*copy, x), before));
    fill_parameters(*module, 0.5);  // the original changes; the copy must not
    CHECK(torch::equal(run(*copy, x), before));
    CHECK_FALSE(torch::equal(run(*module, x), before));
    for (const auto& p : copy->named_parameters()) {
      INFO(p.key());
      CHECK(p.value().data_ptr() != module->named_parameters()[p.key()].data_ptr());
    }
  };
  check(attention::SelfAttention(8, 4, 6), [](auto& m, const auto& in) { return m.forward(in); });
  check(attention::CausalSelfAttention(8, 4, 6),
        [](auto& m, const auto& in) { return m.forward(in); });
  check(attention::MultiHeadAttentionWrapper(8, 4, 3, 2),
        [](auto& m, const auto& in) { return m.forward(in); });
  check(attention::CrossAttention(8, 4, 6),
        [](auto& m, const auto& in) { return m.forward(in, in * 2); });
  check(
      attention::MultiHeadAttention(attention::MultiHeadAttentionOptions(8, 8, 4).num_kv_heads(2)),
      [](auto& m, const auto& in) { return m.forward(in).output; });
}
