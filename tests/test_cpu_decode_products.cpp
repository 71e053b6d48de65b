// The paged forward's products of each instruction set this processor runs (AVX-512F, AVX2 with
// FMA, and the 128-bit set: SSE4 on x86-64, NEON on aarch64: kernels/cpu/decode_products.h) against
// sums in double written here: scores of 1 to 33 rows against 1 to 40 keys that lie apart (groups
// of keys full and short), and the weighted values added to a running output, over feature counts
// that fill 1 to 17 vectors, float, bfloat16 and 8-bit codes with a scale per row; a value that a
// row gives no weight never reaches the row, NaN included (for 8-bit rows: a NaN or infinite
// scale). The paged goldens and differential tests run on the set decode_products() takes; ctest's
// chunked.avx2_softmax, paged.sse4_products and chunked.portable_softmax run them on AVX2's, SSE4's
// and on the portable loops (chunked.neon_softmax on NEON's on aarch64).

#include "kernels/cpu/decode_products.h"
#include "kernels/cpu/query_codes.h"

#include <torch/torch.h>
#include "catch_compat.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace cpu = attention::kernels::cpu;

namespace {

std::vector<const cpu::DecodeProducts*> runnable_products() {
  std::vector<const cpu::DecodeProducts*> sets = cpu::supported_decode_products();
  if (sets.empty()) WARN("skipped: this processor runs none of the vector routes");
  return sets;
}

// Feature counts of the given numbers of a set's vectors.
std::vector<int64_t> feature_counts(const cpu::DecodeProducts* set,
                                    std::initializer_list<int64_t> vectors) {
  std::vector<int64_t> counts;
  for (const int64_t v : vectors) counts.push_back(v * set->lanes);
  return counts;
}

float widened(uint16_t bits) {
  const uint32_t word = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &word, sizeof f);
  return f;
}

// `count` rows of `width` features, each row its own allocation (as pages scatter them), filled
// from N(0, 1): as float, and as bfloat16's bits with their widened values.
struct Rows {
  std::vector<std::vector<float>> f;
  std::vector<std::vector<uint16_t>> b;
  std::vector<const float*> f_ptr;
  std::vector<const uint16_t*> b_ptr;
  Rows(int64_t count, int64_t width, uint64_t seed) {
    torch::manual_seed(seed);
    const auto values = torch::randn({count, width});
    const auto halves = values.to(torch::kBFloat16);
    for (int64_t j = 0; j < count; ++j) {
      f.emplace_back(values[j].data_ptr<float>(), values[j].data_ptr<float>() + width);
      const auto* bits = reinterpret_cast<const uint16_t*>(halves[j].data_ptr<at::BFloat16>());
      b.emplace_back(bits, bits + width);
    }
    // Reversed, so that neighbouring pointers do not point to neighbouring rows.
    for (int64_t j = count - 1; j >= 0; --j) {
      f_ptr.push_back(f[j].data());
      b_ptr.push_back(b[j].data());
    }
  }
  double at(bool bf16, int64_t j, int64_t c) const {
    return bf16 ? widened(b_ptr[j][c]) : f_ptr[j][c];
  }
};

// Whether the scores' padding, columns [cols, ld) of each row (filled with -7 before the
// products), is as it was.
bool padding_kept(const std::vector<float>& s, int64_t rows, int64_t cols, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = cols; j < ld; ++j) {
      if (s[r * ld + j] != -7.0f) return false;
    }
  }
  return true;
}

std::vector<float> random_floats(int64_t count, uint64_t seed) {
  torch::manual_seed(seed);
  const auto t = torch::randn({count});
  return std::vector<float>(t.data_ptr<float>(), t.data_ptr<float>() + count);
}

// Rows' weights of `cols` keys, `ld` apart: only row 1 gives key 0 a weight (0.5), and no row
// gives one to keys 1, 4, 7...
std::vector<float> weights_with_zeros(int64_t rows, int64_t cols, int64_t ld) {
  auto p = random_floats(rows * ld, 5 + rows);
  for (int64_t r = 0; r < rows; ++r) {
    p[r * ld + 0] = r == 1 ? 0.5f : 0.0f;
    for (int64_t j = 1; j < cols; j += 3) p[r * ld + j] = 0.0f;
  }
  return p;
}

