// Relative position buckets (attention/relative_bias.h): T5's, computed with LibTorch's ops in
// the dtypes T5's Python code uses, so that a position on a bucket's edge lands in the bucket
// Python gives it; and one bucket per distance.

#include <attention/relative_bias.h>

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <cmath>

namespace attention {
namespace functional {
namespace {

// The longest distance a table is described for: far beyond any context, and short of the sizes
// where 2 max_distance + 1 buckets or the logarithm's arguments would overflow.
constexpr int64_t kMaxRelativeDistance = int64_t{1} << 30;

// T5's limits, which t5() checks and states: num_buckets from `least` and the distances beyond
// the `exact` range.
int64_t t5_least(bool bidirectional) {
  return bidirectional ? 4 : 2;
}
int64_t t5_exact(int64_t num_buckets, bool bidirectional) {
  return (bidirectional ? num_buckets / 2 : num_buckets) / 2;
}

}  // namespace

RelativeBuckets RelativeBuckets::t5(int64_t num_buckets, int64_t max_distance, bool bidirectional) {
  constexpr const char* kName = "attention::functional::RelativeBuckets::t5";
  const int64_t least = t5_least(bidirectional);
  TORCH_CHECK_VALUE(num_buckets >= least && num_buckets <= kMaxRelativeDistance, kName,
                    ": expected ", least, " <= num_buckets <= 2^30 (", bidirectional ? "bi" : "uni",
                    "directional), got ", num_buckets);
  const int64_t exact = t5_exact(num_buckets, bidirectional);
  TORCH_CHECK_VALUE(max_distance > exact && max_distance <= kMaxRelativeDistance, kName,
                    ": expected max_distance above the exact range (", exact,
                    " positions) and at most 2^30, got ", max_distance);
  RelativeBuckets b;
  b.kind = Kind::T5;
  b.buckets = num_buckets;
  b.max_distance = max_distance;
  b.bidirectional = bidirectional;
  return b;
}

RelativeBuckets RelativeBuckets::distance(int64_t max_distance) {
  TORCH_CHECK_VALUE(max_distance >= 0 && max_distance <= kMaxRelativeDistance,
                    "attention::functional::RelativeBuckets::distance: expected 0 <= max_distance "
                    "<= 2^30, got ",
                    max_distance);
  RelativeBuckets b;
  b.kind = Kind::Distance;
  b.buckets = 2 * max_distance + 1;
  b.max_distance = max_distance;
  return b;
}

torch::Tensor RelativeBuckets::bucket(const torch::Tensor& relative) const {
  // Every position beyond max_distance either way has the bucket of max_distance (T5's last one
  // of its direction): clamped first, so that |INT64_MIN| never overflows.
  const auto r = relative.to(torch::kLong).clamp(-max_distance, max_distance);
  if (kind == Kind::Distance) return r + max_distance;
  // T5: the sign picks a half (bidirectional), or keys after the query share bucket 0.
  int64_t half = buckets;
  torch::Tensor base = torch::zeros_like(r), distance;
  if (bidirectional) {
    half = buckets / 2;
    base = (r > 0).to(torch::kLong) * half;
    distance = r.abs();
  } else {
    distance = -torch::min(r, torch::zeros_like(r));
  }
  const int64_t exact = half / 2;
  // Beyond the exact range: exact + log(d / exact) / log(max_distance / exact) * (half - exact),
  // in float32 as T5's code computes it, truncated, and at most the last bucket.
  const auto large =
      (exact + (torch::log(distance.to(torch::kFloat) / static_cast<double>(exact)) /
                std::log(static_cast<double>(max_distance) / static_cast<double>(exact)) *
                static_cast<double>(half - exact))
                   .to(torch::kLong))
          .clamp_max(half - 1);
  return base + torch::where(distance < exact, distance, large);
}

}  // namespace functional

namespace detail {

void check_relative_buckets(const functional::RelativeBuckets& b, const char* what,
                            const char* caller) {
  bool made = false;
  if (b.kind == functional::RelativeBuckets::Kind::T5) {
    made = b.buckets >= functional::t5_least(b.bidirectional) &&
           b.buckets <= functional::kMaxRelativeDistance &&
           b.max_distance > functional::t5_exact(b.buckets, b.bidirectional) &&
           b.max_distance <= functional::kMaxRelativeDistance;
  } else if (b.kind == functional::RelativeBuckets::Kind::Distance) {
    made = b.max_distance >= 0 && b.max_distance <= functional::kMaxRelativeDistance &&
           b.buckets == 2 * b.max_distance + 1;
  }
  TORCH_CHECK_VALUE(made, caller, ": expected ", what,
                    " as RelativeBuckets::t5() or distance() make them (fields set since), got ",
                    b.kind == functional::RelativeBuckets::Kind::T5         ? "t5"
                    : b.kind == functional::RelativeBuckets::Kind::Distance ? "distance"
                                                                            : "an unknown kind",
                    " with buckets = ", b.buckets, ", max_distance = ", b.max_distance,
                    ", bidirectional = ", b.bidirectional ? "true" : "false");
}

}  // namespace detail
}  // namespace attention
