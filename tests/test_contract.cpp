// The attention contract (docs/CONTRACT.md) as one table: each input class, run on every backend
// with and without autograd, must give Math's numbers (computed in float64), or the error the
// table names. A backend that disagrees fails here, whichever class it is.

#include <attention/functional.h>

#include "helpers.h"

#include <torch/torch.h>

#include <functional>
#include <limits>
#include <optional>

namespace F = attention::functional;
using F::Backend;
using Options = F::ScaledDotProductAttentionOptions;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct ContractInputs {
  torch::Tensor q, k, v;
  Options options;
  bool mask_grad = false;  // the float mask takes part in autograd
};

// One row of the table. `refuses` names, for a backend, the fragment of the error it must raise
// (nullopt: it must match Math). Math in float64 is the reference unless the class depends on
// its dtype's range (overflow), where Math in the class's dtype is.
struct Class {
  const char* name;
  std::function<ContractInputs()> make;
  std::function<std::optional<std::string>(Backend, bool grad)> refuses = nullptr;
  bool reference_in_dtype = false;
};

torch::Tensor randn(std::vector<int64_t> shape, torch::Dtype dtype = torch::kFloat) {
  return torch::randn(shape, torch::TensorOptions().dtype(dtype));
}

ContractInputs qkv(std::vector<int64_t> q, std::vector<int64_t> k, int64_t dv,
                   torch::Dtype dtype = torch::kFloat) {
  auto v = k;
  v.back() = dv;
  return {randn(q, dtype), randn(k, dtype), randn(v, dtype), Options()};
}

ContractInputs with(ContractInputs in, const std::function<void(ContractInputs&)>& change) {
  change(in);
  return in;
}

std::optional<std::string> none(Backend, bool) {
  return std::nullopt;
}

std::optional<std::string> finite_qk_only_on_native(Backend b, bool) {
  if (b == Backend::Native) return std::string("the Native backend cannot take non-finite");
  return std::nullopt;
}

std::optional<std::string> mask_gradient_not_on_chunked(Backend b, bool grad) {
  if (b == Backend::Chunked && grad) return std::string("does not differentiate attn_mask");
  return std::nullopt;
}

