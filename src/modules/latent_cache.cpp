#include <attention/latent_cache.h>

#include "modules/shared.h"

#include <torch/torch.h>

namespace attention {

namespace {
constexpr const char* kLatentCacheName = "attention::LatentCache";
}

LatentCache::LatentCache(int64_t max_length) : max_length_(max_length) {
  detail::check_positive(max_length, "max_length", kLatentCacheName);
}

torch::Tensor LatentCache::append(const torch::Tensor& latent) {
  TORCH_CHECK_VALUE(latent.defined() && latent.dim() == 3, kLatentCacheName,
                    ": expected a latent (B, T, latent_dim), got ",
                    latent.defined() ? detail::shape_str(latent.sizes()) : "undefined");
  TORCH_CHECK_TYPE(c10::isFloatingType(latent.scalar_type()), kLatentCacheName,
                   ": expected a floating latent, got ", latent.scalar_type());
  if (storage_.defined()) {
    TORCH_CHECK_VALUE(latent.size(0) == storage_.size(0) && latent.size(2) == storage_.size(2),
                      kLatentCacheName, ": expected a latent (", storage_.size(0), ", T, ",
                      storage_.size(2), ") like the cached one, got ",
                      detail::shape_str(latent.sizes()));
    TORCH_CHECK_TYPE(latent.scalar_type() == storage_.scalar_type(), kLatentCacheName,
                     ": expected a latent of dtype ", storage_.scalar_type(),
                     " like the cached one, got ", latent.scalar_type());
    TORCH_CHECK(latent.device() == storage_.device(), kLatentCacheName,
                ": expected a latent on device ", storage_.device(), " like the cached one, got ",
                latent.device());
  }
  const int64_t cached = length_, t_new = latent.size(1);
  TORCH_CHECK_VALUE(t_new <= max_length_ - cached, kLatentCacheName, ": cannot append ", t_new,
                    " token(s) to the ", cached, " cached: max_length is ", max_length_,
                    " (reset() the cache or make a longer one)");
  if (!storage_.defined()) {
    const std::vector<int64_t> sizes = {latent.size(0), max_length_, latent.size(2)};
    TORCH_CHECK_VALUE(detail::fits_in_bytes(sizes, static_cast<int64_t>(latent.element_size())),
                      kLatentCacheName, ": storage for max_length = ", max_length_, " tokens of (",
                      latent.size(0), ", T, ", latent.size(2), ") would exceed 2^63 - 1 bytes");
    storage_ = torch::empty(sizes, latent.options());
  }
  // The cache holds values, not history: no gradient flows into earlier steps.
  storage_.narrow(1, cached, t_new).copy_(latent.detach());
  length_ += t_new;
  if (!detail::records_grad(latent)) return this->latent();
  return torch::cat({storage_.narrow(1, 0, cached), latent}, 1);
}

void LatentCache::truncate(int64_t length) {
  TORCH_CHECK_VALUE(length >= 0 && length <= length_, kLatentCacheName, ": cannot truncate to ",
                    length, " tokens: ", length_, " are cached");
  length_ = length;
}

torch::Tensor LatentCache::latent() const {
  return storage_.defined() ? storage_.narrow(1, 0, length_) : torch::Tensor();
}

int64_t LatentCache::bytes_per_token() const {
  return storage_.defined() ? storage_.size(2) * static_cast<int64_t>(storage_.element_size()) : 0;
}

}  // namespace attention
