// The attention operators' kernels. Inference runs the functional layer as the C++ API does.
// Training on the fused CPU route records one autograd node whose forward and backward are the
// private operators _fused_attention_forward and _fused_attention_backward (the fused kernels,
// with every query's log-sum-exp carried between them), never a graph of LibTorch's ops: a
// torch.compile or torch.export trace then holds those two operators and their Meta kernels give
// it shapes. Every other call that needs gradients (the math and native backends, empty problems,
// dtypes the fused kernels do not take, a mask that needs a gradient) runs the functional layer
// under autograd, as the C++ API does.
//
// Every tensor an operator returns is contiguous, as its Meta kernel describes it.

#include "operators/arguments.h"
#include "operators/kernels.h"
#include "operators/symbolic_sizes.h"

#include "checks.h"
#include "kernels/chunked.h"
#include "kernels/problem.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/torch.h>

namespace attention {
namespace operators {

using torch::Tensor;

namespace {

Arguments read_arguments(const char* caller, const OptionalTensor& cu_seqlens_q,
                         const OptionalTensor& cu_seqlens_k, const OptionalTensor& attn_mask,
                         bool is_causal, c10::string_view causal_alignment,
                         c10::optional<int64_t> window_left, c10::optional<int64_t> window_right,
                         const OptionalTensor& alibi_slopes, c10::optional<double> softcap,
                         const OptionalTensor& sinks, c10::optional<double> scale, double dropout_p,
                         c10::string_view backend, int64_t block_size) {
  Arguments args;
  args.caller = caller;
  args.cu_seqlens_q = cu_seqlens_q;
  args.cu_seqlens_k = cu_seqlens_k;
  args.attn_mask = attn_mask;
  args.is_causal = is_causal;
  args.causal_alignment = std::string(causal_alignment);
  args.window_left = window_left;
  args.window_right = window_right;
  args.alibi_slopes = alibi_slopes;
  args.softcap = softcap;
  args.sinks = sinks;
  args.scale = scale;
  args.dropout_p = dropout_p;
  args.backend = std::string(backend);
  args.block_size = block_size;
  return args;
}

// The arguments of the private fused operators: those of the public operator they serve (the
// varlen one when offsets are given, for its messages), on the fused route, without dropout.
Arguments fused_arguments(const OptionalTensor& cu_seqlens_q, const OptionalTensor& cu_seqlens_k,
                          const OptionalTensor& attn_mask, bool is_causal,
                          c10::string_view causal_alignment, c10::optional<int64_t> window_left,
                          c10::optional<int64_t> window_right, const OptionalTensor& alibi_slopes,
                          c10::optional<double> softcap, const OptionalTensor& sinks,
                          c10::optional<double> scale, int64_t block_size) {
  return read_arguments(cu_seqlens_q ? kVarlenOperator : kAttentionOperator, cu_seqlens_q,
                        cu_seqlens_k, attn_mask, is_causal, causal_alignment, window_left,
                        window_right, alibi_slopes, softcap, sinks, scale, 0.0, "chunked",
                        block_size);
}

// The problem the fused kernels compute, validated as the public operator validates it, and
// the tensors as they read them: a packed call's (H, total, d) views.
struct FusedProblem {
  kernels::Problem problem;
  Tensor query, key, value;
};

FusedProblem fused_problem(const Arguments& args, const Tensor& query, const Tensor& key,
                           const Tensor& value) {
  TORCH_CHECK_VALUE(args.cu_seqlens_q.has_value() == args.cu_seqlens_k.has_value(), args.caller,
                    ": expected both cu_seqlens_q and cu_seqlens_k or neither, got ",
                    args.cu_seqlens_q ? "cu_seqlens_q alone" : "cu_seqlens_k alone");
  const auto options = to_options(args);
  auto problem = args.packed()
                     ? kernels::make_varlen_problem(query, key, value, *args.cu_seqlens_q,
                                                    *args.cu_seqlens_k, options, args.caller)
                     : kernels::make_problem(query, key, value, options, args.caller);
  // The private operators can be called directly: what only the public operator's choice of
  // route guarantees is checked here, by name.
  TORCH_CHECK(takes_fused_route(args, query, key, value) && query.device().is_cpu(), args.caller,
              ": the fused CPU kernels take CPU float, double or bfloat16 inputs with no empty "
              "dimension, on backend 'auto' or 'chunked' and with a mask that needs no gradient; "
              "got ",
              query.scalar_type(), " on ", query.device(), " with backend '", args.backend, "'");
  if (!args.packed()) return {std::move(problem), query, key, value};
  const auto heads_first = [](const Tensor& t) { return t.transpose(0, 1); };
  return {std::move(problem), heads_first(query), heads_first(key), heads_first(value)};
}

// A packed call's tensors back from (H, total, d) to the packed layout (total, H, d).
Tensor packed_layout(const Arguments& args, const Tensor& t) {
  return args.packed() ? t.transpose(0, 1).contiguous() : t.contiguous();
}

// The log-sum-exp as the operators carry it: the queries' shape without their features, or
// (H, total_q) for packed sequences; float, or double for double queries.
std::vector<int64_t> lse_sizes(bool packed, const Tensor& query) {
  if (packed) return {query.size(1), query.size(0)};
  return query.sizes().slice(0, query.dim() - 1).vec();
}

// The same for the Meta kernels, whose sizes may be symbols.
std::vector<Size> symbolic_lse_sizes(bool packed, const Tensor& query) {
  if (packed) return {size_of(query, 1), size_of(query, 0)};
  auto sizes = sizes_of(query);
  sizes.pop_back();
  return sizes;
}

at::ScalarType lse_dtype(const Tensor& query) {
  return query.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

std::vector<int64_t> output_sizes(const Tensor& query, const Tensor& value) {
  auto sizes = query.sizes().vec();
  sizes.back() = value.size(-1);
  return sizes;
}

std::vector<Size> symbolic_output_sizes(const Tensor& query, const Tensor& value) {
  auto sizes = sizes_of(query);
  sizes.back() = size_of(value, -1);
  return sizes;
}

bool needs_gradient(const Arguments& args, const Tensor& query, const Tensor& key,
                    const Tensor& value) {
  const auto wants = [](const OptionalTensor& t) { return t && t->requires_grad(); };
  return torch::GradMode::is_enabled() &&
         (query.requires_grad() || key.requires_grad() || value.requires_grad() ||
          wants(args.sinks) || wants(args.attn_mask));
}

c10::TypedOperatorHandle<decltype(fused_forward_cpu)> forward_operator() {
  static const auto handle = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("attention::_fused_attention_forward", "")
                                 .typed<decltype(fused_forward_cpu)>();
  return handle;
}

c10::TypedOperatorHandle<decltype(fused_backward_cpu)> backward_operator() {
  static const auto handle = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("attention::_fused_attention_backward", "")
                                 .typed<decltype(fused_backward_cpu)>();
  return handle;
}

// The fused route's autograd record. Its inputs are query, key, value and the sinks (an empty
// placeholder without them: LibTorch's autograd takes no undefined inputs); the other arguments
// travel as saved values.
class FusedAttention : public torch::autograd::Function<FusedAttention> {
 public:
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& query,
                        const Tensor& key, const Tensor& value, const Tensor& sinks,
                        const Arguments& args) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [out, lse] = forward_operator().call(
        query, key, value, args.cu_seqlens_q, args.cu_seqlens_k, args.attn_mask, args.is_causal,
        args.causal_alignment, args.window_left, args.window_right, args.alibi_slopes, args.softcap,
        args.sinks, args.scale, args.block_size);
    ctx->save_for_backward({query, key, value, out, lse, sinks});
    ctx->saved_data["packed"] = args.packed();
    ctx->saved_data["cu_seqlens_q"] = args.cu_seqlens_q;
    ctx->saved_data["cu_seqlens_k"] = args.cu_seqlens_k;
    ctx->saved_data["attn_mask"] = args.attn_mask;
    ctx->saved_data["is_causal"] = args.is_causal;
    ctx->saved_data["causal_alignment"] = args.causal_alignment;
    ctx->saved_data["window_left"] = args.window_left;
    ctx->saved_data["window_right"] = args.window_right;
    ctx->saved_data["alibi_slopes"] = args.alibi_slopes;
    ctx->saved_data["softcap"] = args.softcap;
    ctx->saved_data["with_sinks"] = args.sinks.has_value();
    ctx->saved_data["scale"] = args.scale;
    ctx->saved_data["block_size"] = args.block_size;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto& data = ctx->saved_data;
    detail::refuse_double_backward(data["packed"].toBool() ? kVarlenOperator : kAttentionOperator);
    const auto saved = ctx->get_saved_variables();
    const auto optional_tensor = [](const c10::IValue& v) -> OptionalTensor {
      return v.isNone() ? OptionalTensor() : OptionalTensor(v.toTensor());
    };
    const auto optional_int = [](const c10::IValue& v) -> c10::optional<int64_t> {
      return v.isNone() ? c10::optional<int64_t>() : v.toInt();
    };
    const auto optional_double = [](const c10::IValue& v) -> c10::optional<double> {
      return v.isNone() ? c10::optional<double>() : v.toDouble();
    };
    const bool with_sinks = data["with_sinks"].toBool();
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [dq, dk, dv, d_sinks] = backward_operator().call(
        grads[0], saved[0], saved[1], saved[2], saved[3], saved[4],
        optional_tensor(data["cu_seqlens_q"]), optional_tensor(data["cu_seqlens_k"]),
        optional_tensor(data["attn_mask"]), data["is_causal"].toBool(),
        data["causal_alignment"].toStringRef(), optional_int(data["window_left"]),
        optional_int(data["window_right"]), optional_tensor(data["alibi_slopes"]),
        optional_double(data["softcap"]), with_sinks ? OptionalTensor(saved[5]) : OptionalTensor(),
        optional_double(data["scale"]), data["block_size"].toInt());
    return {dq, dk, dv, with_sinks ? d_sinks : Tensor(), Tensor()};
  }
};

// The Autograd kernel of both public operators: the fused route's record, the functional layer
// under autograd elsewhere, and below autograd (the CPU or Meta kernel) when nothing needs a
// gradient.
template <typename Below>
Tensor differentiated(const Arguments& args, const Tensor& query, const Tensor& key,
                      const Tensor& value, Below below) {
  if (!needs_gradient(args, query, key, value)) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return below();
  }
  if (!takes_fused_route(args, query, key, value)) return attention_of(args, query, key, value);
  const Tensor sinks = args.sinks ? *args.sinks : torch::empty({0}, query.options());
  return FusedAttention::apply(query, key, value, sinks, args);
}

}  // namespace

