// A packed problem computed one sequence at a time, by a kernel that knows nothing of packing:
// the reference path of varlen_attention (Math), Native's, and Chunked's where its fused CPU
// kernels do not apply (the device-generic tiles).

#include "kernels/kernels.h"

#include <torch/torch.h>

#include <vector>

namespace attention {
namespace kernels {

functional::AttentionOutput each_sequence(const Problem& p, const torch::Tensor& query,
                                          const torch::Tensor& key, const torch::Tensor& value,
                                          Kernel kernel) {
  const Sequences& sequences = *p.sequences;
  if (p.t_q == 0) {
    // No query in any sequence: the empty output of the whole, still tied to the inputs for
    // autograd.
    Problem whole = p;
    whole.sequences = nullptr;
    return math(whole, query, key, value);
  }
  std::vector<torch::Tensor> parts;  // (Tq_s, H, dv) each, joined along the packed tokens
  for (int64_t s = 0; s < sequences.count(); ++s) {
    const int64_t t_q = sequences.queries(s), t_k = sequences.keys(s);
    if (t_q == 0) continue;
    // Its block mask and relative bias as the dense mask they expand to: these kernels read
    // whole masks.
    const Problem one = with_dense_block_mask(with_dense_relative_bias(p.sequence(s)));
    const auto keys = [&](const torch::Tensor& t) {
      return t.narrow(1, sequences.key_begin(s), t_k);
    };
    const auto q = query.narrow(1, sequences.query_begin(s), t_q);
    const auto out = (one.degenerate() ? math : kernel)(one, q, keys(key), keys(value)).output;
    parts.push_back(out.transpose(0, 1));
  }
  return {torch::cat(parts, 0).transpose(0, 1), {}};
}

}  // namespace kernels
}  // namespace attention