// Whether `acc` is `start` plus each row's weighted values value(j, c), over the keys the row
// gives a weight, within `roundings` units of rounding of the terms' magnitude, and NaN or
// infinite where that sum in double is.
template <typename Value>
bool adds_weighted_values(const std::vector<float>& p, int64_t ld, int64_t rows, int64_t cols,
                          const std::vector<float>& start, const std::vector<float>& acc,
                          int64_t dv, int64_t roundings, const Value& value) {
  bool all_close = true;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < dv; ++c) {
      double exact = start[r * dv + c], magnitude = std::abs(exact);
      for (int64_t j = 0; j < cols; ++j) {
        if (p[r * ld + j] == 0.0f) continue;
        const double term = p[r * ld + j] * value(j, c);
        exact += term;
        magnitude += std::abs(term);
      }
      const double got = acc[r * dv + c];
      const bool same_kind = std::isnan(exact)   ? std::isnan(got)
                             : std::isinf(exact) ? got == exact
                                                 : std::isfinite(got);
      const double bound = static_cast<double>(roundings) * 6e-8 * magnitude;
      all_close =
          all_close && same_kind && (!std::isfinite(exact) || std::abs(got - exact) <= bound);
    }
  }
  return all_close;
}

}  // namespace

TEST_CASE("cpu decode products: scores equal sums in double", "[paged]") {
  for (const cpu::DecodeProducts* set : runnable_products()) {
    for (const bool bf16 : {false, true}) {
      for (const int64_t d : feature_counts(set, {1, 3, 7, 8, 17})) {
        for (const int64_t rows :
             {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{6}, int64_t{33}}) {
          for (const int64_t cols :
               {int64_t{1}, int64_t{7}, int64_t{16}, int64_t{17}, int64_t{40}}) {
            INFO(set->name << (bf16 ? " bfloat16" : " float") << " d=" << d << " rows=" << rows
                           << " cols=" << cols);
            const Rows keys(cols, d, 7 + cols);
            const auto q = random_floats(rows * d, 11 + d);
            const int64_t ld = cols + 5;
            std::vector<float> s(rows * ld, -7.0f);  // the padding past cols must stay
            if (bf16) {
              set->scores_bf16(q.data(), rows, d, keys.b_ptr.data(), cols, s.data(), ld);
            } else {
              set->scores(q.data(), rows, d, keys.f_ptr.data(), cols, s.data(), ld);
            }
            bool all_close = true;
            for (int64_t r = 0; r < rows; ++r) {
              for (int64_t j = 0; j < cols; ++j) {
                double exact = 0, magnitude = 0;
                for (int64_t c = 0; c < d; ++c) {
                  exact += q[r * d + c] * keys.at(bf16, j, c);
                  magnitude += std::abs(q[r * d + c] * keys.at(bf16, j, c));
                }
                // A float sum of d terms is within d units of rounding of their magnitude.
                const double bound = static_cast<double>(d) * 6e-8 * magnitude;
                all_close = all_close && std::abs(s[r * ld + j] - exact) <= bound;
              }
            }
            CHECK(all_close);
            CHECK(padding_kept(s, rows, cols, ld));
          }
        }
      }
    }
  }
}

TEST_CASE("cpu decode products: weighted values add to the output, zero weights read nothing",
          "[paged]") {
  for (const cpu::DecodeProducts* set : runnable_products()) {
    for (const bool bf16 : {false, true}) {
      for (const int64_t dv : feature_counts(set, {1, 3, 7, 8, 17})) {
        for (const int64_t rows :
             {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{6}, int64_t{33}}) {
          for (const int64_t cols : {int64_t{1}, int64_t{7}, int64_t{17}, int64_t{40}}) {
            INFO(set->name << (bf16 ? " bfloat16" : " float") << " dv=" << dv << " rows=" << rows
                           << " cols=" << cols);
            Rows values(cols, dv, 3 + cols);
            // Key 0's value (the last row stored: the pointers run backwards) holds a NaN and an
            // infinity; only row 1 gives key 0 a weight.
            values.f[cols - 1][dv / 2] = std::numeric_limits<float>::quiet_NaN();
            values.f[cols - 1][dv - 1] = std::numeric_limits<float>::infinity();
            values.b[cols - 1][dv / 2] = 0x7FC0;  // bfloat16 NaN
            values.b[cols - 1][dv - 1] = 0x7F80;  // bfloat16 +inf
            const int64_t ld = cols + 3;
            const auto p = weights_with_zeros(rows, cols, ld);
            auto acc = random_floats(rows * dv, 9 + dv);
            const auto start = acc;
            if (bf16) {
              set->values_bf16(p.data(), ld, rows, values.b_ptr.data(), cols, acc.data(), dv);
            } else {
              set->values(p.data(), ld, rows, values.f_ptr.data(), cols, acc.data(), dv);
            }
            CHECK(
                adds_weighted_values(p, ld, rows, cols, start, acc, dv, cols + 1,
                                     [&](int64_t j, int64_t c) { return values.at(bf16, j, c); }));
          }
        }
      }
    }
  }
}