std::vector<Class> table() {
  const auto causal = [](ContractInputs in) {
    return with(in, [](ContractInputs& x) { x.options.is_causal(true); });
  };
  return {
      {"rank 2",
       [] {
         return qkv({5, 4}, {7, 4}, 3);
       }},
      {"rank 3",
       [] {
         return qkv({3, 5, 4}, {3, 7, 4}, 3);
       }},
      {"rank 4",
       [] {
         return qkv({2, 3, 5, 4}, {2, 3, 7, 4}, 6);
       }},
      {"rank 5",
       [] {
         return qkv({2, 2, 3, 5, 4}, {2, 2, 3, 7, 4}, 3);
       }},
      {"GQA, 3 query heads per key/value head",
       [] {
         return qkv({2, 6, 5, 4}, {2, 2, 7, 4}, 3);
       }},
      {"causal, Tq = Tk",
       [=] {
         return causal(qkv({2, 2, 6, 4}, {2, 2, 6, 4}, 3));
       }},
      {"causal, Tq < Tk (queries are the last positions)",
       [=] {
         return causal(qkv({2, 2, 3, 4}, {2, 2, 9, 4}, 3));
       }},
      {"causal, Tq > Tk (the first queries see no key)",
       [=] {
         return causal(qkv({2, 2, 9, 4}, {2, 2, 3, 4}, 3));
       }},
      {"causal GQA, rank 5",
       [=] {
         return causal(qkv({1, 2, 4, 6, 8}, {1, 2, 2, 6, 8}, 5));
       }},
      {"bool mask, full shape",
       [] {
         return with(qkv({2, 3, 5, 4}, {2, 3, 7, 4}, 3), [](ContractInputs& x) {
           x.options.attn_mask(torch::rand({2, 3, 5, 7}) < 0.3);
         });
       }},
      {"float mask, full shape",
       [] {
         return with(qkv({2, 3, 5, 4}, {2, 3, 7, 4}, 3), [](ContractInputs& x) {
           x.options.attn_mask(randn({2, 3, 5, 7}));
         });
       }},
      {"bool mask broadcast over batch and heads (key padding)",
       [] {
         return with(qkv({2, 3, 5, 4}, {2, 3, 7, 4}, 3), [](ContractInputs& x) {
           x.options.attn_mask(torch::rand({2, 1, 1, 7}) < 0.4);
         });
       }},
      {"float mask broadcast (Tq, Tk) with causal",
       [=] {
         return with(causal(qkv({2, 3, 5, 4}, {2, 3, 7, 4}, 3)), [](ContractInputs& x) {
           x.options.attn_mask(randn({5, 7}));
         });
       }},
      {"rows with no visible key (bool mask)",
       [] {
         return with(qkv({2, 2, 5, 4}, {2, 2, 7, 4}, 3), [](ContractInputs& x) {
           auto mask = torch::rand({2, 2, 5, 7}) < 0.3;
           mask.select(2, 1).fill_(true);
           x.options.attn_mask(mask);
         });
       }},
      {"rows with no visible key (-inf in a float mask)",
       [] {
         return with(qkv({2, 2, 5, 4}, {2, 2, 7, 4}, 3), [](ContractInputs& x) {
           auto mask = randn({2, 2, 5, 7});
           mask.select(2, 3).fill_(-kInf);
           mask[0][1][0][2] = -kInf;
           x.options.attn_mask(mask);
         });
       }},
      {"+inf in a float mask (that row is NaN)",
       [] {
         return with(qkv({1, 2, 5, 4}, {1, 2, 7, 4}, 3), [](ContractInputs& x) {
           auto mask = torch::zeros({1, 2, 5, 7});
           mask[0][0][2][4] = kInf;
           x.options.attn_mask(mask);
         });
       }},
      {"NaN in a float mask (that row is NaN)",
       [] {
         return with(qkv({1, 2, 5, 4}, {1, 2, 7, 4}, 3), [](ContractInputs& x) {
           auto mask = torch::zeros({1, 2, 5, 7});
           mask[0][1][3][0] = std::nan("");
           x.options.attn_mask(mask);
         });
       }},
      {"NaN and +inf in a float mask where causality hides the key (ignored)",
       [=] {
         return with(causal(qkv({1, 2, 5, 4}, {1, 2, 7, 4}, 3)), [](ContractInputs& x) {
           auto mask = randn({1, 2, 5, 7});
           mask[0][0][1][5] = std::nan("");
           mask[0][1][0][6] = kInf;
           x.options.attn_mask(mask);
         });
       }},
      {"the same in bfloat16 (the Chunked backend's tiles of LibTorch ops)",
       [=] {
         return with(causal(qkv({1, 2, 5, 8}, {1, 2, 7, 8}, 3, torch::kBFloat16)),
                     [](ContractInputs& x) {
                       auto mask = randn({1, 2, 5, 7}, torch::kBFloat16);
                       mask[0][0][1][5] = std::nan("");
                       mask[0][1][0][6] = kInf;
                       x.options.attn_mask(mask);
                     });
       }},
      {"NaN in a query (that row is NaN)",
       [] {
         return with(qkv({1, 2, 5, 4}, {1, 2, 7, 4}, 3),
                     [](ContractInputs& x) { x.q[0][1][2][0] = std::nan(""); });
       },
       finite_qk_only_on_native},
      {"NaN in a key seen by every query",
       [] {
         return with(qkv({1, 2, 5, 4}, {1, 2, 7, 4}, 3),
                     [](ContractInputs& x) { x.k[0][0][0][1] = std::nan(""); });
       },
       finite_qk_only_on_native},
      {"NaN in a key hidden from some queries (by causality and by a bool mask)",
       [=] {
         return with(causal(qkv({1, 2, 5, 4}, {1, 2, 7, 4}, 3)), [](ContractInputs& x) {
           x.k[0][0][6][1] = std::nan("");
           x.k[0][1][2][0] = std::nan("");
           auto mask = torch::zeros({5, 7}, torch::kBool);
           mask.select(1, 2).fill_(true);
           x.options.attn_mask(mask);
         });
       },
       finite_qk_only_on_native},
      {"NaN in a visible value",
       [] {
         return with(qkv({1, 2, 5, 4}, {1, 2, 7, 4}, 3),
                     [](ContractInputs& x) { x.v[0][1][6][2] = std::nan(""); });
       }},
      {"+inf scores from finite inputs (overflow: that row is NaN)",
       [] {
         return with(qkv({1, 1, 4, 2}, {1, 1, 5, 2}, 3), [](ContractInputs& x) {
           x.q[0][0][1].fill_(1e30);
           x.k[0][0][2].fill_(1e30);
         });
       },
       none, /*reference_in_dtype=*/true},
      {"-inf in a key (a score of -inf hides that key)",
       [] {
         return with(qkv({1, 2, 5, 4}, {1, 2, 7, 4}, 3), [](ContractInputs& x) {
           x.q.abs_();
           x.k[0][0][3].fill_(-kInf);
         });
       },
       finite_qk_only_on_native},
      {"-inf keys for a whole row of scores (that row is zero)",
       [] {
         return with(qkv({1, 1, 3, 2}, {1, 1, 4, 2}, 3), [](ContractInputs& x) {
           x.q.abs_().add_(0.5);
           x.k.fill_(-kInf);
         });
       },
       finite_qk_only_on_native},
      {"empty Tq",
       [] {
         return qkv({2, 2, 0, 4}, {2, 2, 7, 4}, 3);
       }},
      {"empty Tk",
       [] {
         return qkv({2, 2, 5, 4}, {2, 2, 0, 4}, 3);
       }},
      {"empty Tk, causal",
       [=] {
         return causal(qkv({2, 2, 5, 4}, {2, 2, 0, 4}, 3));
       }},
      {"empty batch",
       [] {
         return qkv({0, 2, 5, 4}, {0, 2, 7, 4}, 3);
       }},
      {"no heads",
       [] {
         return qkv({2, 0, 5, 4}, {2, 0, 7, 4}, 3);
       }},
      {"zero features (every score is 0)",
       [] {
         return qkv({2, 2, 5, 0}, {2, 2, 7, 0}, 3);
       }},
      {"non-contiguous heads (a (B, T, H, d) tensor transposed)",
       [] {
         ContractInputs in = qkv({2, 5, 3, 4}, {2, 7, 3, 4}, 6);
         in.q = in.q.transpose(1, 2);
         in.k = in.k.transpose(1, 2);
         in.v = in.v.transpose(1, 2);
         return in;
       }},
      {"expanded keys and values (stride 0 over heads)",
       [] {
         ContractInputs in = qkv({2, 3, 5, 4}, {2, 1, 7, 4}, 3);
         in.k = in.k.expand({2, 3, 7, 4});
         in.v = in.v.expand({2, 3, 7, 3});
         return in;
       }},
      {"transposed features (stride(-1) != 1)",
       [] {
         ContractInputs in = qkv({2, 2, 4, 5}, {2, 2, 4, 7}, 3);
         in.q = in.q.transpose(-1, -2);
         in.k = in.k.transpose(-1, -2);
         in.v = randn({2, 2, 7, 3});
         return in;
       }},
      {"float64",
       [=] {
         return causal(qkv({2, 2, 6, 4}, {2, 2, 6, 4}, 3, torch::kDouble));
       }},
      {"bfloat16",
       [=] {
         return causal(qkv({2, 2, 6, 8}, {2, 2, 9, 8}, 4, torch::kBFloat16));
       }},
      {"bfloat16 with a bool mask",
       [] {
         return with(qkv({2, 2, 6, 8}, {2, 2, 9, 8}, 4, torch::kBFloat16), [](ContractInputs& x) {
           x.options.attn_mask(torch::rand({6, 9}) < 0.3);
         });
       }},
      {"a given scale",
       [] {
         return with(qkv({2, 2, 5, 4}, {2, 2, 7, 4}, 3),
                     [](ContractInputs& x) { x.options.scale(0.3); });
       }},
      {"float mask that requires grad",
       [] {
         return with(qkv({2, 2, 5, 4}, {2, 2, 7, 4}, 3), [](ContractInputs& x) {
           x.options.attn_mask(randn({2, 1, 5, 7}));
           x.mask_grad = true;
         });
       },
       mask_gradient_not_on_chunked},
      {"attention weights requested",
       [] {
         return with(qkv({2, 2, 5, 4}, {2, 2, 7, 4}, 3),
                     [](ContractInputs& x) { x.options.need_weights(true); });
       },
       [](Backend b, bool) -> std::optional<std::string> {
         if (b == Backend::Chunked) return std::string("the Chunked backend computes neither");
         if (b == Backend::Native) return std::string("the Native backend returns no attention");
         return std::nullopt;
       }},
      {"large enough for Auto to pick Chunked: causal, GQA, padding, several blocks",
       [=] {
         return with(causal(qkv({1, 4, 520, 16}, {1, 2, 520, 16}, 16)), [](ContractInputs& x) {
           x.options.attn_mask(torch::rand({1, 1, 1, 520}) < 0.1).block_size(96);
         });
       }},
      {"a float mask that requires grad, large enough for Auto to pick Chunked without it",
       [] {
         return with(qkv({1, 4, 520, 8}, {1, 4, 520, 8}, 8), [](ContractInputs& x) {
           x.options.attn_mask(randn({1, 1, 520, 520}));
           x.mask_grad = true;
         });
       },
       mask_gradient_not_on_chunked},
      {"block_size far beyond the sequence (clamped)",
       [] {
         return with(qkv({1, 2, 37, 8}, {1, 2, 41, 8}, 5),
                     [](ContractInputs& x) { x.options.block_size(int64_t{1} << 40); });
       }},
  };
}

