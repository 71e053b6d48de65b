#pragma once

/// \file
/// Umbrella header: everything the library offers.

#include <attention/block_mask.h>
#include <attention/causal_self_attention.h>
#include <attention/conversions.h>
#include <attention/cross_attention.h>
#include <attention/deepseek_sparse_attention.h>
#include <attention/format.h>
#include <attention/functional.h>
#include <attention/gated_delta_net.h>
#include <attention/gated_delta_rule.h>
#include <attention/heatmap.h>
#include <attention/kv_cache.h>
#include <attention/latent_cache.h>
#include <attention/lightning_indexer.h>
#include <attention/multi_head_attention.h>
#include <attention/multi_head_attention_wrapper.h>
#include <attention/multi_head_latent_attention.h>
#include <attention/operators.h>
#include <attention/paged_attention.h>
#include <attention/paged_kv_cache.h>
#include <attention/rms_norm.h>
#include <attention/rotary.h>
#include <attention/safetensors.h>
#include <attention/score_mod.h>
#include <attention/self_attention.h>
#include <attention/sliding_kv_cache.h>
#include <attention/sparse_attention.h>
#include <attention/sparse_attention_cache.h>
#include <attention/version.h>
#include <attention/weights.h>
#include <attention/workspace.h>