TEST_CASE("cpu decode products: bfloat16 rows in blocks equal one row at a time, bit for bit",
          "[paged]") {
  for (const cpu::DecodeProducts* set : runnable_products()) {
    // Blocks of 4 and 3 rows; 100 keys cross the values' runs of 64.
    for (const int64_t cols : {int64_t{19}, int64_t{100}}) {
      const int64_t d = 3 * set->lanes, rows = 7;
      INFO(set->name << " cols=" << cols);
      Rows keys(cols, d, 21);
      keys.b[cols - 1][1] = 0x7FC0;  // a NaN in key 0's value (the pointers run backwards)
      const auto q = random_floats(rows * d, 23);
      const int64_t ld = cols + 2;
      std::vector<float> together(rows * ld, -7.0f), alone(rows * ld, -7.0f);
      set->scores_bf16(q.data(), rows, d, keys.b_ptr.data(), cols, together.data(), ld);
      for (int64_t r = 0; r < rows; ++r) {
        set->scores_bf16(q.data() + r * d, 1, d, keys.b_ptr.data(), cols, alone.data() + r * ld,
                         ld);
      }
      CHECK(std::memcmp(together.data(), alone.data(), together.size() * sizeof(float)) == 0);
      const auto p = weights_with_zeros(rows, cols, ld);
      auto acc_together = random_floats(rows * d, 25);
      auto acc_alone = acc_together;
      set->values_bf16(p.data(), ld, rows, keys.b_ptr.data(), cols, acc_together.data(), d);
      for (int64_t r = 0; r < rows; ++r) {
        set->values_bf16(p.data() + r * ld, ld, 1, keys.b_ptr.data(), cols,
                         acc_alone.data() + r * d, d);
      }
      CHECK(std::memcmp(acc_together.data(), acc_alone.data(), acc_alone.size() * sizeof(float)) ==
            0);
      // Only row 1 weighs key 0, whose value holds the NaN.
      CHECK(std::isnan(acc_together[1 * d + 1]));
      CHECK_FALSE(std::isnan(acc_together[0 * d + 1]));
    }
  }
}

namespace {

// `count` rows of `width` 8-bit codes (-128 to 127), each row its own allocation and the
// pointers reversed (as Rows), and a positive scale per row.
struct CodeRows {
  std::vector<std::vector<int8_t>> codes;
  std::vector<const int8_t*> ptr;
  std::vector<float> scales;
  CodeRows(int64_t count, int64_t width, uint64_t seed) {
    torch::manual_seed(seed);
    const auto drawn = torch::randint(-128, 128, {count, width}, torch::kChar);
    const auto scale = torch::rand({count}) + 0.01;
    for (int64_t j = count - 1; j >= 0; --j) {
      codes.emplace_back(drawn[j].data_ptr<int8_t>(), drawn[j].data_ptr<int8_t>() + width);
    }
    for (const auto& row : codes) ptr.push_back(row.data());
    scales.assign(scale.data_ptr<float>(), scale.data_ptr<float>() + count);
  }
};

}  // namespace