double tolerance(torch::Dtype dtype) {
  if (dtype == torch::kDouble) return 1e-10;
  if (dtype == torch::kBFloat16) return 3e-2;
  return 2e-5;
}

// Equal within tolerance where the reference is finite; NaN exactly where it is NaN.
void check_matches(const std::string& what, const torch::Tensor& actual,
                   const torch::Tensor& expected, double tol, bool nan_exact) {
  INFO(what);
  REQUIRE(actual.defined());
  REQUIRE(actual.sizes() == expected.sizes());
  const auto a = actual.detach().to(torch::kDouble), e = expected.detach().to(torch::kDouble);
  const auto finite = torch::isfinite(e);
  if (nan_exact) CHECK(torch::equal(torch::isnan(a), torch::isnan(e)));
  const auto where_finite = torch::where(finite, a, torch::zeros({}, a.options()));
  const auto expected_finite = torch::where(finite, e, torch::zeros({}, e.options()));
  const auto diff = (where_finite - expected_finite).abs();
  const double max_diff = diff.numel() ? diff.max().item<double>() : 0.0;
  INFO("max |diff| " << max_diff);
  CHECK((diff <= tol + tol * expected_finite.abs()).all().item<bool>());
}

struct Result {
  torch::Tensor output, weights;
  std::vector<torch::Tensor> grads;  // q, k, v, and the mask when it takes part
};

