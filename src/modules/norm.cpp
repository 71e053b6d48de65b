#include <attention/norm.h>

#include "checks.h"
#include "modules/shared.h"

#include <torch/torch.h>

#include <cmath>

namespace attention {

namespace {
constexpr const char* kNormName = "attention::Norm";

const char* kind_name(NormKind kind) {
  switch (kind) {
    case NormKind::RMS:
      return "RMS";
    case NormKind::ZeroCenteredRMS:
      return "ZeroCenteredRMS";
    case NormKind::LayerNorm:
      return "LayerNorm";
  }
  return "?";
}
}  // namespace

NormImpl::NormImpl(const NormOptions& options_) : options(options_) {
  reset();
}

void NormImpl::reset() {
  const auto& o = options;
  detail::check_positive(o.normalized_shape(), "normalized_shape", kNormName);
  TORCH_CHECK_VALUE(std::isfinite(o.eps()) && o.eps() >= 0.0, kNormName,
                    ": expected a finite eps >= 0, got ", o.eps());
  if (!o.elementwise_affine()) {
    weight = torch::Tensor();
    return;
  }
  const bool zero_centred = o.kind() == NormKind::ZeroCenteredRMS;
  const char* name = o.parameter_name() == NormParameter::Scale ? "scale" : "weight";
  weight = register_parameter(name, zero_centred ? torch::zeros({o.normalized_shape()})
                                                 : torch::ones({o.normalized_shape()}));
}

void NormImpl::pretty_print(std::ostream& stream) const {
  const auto& o = options;
  stream << kNormName << "(" << o.normalized_shape() << ", kind=" << kind_name(o.kind())
         << ", eps=" << o.eps();
  if (!o.elementwise_affine()) stream << ", elementwise_affine=false";
  if (o.parameter_name() == NormParameter::Scale) stream << ", parameter_name=scale";
  stream << ")";
}

torch::Tensor NormImpl::forward(const torch::Tensor& x) {
  const auto& o = options;
  TORCH_CHECK_VALUE(x.defined() && x.dim() >= 1 && x.size(-1) == o.normalized_shape(), kNormName,
                    ": expected input whose last dimension is ", o.normalized_shape(), ", got ",
                    x.defined() ? detail::shape_str(x.sizes()) : std::string("undefined"));
  TORCH_CHECK_TYPE(x.is_floating_point(), kNormName, ": expected a floating input, got ",
                   x.scalar_type());
  TORCH_CHECK_TYPE(!weight.defined() || x.scalar_type() == weight.scalar_type(), kNormName,
                   ": expected input of the weight's dtype ", weight.scalar_type(), ", got ",
                   x.scalar_type());
  TORCH_CHECK(!weight.defined() || x.device() == weight.device(), kNormName,
              ": expected input on the weight's device ", weight.device(), ", got ", x.device());
  // Reduced precision is computed in float and rounded once, as the book's classes do.
  const auto dtype = x.scalar_type();
  const bool widen = dtype == at::kBFloat16 || dtype == at::kHalf;
  auto h = widen ? x.to(at::kFloat) : x;
  if (o.kind() == NormKind::LayerNorm) h = h - h.mean(-1, /*keepdim=*/true);
  h = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + o.eps());
  if (weight.defined()) {
    const auto w = widen ? weight.to(at::kFloat) : weight;
    h = o.kind() == NormKind::ZeroCenteredRMS ? h * (1 + w) : h * w;
  }
  return widen ? h.to(dtype) : h;
}

}  // namespace attention