// Rows 1 to 5 cover the 8-bit products' blocks of one to four rows and a block after a full one;
// 70 keys, more than the weights the values' products take at a time (64).
TEST_CASE("cpu decode products: 8-bit scores equal sums in double, times each key's scale",
          "[paged]") {
  for (const cpu::DecodeProducts* set : runnable_products()) {
    for (const int64_t d : feature_counts(set, {1, 3, 7, 8, 17})) {
      for (const int64_t rows :
           {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{5}, int64_t{33}}) {
        for (const int64_t cols : {int64_t{1}, int64_t{3}, int64_t{7}, int64_t{17}, int64_t{70}}) {
          INFO(set->name << " d=" << d << " rows=" << rows << " cols=" << cols);
          CodeRows keys(cols, d, 13 + cols);
          keys.scales[cols - 1] = std::numeric_limits<float>::quiet_NaN();  // its scores are NaN
          const auto q = random_floats(rows * d, 17 + d);
          const int64_t ld = cols + 5;
          std::vector<float> s(rows * ld, -7.0f);  // the padding past cols must stay
          set->scores_i8(q.data(), rows, d, keys.ptr.data(), keys.scales.data(), cols, s.data(),
                         ld);
          bool all_close = true;
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t j = 0; j < cols; ++j) {
              double exact = 0, magnitude = 0;
              for (int64_t c = 0; c < d; ++c) {
                exact += static_cast<double>(q[r * d + c]) * keys.ptr[j][c];
                magnitude += std::abs(static_cast<double>(q[r * d + c]) * keys.ptr[j][c]);
              }
              exact *= keys.scales[j];
              magnitude *= std::abs(keys.scales[j]);
              // d + 1 roundings: the sum's and the scale's.
              const double bound = static_cast<double>(d + 1) * 6e-8 * magnitude;
              const double got = s[r * ld + j];
              all_close = all_close &&
                          (std::isnan(exact) ? std::isnan(got) : std::abs(got - exact) <= bound);
            }
          }
          CHECK(all_close);
          CHECK(padding_kept(s, rows, cols, ld));
        }
      }
    }
  }
}

// dv from one vector to 17 (the products' blocks of one to eight vectors and their remainders).
TEST_CASE(
    "cpu decode products: 8-bit weighted values add to the output, zero weights read "
    "nothing",
    "[paged]") {
  for (const cpu::DecodeProducts* set : runnable_products()) {
    for (const int64_t dv : feature_counts(set, {1, 2, 3, 4, 5, 7, 8, 17})) {
      for (const int64_t rows :
           {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{5}, int64_t{33}}) {
        for (const int64_t cols : {int64_t{1}, int64_t{7}, int64_t{17}, int64_t{70}}) {
          INFO(set->name << " dv=" << dv << " rows=" << rows << " cols=" << cols);
          CodeRows values(cols, dv, 7 + cols);
          // Key 0's scale is NaN and key 1's infinite (where there is one): only row 1 gives
          // key 0 a weight, and no row key 1.
          values.scales[0] = std::numeric_limits<float>::quiet_NaN();
          if (cols > 1) values.scales[1] = std::numeric_limits<float>::infinity();
          const int64_t ld = cols + 3;
          const auto p = weights_with_zeros(rows, cols, ld);  // key 1 has none
          auto acc = random_floats(rows * dv, 9 + dv);
          const auto start = acc;
          set->values_i8(p.data(), ld, rows, values.ptr.data(), values.scales.data(), cols,
                         acc.data(), dv);
          // cols + 2 roundings: the sum's and each weight's product with its scale.
          CHECK(adds_weighted_values(
              p, ld, rows, cols, start, acc, dv, cols + 2, [&](int64_t j, int64_t c) {
                return static_cast<double>(values.scales[j]) * values.ptr[j][c];
              }));
        }
      }
    }
  }
}