Result run(const ContractInputs& in, Backend backend, bool grad, torch::Dtype dtype) {
  auto prepare = [&](const torch::Tensor& t) {
    auto c = t.to(dtype);
    // Keep the class's memory layout: to() of the same dtype is the tensor itself.
    if (dtype == t.scalar_type()) c = t.detach();
    return grad ? c.requires_grad_(true) : c;
  };
  auto q = prepare(in.q), k = prepare(in.k), v = prepare(in.v);
  Options o = in.options;
  o.backend(backend);
  torch::Tensor mask = o.attn_mask();
  if (mask.defined() && mask.is_floating_point()) {
    mask = mask.to(dtype).detach();
    if (grad && in.mask_grad) mask.requires_grad_(true);
    o.attn_mask(mask);
  }
  auto out = F::scaled_dot_product_attention(q, k, v, o);
  Result r{out.output, out.weights, {}};
  if (!grad) return r;
  CHECK(out.output.requires_grad());
  torch::manual_seed(11);
  out.output.backward(torch::randn(out.output.sizes()).to(out.output.scalar_type()));
  std::vector<torch::Tensor> wrt = {q, k, v};
  if (in.mask_grad) wrt.push_back(mask);
  for (const auto& t : wrt) {
    r.grads.push_back(t.grad().defined() ? t.grad() : torch::zeros_like(t));
  }
  return r;
}