Tensor attention_cpu(const Tensor& query, const Tensor& key, const Tensor& value,
                     const OptionalTensor& attn_mask, bool is_causal,
                     c10::string_view causal_alignment, c10::optional<int64_t> window_left,
                     c10::optional<int64_t> window_right, const OptionalTensor& alibi_slopes,
                     c10::optional<double> softcap, const OptionalTensor& sinks,
                     c10::optional<double> scale, double dropout_p, c10::string_view backend,
                     int64_t block_size) {
  torch::NoGradGuard no_grad;
  const auto args = read_arguments(kAttentionOperator, {}, {}, attn_mask, is_causal,
                                   causal_alignment, window_left, window_right, alibi_slopes,
                                   softcap, sinks, scale, dropout_p, backend, block_size);
  check_devices(args, query, key, value);
  return attention_of(args, query, key, value).contiguous();
}

Tensor attention_meta(const Tensor& query, const Tensor& key, const Tensor& value,
                      const OptionalTensor& attn_mask, bool is_causal,
                      c10::string_view causal_alignment, c10::optional<int64_t> window_left,
                      c10::optional<int64_t> window_right, const OptionalTensor& alibi_slopes,
                      c10::optional<double> softcap, const OptionalTensor& sinks,
                      c10::optional<double> scale, double dropout_p, c10::string_view backend,
                      int64_t block_size) {
  check_devices(read_arguments(kAttentionOperator, {}, {}, attn_mask, is_causal, causal_alignment,
                               window_left, window_right, alibi_slopes, softcap, sinks, scale,
                               dropout_p, backend, block_size),
                query, key, value);
  return empty_of(symbolic_output_sizes(query, value), query.options());
}