// Codes at the extremes (every code at the limit against keys of -128: the largest sums the
// limit allows) and drawn across the range, d from one register of 16-bit codes to 1024 features
// (where the limit is 16383), rows 1 to 33 (blocks of four, two and one), keys in full and short
// groups. The integer sums are exact, so the scores are the exact sums times the two scales
// within float's roundings of the lanes' sums, their tree and the scales.
TEST_CASE("cpu decode products: coded scores are exact integer sums times both scales",
          "[paged][int8_products]") {
  for (const cpu::DecodeProducts* set : runnable_products()) {
    const int64_t step = 2 * set->lanes;
    for (const int64_t d : {step, 2 * step, 3 * step, int64_t{512}, int64_t{1024}}) {
      const int64_t limit = cpu::query_code_limit(d);
      for (const bool extreme : {false, true}) {
        for (const int64_t rows : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{5}, int64_t{33},
                                   set->lanes, 3 * set->lanes}) {
          for (const int64_t cols : {int64_t{1}, int64_t{7}, int64_t{17}, int64_t{70}}) {
            INFO(set->name << " d=" << d << " rows=" << rows << " cols=" << cols << " extreme "
                           << extreme);
            CodeRows keys(cols, d, 29 + cols);
            torch::manual_seed(31 + d);
            auto drawn = torch::randint(-limit, limit + 1, {rows, d}, torch::kShort);
            if (extreme) {
              drawn.fill_(static_cast<int16_t>(limit));
              for (auto& row : keys.codes) std::fill(row.begin(), row.end(), int8_t{-128});
            }
            const std::vector<int16_t> codes(drawn.data_ptr<int16_t>(),
                                             drawn.data_ptr<int16_t>() + rows * d);
            const auto q_scales = random_floats(rows, 37);
            keys.scales[cols - 1] = std::numeric_limits<float>::quiet_NaN();  // NaN scores
            const int64_t ld = cols + 5;
            std::vector<float> s(rows * ld, -7.0f);  // the padding past cols must stay
            set->scores_coded(codes.data(), q_scales.data(), rows, d, keys.ptr.data(),
                              keys.scales.data(), cols, s.data(), ld, nullptr);
            // Asking for rows on the way (here the keys themselves) changes no score, and every
            // line has been asked for on return.
            cpu::RowsAhead ahead(keys.ptr.data(), cols, d);
            std::vector<float> s_asking(rows * ld, -7.0f);
            set->scores_coded(codes.data(), q_scales.data(), rows, d, keys.ptr.data(),
                              keys.scales.data(), cols, s_asking.data(), ld, &ahead);
            CHECK(std::memcmp(s_asking.data(), s.data(), s.size() * sizeof(float)) == 0);
            CHECK(ahead.left() == 0);
            // Rows a multiple of the lanes: the transposed products of many rows too.
            const bool columns = rows % set->lanes == 0;
            std::vector<float> s_t(cols * rows, -7.0f);
            if (columns) {
              std::vector<int32_t> pairs(rows * d / 2), scratch(cpu::kCodedColumnKeys * d / 2);
              cpu::pack_code_pairs(codes.data(), rows, d, pairs.data());
              set->scores_coded_columns(pairs.data(), q_scales.data(), rows, d, keys.ptr.data(),
                                        keys.scales.data(), cols, s_t.data(), rows, scratch.data());
            }
            bool all_close = true;
            for (int64_t r = 0; r < rows; ++r) {
              for (int64_t j = 0; j < cols; ++j) {
                int64_t sum = 0, magnitude = 0;
                for (int64_t c = 0; c < d; ++c) {
                  const int64_t product = int64_t{codes[r * d + c]} * keys.ptr[j][c];
                  sum += product;
                  magnitude += product < 0 ? -product : product;
                }
                const double scales = static_cast<double>(q_scales[r]) * keys.scales[j];
                const double exact = static_cast<double>(sum) * scales;
                // The lanes' sums and their tree (at most 16 + 4 roundings) and the scales (3).
                const double bound = 23 * 6e-8 * static_cast<double>(magnitude) * std::abs(scales);
                for (const float got :
                     {s[r * ld + j], columns ? s_t[j * rows + r] : s[r * ld + j]}) {
                  all_close = all_close && (std::isnan(exact) ? std::isnan(got)
                                                              : std::abs(got - exact) <= bound);
                }
              }
            }
            CHECK(all_close);
            CHECK(padding_kept(s, rows, cols, ld));
          }
        }
      }
    }
  }
}

