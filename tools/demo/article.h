#pragma once

// The values Raschka's article prints, to its 4 decimals. The demo checks itself against them and
// so do the tests. They are the only hard-coded expected values in the project: reproducing them
// is the point.

#include <torch/types.h>

#include <limits>
#include <string>
#include <vector>

namespace article {

inline const std::string kSentence = "Life is short, eat dessert first";

// torch.nn.Embedding(50000, 3) under seed 123, rows of sentence_int = [0, 4, 5, 2, 1, 3].
inline const std::vector<int64_t> kSentenceInt = {0, 4, 5, 2, 1, 3};

inline torch::Tensor matrix(std::vector<float> values, int64_t rows, int64_t cols) {
  return torch::tensor(values).view({rows, cols});
}

constexpr float kInf = std::numeric_limits<float>::infinity();

inline torch::Tensor embedded_sentence() {
  return matrix(
      {0.3374f, -0.1778f, -0.3035f, 0.1794f, 1.8951f, 0.4954f, 0.2692f, -0.0770f, -1.0205f,
       -0.2196f, -0.3792f, 0.7671f, -0.5880f, 0.3486f, 0.6603f, -1.1925f, 0.6984f, -1.4097f},
      6, 3);
}

inline torch::Tensor omega_24() {
  return torch::tensor(1.2903f);
}

inline torch::Tensor omega_2() {
  return torch::tensor({-0.6004f, 3.4707f, -1.5023f, 0.4991f, 1.2903f, -1.3374f});
}

inline torch::Tensor attention_weights_2() {
  return torch::tensor({0.0386f, 0.6870f, 0.0204f, 0.0840f, 0.1470f, 0.0229f});
}

inline torch::Tensor context_vector_2() {
  return torch::tensor({0.5313f, 1.3607f, 0.7891f, 1.3110f});
}

// SelfAttention(3, 2, 4) under seed 123. The article prints -0.2627 at [2][2]; PyTorch gives
// -0.26264, so this one value is off by one in its last digit.
inline torch::Tensor self_attention_output() {
  return matrix({-0.1564f, 0.1028f,  -0.0763f, -0.0764f, 0.5313f,  1.3607f,  0.7891f,  1.3110f,
                 -0.3542f, -0.1234f, -0.2627f, -0.3706f, 0.0071f,  0.3345f,  0.0969f,  0.1998f,
                 0.1008f,  0.4780f,  0.2021f,  0.3674f,  -0.5296f, -0.2799f, -0.4107f, -0.6006f},
                6, 4);
}

// SelfAttention(3, 2, 1) under seed 123.
inline torch::Tensor single_head_output() {
  return matrix({-0.0185f, 0.4003f, -0.1103f, 0.0668f, 0.1180f, -0.1827f}, 6, 1);
}

// MultiHeadAttentionWrapper(3, 2, 1, 4) under seed 123.
inline torch::Tensor wrapper_output() {
  return matrix({-0.0185f, 0.0170f,  0.1999f, -0.0860f, 0.4003f,  1.7137f,  1.3981f,  1.0497f,
                 -0.1103f, -0.1609f, 0.0079f, -0.2416f, 0.0668f,  0.3534f,  0.2322f,  0.1008f,
                 0.1180f,  0.6949f,  0.3157f, 0.2807f,  -0.1827f, -0.2060f, -0.2393f, -0.3167f},
                6, 4);
}

inline torch::Tensor attn_scores() {
  return matrix(
      {0.0613f,  -0.3491f, 0.1443f,  -0.0437f, -0.1303f, 0.1076f,  -0.6004f, 3.4707f,  -1.5023f,
       0.4991f,  1.2903f,  -1.3374f, 0.2432f,  -1.3934f, 0.5869f,  -0.1851f, -0.5191f, 0.4730f,
       -0.0794f, 0.4487f,  -0.1807f, 0.0518f,  0.1677f,  -0.1197f, -0.1510f, 0.8626f,  -0.3597f,
       0.1112f,  0.3216f,  -0.2787f, 0.4344f,  -2.5037f, 1.0740f,  -0.3509f, -0.9315f, 0.9265f},
      6, 6);
}

inline torch::Tensor attn_weights() {
  return matrix({0.1772f, 0.1326f, 0.1879f, 0.1645f, 0.1547f, 0.1831f, 0.0386f, 0.6870f, 0.0204f,
                 0.0840f, 0.1470f, 0.0229f, 0.1965f, 0.0618f, 0.2506f, 0.1452f, 0.1146f, 0.2312f,
                 0.1505f, 0.2187f, 0.1401f, 0.1651f, 0.1793f, 0.1463f, 0.1347f, 0.2758f, 0.1162f,
                 0.1621f, 0.1881f, 0.1231f, 0.1973f, 0.0247f, 0.3102f, 0.1132f, 0.0751f, 0.2794f},
                6, 6);
}

inline torch::Tensor mask_simple() {
  return torch::ones({6, 6}).tril();
}

inline torch::Tensor masked_simple() {
  return matrix({0.1772f, 0,       0,       0,       0,       0,       0.0386f, 0.6870f, 0,
                 0,       0,       0,       0.1965f, 0.0618f, 0.2506f, 0,       0,       0,
                 0.1505f, 0.2187f, 0.1401f, 0.1651f, 0,       0,       0.1347f, 0.2758f, 0.1162f,
                 0.1621f, 0.1881f, 0,       0.1973f, 0.0247f, 0.3102f, 0.1132f, 0.0751f, 0.2794f},
                6, 6);
}

// Printed twice: renormalized after masking, and softmax after -inf masking.
inline torch::Tensor causal_weights() {
  return matrix({1.0000f, 0,       0,       0,       0,       0,       0.0532f, 0.9468f, 0,
                 0,       0,       0,       0.3862f, 0.1214f, 0.4924f, 0,       0,       0,
                 0.2232f, 0.3242f, 0.2078f, 0.2449f, 0,       0,       0.1536f, 0.3145f, 0.1325f,
                 0.1849f, 0.2145f, 0,       0.1973f, 0.0247f, 0.3102f, 0.1132f, 0.0751f, 0.2794f},
                6, 6);
}

inline torch::Tensor masked_scores() {
  return matrix(
      {0.0613f,  -kInf,   -kInf,    -kInf,   -kInf,    -kInf,   -0.6004f, 3.4707f,  -kInf,
       -kInf,    -kInf,   -kInf,    0.2432f, -1.3934f, 0.5869f, -kInf,    -kInf,    -kInf,
       -0.0794f, 0.4487f, -0.1807f, 0.0518f, -kInf,    -kInf,   -0.1510f, 0.8626f,  -0.3597f,
       0.1112f,  0.3216f, -kInf,    0.4344f, -2.5037f, 1.0740f, -0.3509f, -0.9315f, 0.9265f},
      6, 6);
}

// CrossAttention(3, 2, 4) under seed 123, then x_2 = torch.rand(8, 3).
inline torch::Tensor cross_attention_output() {
  return matrix({0.4231f, 0.8665f, 0.6503f, 1.0042f, 0.4874f, 0.9718f, 0.7359f, 1.1353f,
                 0.4054f, 0.8359f, 0.6258f, 0.9667f, 0.4357f, 0.8886f, 0.6678f, 1.0311f,
                 0.4429f, 0.9006f, 0.6775f, 1.0460f, 0.3860f, 0.8021f, 0.5985f, 0.9250f},
                6, 4);
}

// How far a computed value may be from the printed one: the article prints 4 decimals, and one
// of its values is off by one in the last digit.
constexpr double kTolerance = 1e-4;

// Number of elements of `computed`, rounded to 4 decimals, within kTolerance of `printed`
// (infinities must match exactly).
inline int64_t count_matching(const torch::Tensor& computed, const torch::Tensor& printed) {
  auto c = computed.detach().to(torch::kDouble).reshape({-1});
  auto p = printed.to(torch::kDouble).reshape({-1});
  if (c.numel() != p.numel()) return 0;
  auto rounded = (c * 1e4).round() / 1e4;
  auto close = (rounded - p).abs() <= kTolerance + 1e-9;
  auto same_inf = c.isinf() & (c == p);
  return (close | same_inf).sum().item<int64_t>();
}

}  // namespace article