Tensor attention_autograd(const Tensor& query, const Tensor& key, const Tensor& value,
                          const OptionalTensor& attn_mask, bool is_causal,
                          c10::string_view causal_alignment, c10::optional<int64_t> window_left,
                          c10::optional<int64_t> window_right, const OptionalTensor& alibi_slopes,
                          c10::optional<double> softcap, const OptionalTensor& sinks,
                          c10::optional<double> scale, double dropout_p, c10::string_view backend,
                          int64_t block_size) {
  const auto args = read_arguments(kAttentionOperator, {}, {}, attn_mask, is_causal,
                                   causal_alignment, window_left, window_right, alibi_slopes,
                                   softcap, sinks, scale, dropout_p, backend, block_size);
  check_devices(args, query, key, value);
  return differentiated(args, query, key, value, [&] {
    static const auto handle = c10::Dispatcher::singleton()
                                   .findSchemaOrThrow("attention::scaled_dot_product_attention", "")
                                   .typed<decltype(attention_cpu)>();
    return handle.call(query, key, value, attn_mask, is_causal, causal_alignment, window_left,
                       window_right, alibi_slopes, softcap, sinks, scale, dropout_p, backend,
                       block_size);
  });
}

Tensor varlen_cpu(const Tensor& query, const Tensor& key, const Tensor& value,
                  const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k, bool is_causal,
                  c10::string_view causal_alignment, c10::optional<int64_t> window_left,
                  c10::optional<int64_t> window_right, const OptionalTensor& alibi_slopes,
                  c10::optional<double> softcap, const OptionalTensor& sinks,
                  c10::optional<double> scale, double dropout_p, c10::string_view backend,
                  int64_t block_size) {
  torch::NoGradGuard no_grad;
  const auto args = read_arguments(kVarlenOperator, cu_seqlens_q, cu_seqlens_k, {}, is_causal,
                                   causal_alignment, window_left, window_right, alibi_slopes,
                                   softcap, sinks, scale, dropout_p, backend, block_size);
  check_devices(args, query, key, value);
  return attention_of(args, query, key, value).contiguous();
}