// Each row's weights (times the keys' scales) over each run of 256 keys coded as stated
// (decode_products.h: the run's largest / 32767, rounded to nearest): the integer sums are exact,
// so the output is the coded weights' sums within a few float roundings, and within half a code
// scale per key of the uncoded sums. Row 1 weighs a key whose scale is NaN: its run takes the
// float products, and the row is NaN. Runs of 1 to 300 keys (two runs), odd and even; blocks of
// 1 to 8 rows and a block after full ones.
TEST_CASE("cpu decode products: coded weights' values equal the stated coding's sums",
          "[paged][int8_products]") {
  for (const cpu::DecodeProducts* set : runnable_products()) {
    for (const int64_t dv : feature_counts(set, {2, 4, 6})) {
      for (const int64_t rows : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{8}, int64_t{9},
                                 int64_t{33}, 2 * set->lanes, 3 * set->lanes, 4 * set->lanes}) {
        for (const int64_t cols : {int64_t{1}, int64_t{7}, int64_t{70}, int64_t{300}}) {
          INFO(set->name << " dv=" << dv << " rows=" << rows << " cols=" << cols);
          CodeRows values(cols, dv, 43 + cols);
          values.scales[0] = std::numeric_limits<float>::quiet_NaN();  // weighed by row 1 only
          const int64_t ld = cols + 3;
          const auto p = weights_with_zeros(rows, cols, ld);
          auto acc = random_floats(rows * dv, 47 + dv);
          const auto start = acc;
          set->values_coded(p.data(), ld, rows, values.ptr.data(), values.scales.data(), cols,
                            acc.data(), dv, nullptr, nullptr);
          // Asking for rows on the way changes no sum, and every line is asked for on return.
          cpu::RowsAhead ahead(values.ptr.data(), cols, dv);
          auto acc_asking = start;
          set->values_coded(p.data(), ld, rows, values.ptr.data(), values.scales.data(), cols,
                            acc_asking.data(), dv, &ahead, nullptr);
          CHECK(std::memcmp(acc_asking.data(), acc.data(), acc.size() * sizeof(float)) == 0);
          CHECK(ahead.left() == 0);
          // With scratch, rows a multiple of the lanes (and at least twice them) take the rows
          // across lanes: the same integer sums, held to the same bounds below.
          cpu::RowsAhead columns_ahead(values.ptr.data(), cols, dv);
          std::vector<int32_t> words(cpu::coded_values_scratch_words(rows, dv), -1);
          auto acc_columns = start;
          set->values_coded(p.data(), ld, rows, values.ptr.data(), values.scales.data(), cols,
                            acc_columns.data(), dv, &columns_ahead, words.data());
          CHECK(columns_ahead.left() == 0);
          bool as_coded = true, within_half_a_code = true, nan_kept = true;
          for (int64_t r = 0; r < rows; ++r) {
            std::vector<double> coded(start.begin() + r * dv, start.begin() + (r + 1) * dv);
            std::vector<double> magnitude(dv), exact(coded), slack(dv, 0.0);
            for (int64_t c = 0; c < dv; ++c) magnitude[c] = std::abs(coded[c]);
            for (int64_t j0 = 0; j0 < cols; j0 += 256) {
              const int64_t m = std::min<int64_t>(256, cols - j0);
              std::vector<float> w(m);
              float top = 0;
              for (int64_t j = 0; j < m; ++j) {
                const float weight = p[r * ld + j0 + j];
                w[j] = weight == 0.0f ? 0.0f : weight * values.scales[j0 + j];
                top = std::max(top, std::abs(w[j]));
              }
              const float scale = top / 32767.0f;
              const bool finite =
                  std::all_of(w.begin(), w.end(), [](float x) { return std::isfinite(x); });
              if (!finite) {  // the float products: NaN here
                for (int64_t c = 0; c < dv; ++c)
                  coded[c] = std::numeric_limits<double>::quiet_NaN();
                continue;
              }
              for (int64_t c = 0; c < dv; ++c) {
                int64_t sum = 0, size = 0;
                for (int64_t j = 0; j < m; ++j) {
                  const int64_t code = top == 0 ? 0 : std::llrint(std::nearbyint(w[j] / scale));
                  const int64_t v = values.ptr[j0 + j][c];
                  sum += code * v;
                  size += std::abs(code * v);
                  exact[c] += static_cast<double>(w[j]) * static_cast<double>(v);
                  slack[c] += scale * 0.5 * std::abs(static_cast<double>(v));
                }
                coded[c] += static_cast<double>(scale) * static_cast<double>(sum);
                magnitude[c] += static_cast<double>(scale) * static_cast<double>(size);
              }
            }
            for (int64_t c = 0; c < dv; ++c) {
              for (const double got : {acc[r * dv + c], acc_columns[r * dv + c]}) {
                if (std::isnan(coded[c])) {
                  nan_kept = nan_kept && std::isnan(got);
                  continue;
                }
                // The sum's conversion to float, its scaling and its addition to the output.
                as_coded = as_coded && std::abs(got - coded[c]) <= 4 * 6e-8 * magnitude[c];
                within_half_a_code = within_half_a_code &&
                                     std::abs(got - exact[c]) <= slack[c] + 4 * 6e-8 * magnitude[c];
              }
            }
          }
          CHECK(as_coded);
          CHECK(within_half_a_code);
          CHECK(nan_kept);
        }
      }
    }
  }
}