const char* name(Backend b) {
  switch (b) {
    case Backend::Auto:
      return "Auto";
    case Backend::Math:
      return "Math";
    case Backend::Chunked:
      return "Chunked";
    case Backend::Native:
      return "Native";
  }
  return "?";
}

}  // namespace

TEST_CASE("contract: every input class gives Math's numbers or the named error on every backend",
          "[contract]") {
  const auto classes = table();
  CHECK(classes.size() >= 40);
  for (const auto& c : classes) {
    for (const bool grad : {false, true}) {
      torch::manual_seed(7);
      const ContractInputs in = c.make();
      const auto dtype = in.q.scalar_type();
      const auto ref_dtype = c.reference_in_dtype ? dtype : torch::kDouble;
      const Result ref = run(in, Backend::Math, grad, ref_dtype);
      for (const auto backend : {Backend::Math, Backend::Chunked, Backend::Native, Backend::Auto}) {
        INFO("class \"" << c.name << "\", backend " << name(backend) << ", autograd " << grad);
        const auto refusal = c.refuses ? c.refuses(backend, grad) : std::nullopt;
        if (refusal) {
          CHECK_THROWS_C10(run(in, backend, grad, dtype), c10::Error, *refusal);
          continue;
        }
        const Result got = run(in, backend, grad, dtype);
        const double tol = tolerance(dtype);
        check_matches("output", got.output, ref.output, tol, /*nan_exact=*/true);
        if (ref.weights.defined()) check_matches("weights", got.weights, ref.weights, tol, true);
        REQUIRE(got.grads.size() == ref.grads.size());
        // Gradients: equal wherever Math's are finite (where Math's are NaN, a backend that skips
        // hidden blocks may rightly stay finite).
        for (size_t i = 0; i < got.grads.size(); ++i) {
          check_matches("gradient " + std::to_string(i), got.grads[i], ref.grads[i], tol * 5,
                        /*nan_exact=*/false);
          const auto finite_ref = torch::isfinite(ref.grads[i].to(torch::kDouble));
          CHECK_FALSE(torch::logical_and(finite_ref, torch::isnan(got.grads[i].to(torch::kDouble)))
                          .any()
                          .item<bool>());
        }
      }
    }
  }
}

TEST_CASE("contract: each backend reports the path it took", "[contract]") {
  torch::manual_seed(3);
  const auto q = randn({1, 4, 600, 16}), k = randn({1, 4, 600, 16}), v = randn({1, 4, 600, 16});
  const auto path = [&](Options o, torch::Dtype dtype = torch::kFloat) {
    F::scaled_dot_product_attention(q.to(dtype), k.to(dtype), v.to(dtype), o);
    return F::last_path();
  };
  CHECK(path(Options().backend(Backend::Math)) == F::Path::Math);
  CHECK(path(Options().backend(Backend::Chunked)) == F::Path::ChunkedFused);
  CHECK(path(Options().backend(Backend::Chunked), torch::kBFloat16) == F::Path::ChunkedFused);
  CHECK(path(Options().backend(Backend::Native)) == F::Path::Native);
  CHECK(path(Options()) == F::Path::ChunkedFused);  // no gradient, large scores
  CHECK(path(Options().need_weights(true)) == F::Path::Math);
  // Empty problems are whole-matrix problems on every backend.
  F::scaled_dot_product_attention(q.narrow(2, 0, 0), k, v, Options().backend(Backend::Chunked));
  CHECK(F::last_path() == F::Path::Math);
  // The article's sizes without gradient take the direct path.
  const auto x = randn({6, 3});
  F::projected_attention(x, x, randn({3, 2}), randn({3, 2}), randn({3, 4}));
  CHECK(F::last_path() == F::Path::Direct);
}