Tensor varlen_meta(const Tensor& query, const Tensor& key, const Tensor& value,
                   const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k, bool is_causal,
                   c10::string_view causal_alignment, c10::optional<int64_t> window_left,
                   c10::optional<int64_t> window_right, const OptionalTensor& alibi_slopes,
                   c10::optional<double> softcap, const OptionalTensor& sinks,
                   c10::optional<double> scale, double dropout_p, c10::string_view backend,
                   int64_t block_size) {
  check_devices(read_arguments(kVarlenOperator, cu_seqlens_q, cu_seqlens_k, {}, is_causal,
                               causal_alignment, window_left, window_right, alibi_slopes, softcap,
                               sinks, scale, dropout_p, backend, block_size),
                query, key, value);
  return empty_of(symbolic_output_sizes(query, value), query.options());
}

Tensor varlen_autograd(const Tensor& query, const Tensor& key, const Tensor& value,
                       const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k, bool is_causal,
                       c10::string_view causal_alignment, c10::optional<int64_t> window_left,
                       c10::optional<int64_t> window_right, const OptionalTensor& alibi_slopes,
                       c10::optional<double> softcap, const OptionalTensor& sinks,
                       c10::optional<double> scale, double dropout_p, c10::string_view backend,
                       int64_t block_size) {
  const auto args = read_arguments(kVarlenOperator, cu_seqlens_q, cu_seqlens_k, {}, is_causal,
                                   causal_alignment, window_left, window_right, alibi_slopes,
                                   softcap, sinks, scale, dropout_p, backend, block_size);
  check_devices(args, query, key, value);
  return differentiated(args, query, key, value, [&] {
    static const auto handle = c10::Dispatcher::singleton()
                                   .findSchemaOrThrow("attention::varlen_attention", "")
                                   .typed<decltype(varlen_cpu)>();
    return handle.call(query, key, value, cu_seqlens_q, cu_seqlens_k, is_causal, causal_alignment,
                       window_left, window_right, alibi_slopes, softcap, sinks, scale, dropout_p,
                       backend, block_size);
  });
}

std::tuple<Tensor, Tensor> fused_forward_cpu(
    const Tensor& query, const Tensor& key, const Tensor& value, const OptionalTensor& cu_seqlens_q,
    const OptionalTensor& cu_seqlens_k, const OptionalTensor& attn_mask, bool is_causal,
    c10::string_view causal_alignment, c10::optional<int64_t> window_left,
    c10::optional<int64_t> window_right, const OptionalTensor& alibi_slopes,
    c10::optional<double> softcap, const OptionalTensor& sinks, c10::optional<double> scale,
    int64_t block_size) {
  torch::NoGradGuard no_grad;
  const auto args =
      fused_arguments(cu_seqlens_q, cu_seqlens_k, attn_mask, is_causal, causal_alignment,
                      window_left, window_right, alibi_slopes, softcap, sinks, scale, block_size);
  check_devices(args, query, key, value);
  const auto f = fused_problem(args, query, key, value);
  auto [out, lse] = kernels::fused_forward_with_lse(f.problem, f.query, f.key, f.value);
  return {packed_layout(args, out),
          lse.reshape(lse_sizes(args.packed(), query)).to(lse_dtype(query)).contiguous()};
}