TEST_CASE("query codes: each feature within half a scale, the largest at the limit",
          "[paged][int8_products]") {
  CHECK(cpu::query_code_limit(1) == 32767);
  CHECK(cpu::query_code_limit(512) == 32767);
  CHECK(cpu::query_code_limit(513) == 32704);  // (2^31 - 1) / 128 / 513, rounded down
  CHECK(cpu::query_code_limit(1024) == 16383);
  CHECK(cpu::query_code_limit(0) == 32767);
  CHECK(cpu::query_code_limit(int64_t{1} << 31) == 1);
  CHECK(cpu::query_code_limit(std::numeric_limits<int64_t>::max()) == 1);
  for (const int64_t d : {int64_t{1}, int64_t{64}, int64_t{1024}}) {
    INFO("d=" << d);
    auto q = random_floats(d, 41 + d);
    q[0] = -3.5f;  // the largest magnitude: code -limit
    for (float& x : q) x = std::clamp(x, -3.4f, 3.4f);
    q[0] = -3.5f;
    std::vector<int16_t> codes(d, 99);
    float scale = -1;
    REQUIRE(cpu::code_query_row(q.data(), d, codes.data(), &scale));
    const double limit = static_cast<double>(cpu::query_code_limit(d));
    CHECK(scale == static_cast<float>(3.5 / limit));
    CHECK(codes[0] == -limit);
    bool within = true;
    for (int64_t c = 0; c < d; ++c) {
      within = within && std::abs(codes[c]) <= limit &&
               std::abs(static_cast<double>(codes[c]) * scale - q[c]) <= scale * 0.5000001;
    }
    CHECK(within);
  }
  // A row of zeros: scale 0. A row the codes cannot hold keeps its float products: nothing is
  // written.
  std::vector<float> zeros(8, 0.0f);
  std::vector<int16_t> codes(8, 99);
  float scale = -1;
  CHECK(cpu::code_query_row(zeros.data(), 8, codes.data(), &scale));
  CHECK(scale == 0.0f);
  CHECK(codes == std::vector<int16_t>(8, 0));
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::denorm_min()}) {
    std::vector<float> row(8, 0.0f);
    row[3] = bad;
    std::vector<int16_t> kept(8, 99);
    float kept_scale = -1;
    INFO("value " << bad);
    CHECK_FALSE(cpu::code_query_row(row.data(), 8, kept.data(), &kept_scale));
    CHECK(kept == std::vector<int16_t>(8, 99));
    CHECK(kept_scale == -1.0f);
  }
}

TEST_CASE("cpu decode products: the set follows the processor and ATTENTION_CPU_VECTOR",
          "[paged]") {
  const char* forced = std::getenv("ATTENTION_CPU_VECTOR");
  const std::string asked = forced != nullptr ? forced : "";
  const std::vector<const cpu::DecodeProducts*> supported = cpu::supported_decode_products();
  std::vector<std::string> names;
  for (const cpu::DecodeProducts* set : supported) names.emplace_back(set->name);
#if defined(__x86_64__)
  std::vector<std::string> expected_names;
  // Highway's AVX3_DL target asks for Ice Lake's AVX-512 extensions, VNNI among them (and VAES
  // and VPCLMULQDQ, which every processor with these has and not every compiler here names).
  if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi") &&
      __builtin_cpu_supports("avx512vbmi2") && __builtin_cpu_supports("avx512bitalg") &&
      __builtin_cpu_supports("avx512vpopcntdq")) {
    expected_names.emplace_back("avx512_vnni");
  }
  if (__builtin_cpu_supports("avx512f")) expected_names.emplace_back("avx512");
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    expected_names.emplace_back("avx2");
  }
  // Highway's SSE4 target asks for AES and CLMUL as well.
  if (__builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("aes") &&
      __builtin_cpu_supports("pclmul")) {
    expected_names.emplace_back("sse4");
  }
  CHECK(names == expected_names);
#elif defined(__aarch64__)
  CHECK(names == std::vector<std::string>{"neon"});
#endif
  const cpu::DecodeProducts* expected = supported.empty() ? nullptr : supported.front();
  for (const cpu::DecodeProducts* set : supported) {
    if (asked == set->name) expected = set;
    CHECK(set->lanes > 0);
  }
  if (asked == "portable") expected = nullptr;
  CHECK(cpu::decode_products() == expected);
}
