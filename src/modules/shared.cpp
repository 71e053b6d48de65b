#include "modules/shared.h"

#include <torch/torch.h>

namespace attention {
namespace detail {

void check_module_input(const torch::Tensor& x, int64_t d_in, const torch::Tensor& parameter,
                        const char* module, const char* what) {
  TORCH_CHECK_VALUE(x.defined(), module, ": expected ", what, " to be a defined tensor");
  TORCH_CHECK_VALUE((x.dim() == 2 || x.dim() == 3) && x.size(-1) == d_in, module, ": expected ",
                    what, " (T, ", d_in, ") or (B, T, ", d_in, "), got ", shape_str(x.sizes()));
  TORCH_CHECK_TYPE(x.scalar_type() == parameter.scalar_type(), module, ": expected ", what,
                   " of dtype ", parameter.scalar_type(), " (the parameters' dtype), got ",
                   x.scalar_type());
  TORCH_CHECK(x.device() == parameter.device(), module, ": expected ", what, " on device ",
              parameter.device(), " (the parameters' device), got ", x.device());
}

void check_same_batch(const torch::Tensor& a, const torch::Tensor& b, const char* module,
                      const char* name_a, const char* name_b) {
  TORCH_CHECK_VALUE(a.dim() == b.dim() && (a.dim() == 2 || a.size(0) == b.size(0)), module,
                    ": expected ", name_a, " and ", name_b, " with the same batch size, got ",
                    name_a, " ", shape_str(a.sizes()), " and ", name_b, " ", shape_str(b.sizes()));
}

void check_positive(int64_t value, const char* name, const char* module) {
  TORCH_CHECK_VALUE(value > 0, module, ": expected ", name, " > 0, got ", value);
}

void check_not_native(functional::Backend backend, const char* what, const char* module) {
  TORCH_CHECK_VALUE(backend != functional::Backend::Native, module, ": Backend::Native has no ",
                    what, "; use Auto, Chunked or Math");
}

void check_head_sizes(int64_t d_in, int64_t d_out, int64_t num_heads, double dropout,
                      const char* module) {
  check_positive(d_in, "d_in", module);
  check_positive(d_out, "d_out", module);
  check_positive(num_heads, "num_heads", module);
  TORCH_CHECK_VALUE(d_out % num_heads == 0, module,
                    ": expected num_heads to divide d_out, got d_out ", d_out, " and num_heads ",
                    num_heads);
  TORCH_CHECK_VALUE(dropout >= 0.0 && dropout < 1.0, module, ": expected dropout in [0, 1), got ",
                    dropout);
}

QKVWeights register_qkv(torch::nn::Module& module, int64_t d_in, int64_t d_in_kv, int64_t d_out_kq,
                        int64_t d_out_v, const char* name) {
  check_positive(d_in, "d_in", name);
  check_positive(d_in_kv, "d_in_kv", name);
  check_positive(d_out_kq, "d_out_kq", name);
  check_positive(d_out_v, "d_out_v", name);
  QKVWeights w;
  w.W_query = module.register_parameter("W_query", torch::rand({d_in, d_out_kq}));
  w.W_key = module.register_parameter("W_key", torch::rand({d_in_kv, d_out_kq}));
  w.W_value = module.register_parameter("W_value", torch::rand({d_in_kv, d_out_v}));
  return w;
}

void check_cache_append(const torch::Tensor& keys, const torch::Tensor& values,
                        const torch::Tensor& cached, const char* cache) {
  TORCH_CHECK_VALUE(
      keys.defined() && values.defined() && keys.dim() == 4 && values.sizes() == keys.sizes(),
      cache, ": expected keys and values of one shape (B, Hkv, T, head_dim), got ",
      keys.defined() ? shape_str(keys.sizes()) : "undefined", " and ",
      values.defined() ? shape_str(values.sizes()) : "undefined");
  TORCH_CHECK_TYPE(
      c10::isFloatingType(keys.scalar_type()) && values.scalar_type() == keys.scalar_type(), cache,
      ": expected floating keys and values of one dtype, got ", keys.scalar_type(), " and ",
      values.scalar_type());
  TORCH_CHECK(values.device() == keys.device(), cache,
              ": expected keys and values on one device, got ", keys.device(), " and ",
              values.device());
  if (cached.defined()) {
    TORCH_CHECK_VALUE(keys.size(0) == cached.size(0) && keys.size(1) == cached.size(1) &&
                          keys.size(3) == cached.size(3),
                      cache, ": expected keys (", cached.size(0), ", ", cached.size(1), ", T, ",
                      cached.size(3), ") like the cached ones, got ", shape_str(keys.sizes()));
    TORCH_CHECK_TYPE(keys.scalar_type() == cached.scalar_type(), cache,
                     ": expected keys and values of dtype ", cached.scalar_type(), ", got ",
                     keys.scalar_type(), " and ", values.scalar_type());
    TORCH_CHECK(keys.device() == cached.device(), cache, ": expected keys and values on ",
                cached.device(), ", got ", keys.device(), " and ", values.device());
  }
}

}  // namespace detail
}  // namespace attention
