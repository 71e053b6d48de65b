// The schemas of the operators of namespace `attention` and their kernels on each dispatch key.
// The schemas' argument names and defaults are the functional layer's options
// (attention/functional.h), with the enums as strings.

#include <attention/operators.h>

#include "operators/kernels.h"

#include <torch/library.h>

namespace attention {
namespace {

// The options the attention operators share, after the tensors they attend over.
#define ATTENTION_OPERATOR_OPTIONS                                                         \
  "str causal_alignment=\"bottom_right\", int? window_left=None, int? window_right=None, " \
  "Tensor? alibi_slopes=None, float? softcap=None, Tensor? sinks=None, float? scale=None"

void define(torch::Library& m) {
  m.def(
      "scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, "
      "Tensor? attn_mask=None, bool is_causal=False, " ATTENTION_OPERATOR_OPTIONS
      ", float dropout_p=0.0, str backend=\"auto\", int block_size=256) -> Tensor");
  m.def(
      "varlen_attention(Tensor query, Tensor key, Tensor value, Tensor cu_seqlens_q, "
      "Tensor cu_seqlens_k, bool is_causal=False, " ATTENTION_OPERATOR_OPTIONS
      ", float dropout_p=0.0, str backend=\"auto\", int block_size=256) -> Tensor");
  m.def(
      "_fused_attention_forward(Tensor query, Tensor key, Tensor value, Tensor? cu_seqlens_q, "
      "Tensor? cu_seqlens_k, Tensor? attn_mask, bool is_causal, " ATTENTION_OPERATOR_OPTIONS
      ", int block_size=256) -> (Tensor, Tensor)");
  m.def(
      "_fused_attention_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, "
      "Tensor out, Tensor lse, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, Tensor? attn_mask, "
      "bool is_causal, " ATTENTION_OPERATOR_OPTIONS
      ", int block_size=256) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "apply_rotary(Tensor x, Tensor positions, float theta=10000.0, int rotary_dim=0, "
      "str layout=\"half_split\") -> Tensor",
      torch::dispatch(c10::DispatchKey::CompositeImplicitAutograd,
                      TORCH_FN(operators::apply_rotary)));
}

#undef ATTENTION_OPERATOR_OPTIONS

void implement(torch::Library& cpu, torch::Library& meta, torch::Library& autograd) {
  cpu.impl("scaled_dot_product_attention", TORCH_FN(operators::attention_cpu));
  meta.impl("scaled_dot_product_attention", TORCH_FN(operators::attention_meta));
  autograd.impl("scaled_dot_product_attention", TORCH_FN(operators::attention_autograd));
  cpu.impl("varlen_attention", TORCH_FN(operators::varlen_cpu));
  meta.impl("varlen_attention", TORCH_FN(operators::varlen_meta));
  autograd.impl("varlen_attention", TORCH_FN(operators::varlen_autograd));
  cpu.impl("_fused_attention_forward", TORCH_FN(operators::fused_forward_cpu));
  meta.impl("_fused_attention_forward", TORCH_FN(operators::fused_forward_meta));
  cpu.impl("_fused_attention_backward", TORCH_FN(operators::fused_backward_cpu));
  meta.impl("_fused_attention_backward", TORCH_FN(operators::fused_backward_meta));
  // The private operators record no autograd of their own (the public operators' record calls
  // them below autograd): every autograd key falls through to the device's kernel, meta
  // included, whose own check then names a misplaced tensor (LibTorch 1.13 has no fallthrough
  // for AutogradMeta of its own).
  for (const char* name : {"_fused_attention_forward", "_fused_attention_backward"}) {
    autograd.impl(name, torch::CppFunction::makeFallthrough());
  }
}

}  // namespace

void register_operators() {
  // The dispatcher holds a registration while its Library lives: these live until the process
  // ends, and a second call finds them made.
  static const bool registered = [] {
    static torch::Library definitions(torch::Library::DEF, "attention", c10::nullopt, __FILE__,
                                      __LINE__);
    static torch::Library cpu(torch::Library::IMPL, "attention", c10::DispatchKey::CPU, __FILE__,
                              __LINE__);
    static torch::Library meta(torch::Library::IMPL, "attention", c10::DispatchKey::Meta, __FILE__,
                               __LINE__);
    static torch::Library autograd(torch::Library::IMPL, "attention", c10::DispatchKey::Autograd,
                                   __FILE__, __LINE__);
    define(definitions);
    implement(cpu, meta, autograd);
    return true;
  }();
  (void)registered;
}

}  // namespace attention
