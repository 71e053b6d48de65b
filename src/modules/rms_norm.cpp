#include <attention/rms_norm.h>

#include "checks.h"
#include "modules/shared.h"

#include <torch/torch.h>

#include <cmath>

namespace attention {

namespace {
constexpr const char* kRMSNormName = "attention::RMSNorm";
}  // namespace

RMSNormImpl::RMSNormImpl(const RMSNormOptions& options_) : options(options_) {
  reset();
}

void RMSNormImpl::reset() {
  detail::check_positive(options.normalized_shape(), "normalized_shape", kRMSNormName);
  // An infinite eps would make every output 0.
  TORCH_CHECK_VALUE(std::isfinite(options.eps()) && options.eps() >= 0.0, kRMSNormName,
                    ": expected a finite eps >= 0, got ", options.eps());
  weight = register_parameter("weight", torch::ones({options.normalized_shape()}));
}

void RMSNormImpl::pretty_print(std::ostream& stream) const {
  stream << kRMSNormName << "(" << options.normalized_shape() << ", eps=" << options.eps() << ")";
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  TORCH_CHECK_VALUE(x.defined() && x.dim() >= 1 && x.size(-1) == options.normalized_shape(),
                    kRMSNormName, ": expected input whose last dimension is ",
                    options.normalized_shape(), ", got ",
                    x.defined() ? detail::shape_str(x.sizes()) : std::string("undefined"));
  TORCH_CHECK_TYPE(x.scalar_type() == weight.scalar_type(), kRMSNormName,
                   ": expected input of the weight's dtype ", weight.scalar_type(), ", got ",
                   x.scalar_type());
  TORCH_CHECK(x.device() == weight.device(), kRMSNormName,
              ": expected input on the weight's device ", weight.device(), ", got ", x.device());
  return x * torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + options.eps()) * weight;
}

}  // namespace attention
