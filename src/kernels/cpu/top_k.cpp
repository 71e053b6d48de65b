#include "kernels/cpu/top_k.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace attention {
namespace kernels {
namespace cpu {

template <typename T>
void top_k_rows(const T* scores, int64_t rows, int64_t ld, const int64_t* visible, int64_t k,
                int64_t width, int64_t* out) {
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> order;
    for (int64_t r = begin; r < end; ++r) {
      const T* row = scores + r * ld;
      int64_t* chosen = out + r * width;
      const int64_t n = std::max<int64_t>(0, visible[r]), take = std::min(k, n);
      order.resize(n);
      std::iota(order.begin(), order.end(), int64_t{0});
      if (take < n) {
        // Higher first; NaN below everything; the lower column first among equals.
        const auto before = [row](int64_t a, int64_t b) {
          const T x = row[a], y = row[b];
          const bool x_nan = std::isnan(x), y_nan = std::isnan(y);
          if (x_nan != y_nan) return y_nan;
          if (!x_nan && x != y) return x > y;
          return a < b;
        };
        std::nth_element(order.begin(), order.begin() + take, order.end(), before);
        std::sort(order.begin(), order.begin() + take);
      }
      std::copy(order.begin(), order.begin() + take, chosen);
      std::fill(chosen + take, chosen + width, int64_t{-1});
    }
  });
}

template void top_k_rows<float>(const float*, int64_t, int64_t, const int64_t*, int64_t, int64_t,
                                int64_t*);
template void top_k_rows<double>(const double*, int64_t, int64_t, const int64_t*, int64_t, int64_t,
                                 int64_t*);

}  // namespace cpu
}  // namespace kernels
}  // namespace attention