std::tuple<Tensor, Tensor> fused_forward_meta(
    const Tensor& query, const Tensor& key, const Tensor& value, const OptionalTensor& cu_seqlens_q,
    const OptionalTensor& cu_seqlens_k, const OptionalTensor& attn_mask, bool is_causal,
    c10::string_view causal_alignment, c10::optional<int64_t> window_left,
    c10::optional<int64_t> window_right, const OptionalTensor& alibi_slopes,
    c10::optional<double> softcap, const OptionalTensor& sinks, c10::optional<double> scale,
    int64_t block_size) {
  check_devices(
      fused_arguments(cu_seqlens_q, cu_seqlens_k, attn_mask, is_causal, causal_alignment,
                      window_left, window_right, alibi_slopes, softcap, sinks, scale, block_size),
      query, key, value);
  return {empty_of(symbolic_output_sizes(query, value), query.options()),
          empty_of(symbolic_lse_sizes(cu_seqlens_q.has_value(), query),
                   query.options().dtype(lse_dtype(query)))};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> fused_backward_cpu(
    const Tensor& grad_out, const Tensor& query, const Tensor& key, const Tensor& value,
    const Tensor& out, const Tensor& lse, const OptionalTensor& cu_seqlens_q,
    const OptionalTensor& cu_seqlens_k, const OptionalTensor& attn_mask, bool is_causal,
    c10::string_view causal_alignment, c10::optional<int64_t> window_left,
    c10::optional<int64_t> window_right, const OptionalTensor& alibi_slopes,
    c10::optional<double> softcap, const OptionalTensor& sinks, c10::optional<double> scale,
    int64_t block_size) {
  torch::NoGradGuard no_grad;
  const auto args =
      fused_arguments(cu_seqlens_q, cu_seqlens_k, attn_mask, is_causal, causal_alignment,
                      window_left, window_right, alibi_slopes, softcap, sinks, scale, block_size);
  check_devices(args, query, key, value, {{"grad_out", &grad_out}, {"out", &out}, {"lse", &lse}});
  const auto f = fused_problem(args, query, key, value);
  const auto& p = f.problem;
  const auto expected_out = output_sizes(query, value);
  TORCH_CHECK_VALUE(
      out.sizes() == c10::IntArrayRef(expected_out) && grad_out.sizes() == out.sizes(), args.caller,
      ": expected the output and its gradient of shape ", expected_out, ", got ", out.sizes(),
      " and ", grad_out.sizes());
  TORCH_CHECK_VALUE(lse.sizes() == c10::IntArrayRef(lse_sizes(args.packed(), query)), args.caller,
                    ": expected a log-sum-exp of shape ", lse_sizes(args.packed(), query), ", got ",
                    lse.sizes());
  TORCH_CHECK_TYPE(out.scalar_type() == query.scalar_type() &&
                       lse.scalar_type() == lse_dtype(query) && grad_out.is_floating_point(),
                   args.caller, ": expected the output of dtype ", query.scalar_type(),
                   ", a log-sum-exp of dtype ", lse_dtype(query),
                   " and a floating output gradient, got ", out.scalar_type(), ", ",
                   lse.scalar_type(), " and ", grad_out.scalar_type());
  const auto heads_first = [&](const Tensor& t) { return args.packed() ? t.transpose(0, 1) : t; };
  const auto kernel_lse = lse.reshape({p.n, p.g, p.t_q});
  auto [dq, dk, dv, d_sinks] =
      kernels::fused_backward_with_lse(p, f.query, f.key, f.value, heads_first(out), kernel_lse,
                                       heads_first(grad_out.to(query.scalar_type())));
  if (!d_sinks.defined()) d_sinks = torch::empty({0}, query.options());
  return {packed_layout(args, dq), packed_layout(args, dk), packed_layout(args, dv),
          d_sinks.contiguous()};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> fused_backward_meta(
    const Tensor& grad_out, const Tensor& query, const Tensor& key, const Tensor& value,
    const Tensor& out, const Tensor& lse, const OptionalTensor& cu_seqlens_q,
    const OptionalTensor& cu_seqlens_k, const OptionalTensor& attn_mask, bool is_causal,
    c10::string_view causal_alignment, c10::optional<int64_t> window_left,
    c10::optional<int64_t> window_right, const OptionalTensor& alibi_slopes,
    c10::optional<double> softcap, const OptionalTensor& sinks, c10::optional<double> scale,
    int64_t block_size) {
  check_devices(
      fused_arguments(cu_seqlens_q, cu_seqlens_k, attn_mask, is_causal, causal_alignment,
                      window_left, window_right, alibi_slopes, softcap, sinks, scale, block_size),
      query, key, value, {{"grad_out", &grad_out}, {"out", &out}, {"lse", &lse}});
  return {
      torch::empty(query.sizes(), query.options()), torch::empty(key.sizes(), key.options()),
      torch::empty(value.sizes(), value.options()),
      sinks ? torch::empty(sinks->sizes(), sinks->options()) : torch::empty({0}, query.options())};
}

}  // namespace operators
}  // namespace attention
