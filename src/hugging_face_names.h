#pragma once

// Hugging Face checkpoints of the book's chapter-5 zoo under the book's names (the layouts
// WeightLayout::HuggingFace*): the converter load_weights() calls, and what it checks of the
// module's norms.

#include <attention/safetensors.h>
#include <attention/weights.h>

#include "weight_names.h"

#include <string>
#include <vector>

namespace attention {
namespace detail {

/// Whether `layout` is one of WeightLayout::HuggingFace*.
bool is_hugging_face(WeightLayout layout);

/// Whether the checkpoints of `layout` store their norms zero-centred (Gemma 3, Qwen3.5): their
/// weights stand for 1 + w, so the module's norms must be NormKind::ZeroCenteredRMS (and those of
/// the other layouts must not be).
bool zero_centred_norms(WeightLayout layout);

/// The file's names under the book's (this library's modules within the book's model), an
/// out_head from the embedding when the checkpoint has no lm_head.
std::vector<FileTensor> from_hugging_face(NamedTensors file, WeightLayout layout,
                                          const std::string& source);

}  // namespace detail
}  // namespace attention
