#include "zoo_model.h"

#include <fmt/format.h>

#include <algorithm>

namespace zoo {

namespace {

using attention::HeadNormOptions;
using attention::HeadNormScope;
using attention::MultiHeadAttentionOptions;
using attention::NormKind;
using attention::NormParameter;

int64_t get(const nlohmann::json& cfg, const char* key) {
  return cfg.at(key).get<int64_t>();
}

// The family's norm, for the blocks and the QK-norm alike.
attention::NormOptions family_norm(const std::string& family, const nlohmann::json& cfg,
                                   int64_t width) {
  attention::NormOptions norm(width);
  if (family == "llama32") return norm.eps(1e-5);
  if (family == "qwen3") return norm.eps(1e-6).parameter_name(NormParameter::Scale);
  if (family == "gemma3") {
    return norm.eps(1e-6).kind(NormKind::ZeroCenteredRMS).parameter_name(NormParameter::Scale);
  }
  if (family == "olmo3") return norm.eps(cfg.value("rms_norm_eps", 1e-6));
  if (family == "tiny_aya")
    return norm.eps(cfg.value("layer_norm_eps", 1e-5)).kind(NormKind::LayerNorm);
  if (family == "qwen3_5") {
    return norm.eps(cfg.value("rms_norm_eps", 1e-6)).kind(NormKind::ZeroCenteredRMS);
  }
  if (family == "gemma4") return norm.eps(cfg.value("layer_norm_eps", 1e-6));
  throw std::invalid_argument("zoo: unknown family '" + family + "'");
}

HeadNormOptions head_norm(const attention::NormOptions& norm, HeadNormScope scope) {
  return HeadNormOptions()
      .kind(norm.kind())
      .eps(norm.eps())
      .parameter_name(norm.parameter_name())
      .scope(scope);
}

// The rotary frequencies of `dim` features from `base`, as the family's tables have them.
F::RotaryOptions rope(double base) {
  return F::RotaryOptions().theta(base);
}

// Gemma 4: the earlier layer of the same kind whose keys and values a KV-shared layer reads.
std::optional<int64_t> gemma4_kv_source(const std::vector<std::string>& kinds, int64_t shared,
                                        int64_t i) {
  const int64_t first = static_cast<int64_t>(kinds.size()) - shared;
  if (!(first > 0 && i >= first)) return std::nullopt;
  for (int64_t j = first - 1; j >= 0; --j) {
    if (kinds[j] == kinds[i]) return j;
  }
  return std::nullopt;
}

}  // namespace

Description describe(const nlohmann::json& cfg) {
  Description d;
  d.family = cfg.at("family").get<std::string>();
  const auto& f = d.family;
  const std::string dtype = cfg.at("dtype").get<std::string>();
  if (dtype != "float32" && dtype != "bfloat16") {
    throw std::invalid_argument("zoo: expected dtype float32 or bfloat16, got " + dtype);
  }
  d.dtype = dtype == "bfloat16" ? torch::kBFloat16 : torch::kFloat;
  d.vocab = get(cfg, "vocab_size");
  d.width = get(cfg, "emb_dim");
  const int64_t n_layers = get(cfg, "n_layers"), heads = get(cfg, "n_heads");
  const int64_t hidden = get(cfg, "hidden_dim");
  std::vector<std::string> kinds(n_layers, "full_attention");
  if (cfg.contains("layer_types") && !cfg.at("layer_types").is_null()) {
    kinds = cfg.at("layer_types").get<std::vector<std::string>>();
    if (static_cast<int64_t>(kinds.size()) != n_layers) {
      throw std::invalid_argument(fmt::format(
          "zoo: expected layer_types of n_layers = {} entries, got {}", n_layers, kinds.size()));
    }
  }
  d.norm = family_norm(f, cfg, d.width);
  const int64_t kv_heads =
      cfg.contains("n_kv_groups") ? get(cfg, "n_kv_groups") : get(cfg, "n_kv_heads");
  const bool has_head_dim = cfg.contains("head_dim") && !cfg.at("head_dim").is_null();
  const int64_t head_dim = f != "llama32" && has_head_dim ? get(cfg, "head_dim") : d.width / heads;
  const bool bias = cfg.value("attention_bias", false);
  const auto base = [&](const char* key) { return cfg.at(key).get<double>(); };

  d.style = f == "gemma3" || f == "gemma4" ? BlockStyle::Sandwich
            : f == "olmo3"                 ? BlockStyle::Post
            : f == "tiny_aya"              ? BlockStyle::Parallel
                                           : BlockStyle::Pre;
  d.gelu = f == "gemma3" || f == "gemma4";
  d.hf_feed_forward = f == "gemma4";
  if (f == "gemma3" || f == "olmo3" || f == "gemma4") d.blocks_name = "blocks";
  if (f == "qwen3_5") d.mixer_name = "token_mixer";
  if (f == "gemma3" || f == "gemma4") d.embedding_scale = std::sqrt(static_cast<double>(d.width));
  d.logit_scale = cfg.value("logit_scale", 1.0);
  if (cfg.contains("final_logit_softcap") && !cfg.at("final_logit_softcap").is_null()) {
    d.softcap = cfg.at("final_logit_softcap").get<double>();
  }
  if (f == "gemma4") {
    d.per_layer_input = cfg.value("hidden_size_per_layer_input", int64_t{0});
    d.per_layer_vocab = cfg.value("vocab_size_per_layer_input", d.vocab);
  }

  for (int64_t i = 0; i < n_layers; ++i) {
    Layer layer;
    layer.kind = kinds[i];
    layer.ff_width = hidden;
    const bool sliding = layer.kind == "sliding_attention";
    if (layer.kind == "linear_attention") {
      layer.delta_net =
          DeltaNetSizes{get(cfg, "linear_num_key_heads"),   get(cfg, "linear_num_value_heads"),
                        get(cfg, "linear_key_head_dim"),    get(cfg, "linear_value_head_dim"),
                        get(cfg, "linear_conv_kernel_dim"), cfg.value("rms_norm_eps", 1e-6)};
      d.layers.push_back(layer);
      continue;
    }
    if (layer.kind != "full_attention" && !sliding) {
      throw std::invalid_argument("zoo: unknown layer type '" + layer.kind + "'");
    }
    auto o = MultiHeadAttentionOptions(d.width, d.width, heads)
                 .num_kv_heads(kv_heads)
                 .head_dim(head_dim)
                 .qkv_bias(bias)
                 .out_bias(bias);
    if (sliding) o.sliding_window(get(cfg, "sliding_window"));
    if (f == "llama32") {
      auto r = rope(base("rope_base"));
      if (cfg.contains("rope_freq") && !cfg.at("rope_freq").is_null()) {
        const auto& s = cfg.at("rope_freq");
        r.llama3_scaling(F::Llama3RopeScaling()
                             .factor(s.at("factor").get<double>())
                             .low_freq_factor(s.at("low_freq_factor").get<double>())
                             .high_freq_factor(s.at("high_freq_factor").get<double>())
                             .original_context_length(get(s, "original_context_length")));
      }
      o.rope(r);
    } else if (f == "qwen3") {
      o.rope(rope(base("rope_base")));
      if (cfg.value("qk_norm", false)) o.qk_norm(head_norm(d.norm, HeadNormScope::PerHead));
    } else if (f == "gemma3") {
      o.rope(rope(sliding ? base("rope_local_base") : base("rope_base")));
      if (cfg.value("qk_norm", false)) o.qk_norm(head_norm(d.norm, HeadNormScope::PerHead));
      const auto& s = cfg.at("query_pre_attn_scalar");
      o.scale(1.0 / std::sqrt(s.is_null() ? static_cast<double>(head_dim) : s.get<double>()));
    } else if (f == "olmo3") {
      auto r = rope(base("rope_base"));
      if (cfg.at("rope_type").get<std::string>() == "yarn") {
        r.yarn_scaling(F::YarnRopeScaling()
                           .factor(base("rope_factor"))
                           .original_context_length(get(cfg, "rope_orig_max"))
                           .attention_factor(base("rope_attention_factor")));
      }
      o.rope(r).qk_norm(head_norm(d.norm, HeadNormScope::Projection).eps(1e-6));
    } else if (f == "tiny_aya") {
      // Rotary on the sliding layers only; the full layers have no position encoding.
      if (sliding) o.rope(rope(base("rope_base")).layout(F::RotaryLayout::Interleaved));
    } else if (f == "qwen3_5") {
      int64_t r = static_cast<int64_t>(head_dim * cfg.value("partial_rotary_factor", 1.0));
      r = std::max<int64_t>(2, r - r % 2);
      o.rope(rope(base("rope_base")).rotary_dim(r)).gate(true).gate_in_query(true);
      if (cfg.value("qk_norm", false)) o.qk_norm(head_norm(d.norm, HeadNormScope::PerHead));
    } else if (f == "gemma4") {
      const int64_t hd = sliding ? head_dim : get(cfg, "global_head_dim");
      o.head_dim(hd).scale(1.0).qk_norm(head_norm(d.norm, HeadNormScope::PerHead));
      o.value_norm(head_norm(d.norm, HeadNormScope::PerHead).elementwise_affine(false));
      if (sliding) {
        o.rope(rope(base("rope_local_base")));
      } else {
        auto r = rope(base("rope_global_base"));
        if (cfg.at("rope_global_type").get<std::string>() == "proportional") {
          const double fraction = cfg.at("rope_global_partial_rotary_factor").get<double>();
          // The first int(fraction * head_dim / 2) pairs turn, with the whole head's exponents.
          const auto turning = static_cast<int64_t>(fraction * static_cast<double>(hd) / 2);
          if (turning < 1) {
            throw std::invalid_argument(
                "zoo: a proportional rotary that turns no pair (rope_global_partial_rotary_factor "
                "x global_head_dim < 2)");
          }
          r.rotated_pairs(turning);
        }
        o.rope(r);
      }
      layer.kv_source = gemma4_kv_source(kinds, cfg.value("num_kv_shared_layers", int64_t{0}), i);
      if (layer.kv_source && cfg.value("use_double_wide_mlp", false)) layer.ff_width = 2 * hidden;
    }
    layer.attention = o;
    d.layers.push_back(layer);
  }
  for (const auto& layer : d.layers) {
    if (layer.kv_source) d.layers[*layer.kv_source].kv_provider = true;
  }
  return d;
}

// ---- DeltaNet --------------------------------------------------------------------------------

void DeltaNetImpl::reset() {
  const auto& s = sizes_;
  const int64_t key = s.key_heads * s.key_dim, value = s.value_heads * s.value_dim;
  const int64_t conv = 2 * key + value;
  const auto linear = [](int64_t from, int64_t to) {
    return torch::nn::Linear(torch::nn::LinearOptions(from, to).bias(false));
  };
  // The book's order (its A_log draws from the generator, as does every Linear and the conv).
  conv1d = register_module("conv1d",
                           torch::nn::Conv1d(torch::nn::Conv1dOptions(conv, conv, s.conv_kernel)
                                                 .groups(conv)
                                                 .padding(s.conv_kernel - 1)
                                                 .bias(false)));
  dt_bias = register_parameter("dt_bias", torch::ones({s.value_heads}));
  A_log = register_parameter("A_log", torch::empty({s.value_heads}).uniform_(0, 16).log());
  auto norm = register_module("norm", std::make_shared<torch::nn::Module>());
  norm_weight = norm->register_parameter("weight", torch::ones({s.value_dim}));
  out_proj = register_module("out_proj", linear(value, width_));
  in_proj_qkv = register_module("in_proj_qkv", linear(width_, conv));
  in_proj_z = register_module("in_proj_z", linear(width_, value));
  in_proj_b = register_module("in_proj_b", linear(width_, s.value_heads));
  in_proj_a = register_module("in_proj_a", linear(width_, s.value_heads));
}

torch::Tensor DeltaNetImpl::forward(const torch::Tensor& x, DeltaNetState* state) {
  const auto& s = sizes_;
  const int64_t B = x.size(0), T = x.size(1), K = s.conv_kernel;
  const int64_t key = s.key_heads * s.key_dim, value = s.value_heads * s.value_dim;
  const auto dtype = x.scalar_type();
  // The causal depthwise convolution over the projections, continuing the carried inputs.
  auto qkv = in_proj_qkv(x).transpose(1, 2);  // (B, conv, T)
  torch::Tensor convolved;
  if (state && state->conv.defined()) {
    const auto window = torch::cat({state->conv, qkv}, 2);
    convolved = torch::nn::functional::conv1d(
        window, conv1d->weight, torch::nn::functional::Conv1dFuncOptions().groups(qkv.size(1)));
  } else {
    convolved = conv1d(qkv).narrow(2, 0, T);
  }
  if (state) {
    const auto history = state->conv.defined() ? torch::cat({state->conv, qkv}, 2)
                                               : torch::constant_pad_nd(qkv, {K - 1, 0});
    state->conv = history.narrow(2, history.size(2) - (K - 1), K - 1).clone();
  }
  const auto mixed = torch::silu(convolved).transpose(1, 2);  // (B, T, conv)
  auto q = mixed.narrow(-1, 0, key).reshape({B, T, s.key_heads, s.key_dim});
  auto k = mixed.narrow(-1, key, key).reshape({B, T, s.key_heads, s.key_dim});
  auto v = mixed.narrow(-1, 2 * key, value).reshape({B, T, s.value_heads, s.value_dim});
  const int64_t repeat = s.value_heads / s.key_heads;
  if (repeat > 1) {
    q = q.repeat_interleave(repeat, 2);
    k = k.repeat_interleave(repeat, 2);
  }
  // L2-normalized in the model's dtype, then the rule in float32, queries scaled by 1/sqrt(dk).
  const auto l2 = [](const torch::Tensor& t) {
    return t * torch::rsqrt((t * t).sum(-1, true) + 1e-6);
  };
  const auto heads_first = [](const torch::Tensor& t) {
    return t.transpose(1, 2).contiguous().to(torch::kFloat);
  };
  const auto queries = heads_first(l2(q)) * (1.0 / std::sqrt(static_cast<double>(s.key_dim)));
  const auto beta = heads_first(torch::sigmoid(in_proj_b(x)));
  const auto log_decay =
      heads_first(-A_log.to(torch::kFloat).exp() *
                  torch::softplus(in_proj_a(x).to(torch::kFloat) + dt_bias.to(torch::kFloat)));
  auto rule = F::gated_delta_rule(
      queries, heads_first(l2(k)), heads_first(v), log_decay, beta,
      F::GatedDeltaRuleOptions().initial_state(state ? state->rule : torch::Tensor()));
  if (state) state->rule = rule.state;
  const auto out = rule.output.transpose(1, 2).to(dtype);  // (B, T, Hv, dv)
  // The gated RMSNorm: normalized in float32, times the weight in the model's dtype, times
  // SiLU of the gate in float32.
  const auto z = in_proj_z(x).reshape({B, T, s.value_heads, s.value_dim});
  const auto wide = out.to(torch::kFloat);
  const auto normalized =
      (wide * torch::rsqrt(wide.pow(2).mean(-1, true) + s.eps)).to(dtype) * norm_weight;
  const auto gated = (normalized * torch::silu(z.to(torch::kFloat))).to(dtype);
  return out_proj(gated.reshape({B, T, value}));
}

// ---- Block ---------------------------------------------------------------------------------

void BlockImpl::reset() {
  const auto& d = description_;
  if (layer_.attention) {
    att = register_module(d.mixer_name, attention::MultiHeadAttention(*layer_.attention));
  } else {
    delta_net = register_module(d.mixer_name, DeltaNet(d.width, *layer_.delta_net));
  }
  ff = register_module(d.hf_feed_forward ? "mlp" : "ff",
                       FeedForward(d.width, layer_.ff_width, d.gelu, d.hf_feed_forward));
  std::vector<std::string> names;
  switch (d.style) {
    case BlockStyle::Pre:
      names = {"norm1", "norm2"};
      break;
    case BlockStyle::Sandwich:
      names = {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
               "post_feedforward_layernorm"};
      break;
    case BlockStyle::Post:
      names = {"post_attention_layernorm", "post_feedforward_layernorm"};
      break;
    case BlockStyle::Parallel:
      names = {"input_layernorm"};
      break;
  }
  for (const auto& name : names) {
    norms.insert_or_assign(name, register_module(name, attention::Norm(d.norm)));
  }
  if (d.family == "gemma4") {
    layer_scalar = register_buffer("layer_scalar", torch::ones({1}));
    if (d.per_layer_input > 0) {
      const auto linear = [](int64_t from, int64_t to) {
        return torch::nn::Linear(torch::nn::LinearOptions(from, to).bias(false));
      };
      per_layer_input_gate =
          register_module("per_layer_input_gate", linear(d.width, d.per_layer_input));
      per_layer_projection =
          register_module("per_layer_projection", linear(d.per_layer_input, d.width));
      norms.insert_or_assign("post_per_layer_input_norm",
                             register_module("post_per_layer_input_norm", attention::Norm(d.norm)));
    }
  }
}

torch::Tensor BlockImpl::mix(const torch::Tensor& h, Caches* caches, int64_t index,
                             attention::SharedKV* shared) {
  if (delta_net) return delta_net(h, caches ? &caches->delta[index] : nullptr);
  if (caches && !caches->pages.empty()) {
    // Paged: one sequence, its step's tokens packed (total, width).
    const int64_t hd = att->head_dim();
    auto& cache = caches->pages.at(layer_.kind == "sliding_attention" ? -hd : hd);
    const auto& step = caches->steps.at(layer_.kind == "sliding_attention" ? -hd : hd);
    return att->forward_paged(h.squeeze(0), cache, step, caches->page_layer[index]).unsqueeze(0);
  }
  attention::MultiHeadAttentionForwardOptions o;
  if (caches && !layer_.kv_source) o.kv_cache(&caches->kv[index]);
  if (layer_.kv_source) o.shared_kv(shared);
  if (layer_.kv_provider) o.share_kv(shared);
  return att(h, o).output;
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x, const torch::Tensor& per_layer_input,
                                 Caches* caches, int64_t index, attention::SharedKV* shared) {
  torch::Tensor out;
  switch (description_.style) {
    case BlockStyle::Pre: {
      const auto y = x + mix(norm("norm1")(x), caches, index, shared);
      out = y + ff(norm("norm2")(y));
      break;
    }
    case BlockStyle::Sandwich: {
      const auto y = x + norm("post_attention_layernorm")(
                             mix(norm("input_layernorm")(x), caches, index, shared));
      out = y + norm("post_feedforward_layernorm")(ff(norm("pre_feedforward_layernorm")(y)));
      break;
    }
    case BlockStyle::Post: {
      const auto y = x + norm("post_attention_layernorm")(mix(x, caches, index, shared));
      out = y + norm("post_feedforward_layernorm")(ff(y));
      break;
    }
    case BlockStyle::Parallel: {
      const auto h = norm("input_layernorm")(x);
      out = x + mix(h, caches, index, shared) + ff(h);
      break;
    }
  }
  if (per_layer_input_gate) {
    const auto g = torch::nn::functional::gelu(
        per_layer_input_gate(out), torch::nn::functional::GELUFuncOptions().approximate("tanh"));
    out = out + norm("post_per_layer_input_norm")(per_layer_projection(g * per_layer_input));
  }
  if (layer_scalar.defined()) out = out * layer_scalar.to(out.scalar_type());
  return out;
}

// ---- Model ---------------------------------------------------------------------------------

void ModelImpl::reset() {
  const auto& d = description_;
  tok_emb = register_module("tok_emb", torch::nn::Embedding(d.vocab, d.width));
  blocks = register_module(d.blocks_name, torch::nn::ModuleList());
  for (const auto& layer : d.layers) blocks->push_back(Block(d, layer));
  final_norm = register_module("final_norm", attention::Norm(d.norm));
  out_head = register_module(
      "out_head", torch::nn::Linear(torch::nn::LinearOptions(d.width, d.vocab).bias(false)));
  if (d.per_layer_input > 0) {
    const int64_t all = static_cast<int64_t>(d.layers.size()) * d.per_layer_input;
    embed_tokens_per_layer =
        register_module("embed_tokens_per_layer", torch::nn::Embedding(d.per_layer_vocab, all));
    per_layer_model_projection =
        register_module("per_layer_model_projection",
                        torch::nn::Linear(torch::nn::LinearOptions(d.width, all).bias(false)));
    per_layer_projection_norm = register_module(
        "per_layer_projection_norm",
        attention::Norm(attention::NormOptions(d.norm).normalized_shape(d.per_layer_input)));
  }
}

torch::Tensor ModelImpl::forward(const torch::Tensor& ids, Caches* caches) {
  const auto& d = description_;
  auto x = tok_emb(ids);
  if (d.embedding_scale != 1.0) x = x * d.embedding_scale;
  torch::Tensor per_layer;
  if (d.per_layer_input > 0) {
    const int64_t p = d.per_layer_input, n = static_cast<int64_t>(d.layers.size());
    const std::vector<int64_t> shape = {ids.size(0), ids.size(1), n, p};
    const auto from_tokens =
        (embed_tokens_per_layer(ids) * std::sqrt(static_cast<double>(p))).reshape(shape);
    const auto projected = per_layer_projection_norm(
        (per_layer_model_projection(x) * (1.0 / std::sqrt(static_cast<double>(d.width))))
            .reshape(shape));
    per_layer = (projected + from_tokens) * std::sqrt(0.5);
  }
  std::map<int64_t, attention::SharedKV> shared;  // by the producing layer
  for (size_t i = 0; i < blocks->size(); ++i) {
    const auto& layer = d.layers[i];
    const int64_t slot = layer.kv_source ? *layer.kv_source : static_cast<int64_t>(i);
    const auto input =
        per_layer.defined() ? per_layer.select(2, static_cast<int64_t>(i)) : torch::Tensor();
    x = blocks[i]->as<BlockImpl>()->forward(x, input, caches, static_cast<int64_t>(i),
                                            &shared[slot]);
  }
  auto logits = out_head(final_norm(x));
  if (d.logit_scale != 1.0) logits = logits * d.logit_scale;
  if (d.softcap) logits = torch::tanh(logits / *d.softcap) * *d.softcap;
  return logits;
}

Caches ModelImpl::make_caches(int64_t length, bool paged, int64_t page_size) const {
  const auto& d = description_;
  Caches caches;
  const auto n = d.layers.size();
  caches.delta.resize(n);
  caches.page_layer.assign(n, -1);
  if (!paged) {
    for (size_t i = 0; i < n; ++i) caches.kv.emplace_back(std::max<int64_t>(1, length));
    return caches;
  }
  // A page cache per head size, and one for the sliding layers (keyed by minus the head size)
  // that gives back the pages past their window.
  std::map<int64_t, int64_t> layers;
  std::map<int64_t, attention::PagedKVCacheOptions> options;
  for (size_t i = 0; i < n; ++i) {
    const auto& layer = d.layers[i];
    if (!layer.attention) continue;
    if (layer.kv_source) {
      throw std::invalid_argument(
          "zoo: a KV-shared layer (Gemma 4) reads another layer's cache; forward_paged has no "
          "cross-layer sharing: use the KVCache route");
    }
    const auto& o = *layer.attention;
    const int64_t hd = o.head_dim() > 0 ? o.head_dim() : o.d_out() / o.num_heads();
    const int64_t key = layer.kind == "sliding_attention" ? -hd : hd;
    caches.page_layer[i] = layers[key]++;
    const int64_t pages = 2 * ((length + page_size - 1) / page_size) + 2;
    auto cache_options =
        attention::PagedKVCacheOptions(pages, page_size, o.num_kv_heads(), hd).dtype(d.dtype);
    if (key < 0) cache_options.sliding_window(*o.sliding_window());
    options.insert_or_assign(key, cache_options);
  }
  for (auto& [key, o] : options) {
    auto& cache =
        caches.pages.emplace(key, attention::PagedKVCache(o.num_layers(layers[key]))).first->second;
    caches.sequence = cache.add_sequence();
  }
  return caches;
}

void ModelImpl::extend(Caches& caches, int64_t tokens) const {
  for (auto& [key, cache] : caches.pages) {
    caches.steps.insert_or_assign(key, cache.extend({caches.sequence}, {tokens}));
  }
}

// ---- Loading ---------------------------------------------------------------------------------

attention::LoadReport load(Model& model, const std::string& path) {
  const auto& family = model->description().family;
  auto options = attention::LoadOptions().cast(true);
  if (path.size() > 11 && path.compare(path.size() - 11, 11, ".index.json") == 0) {
    static const std::map<std::string, attention::WeightLayout> layouts = {
        {"llama32", attention::WeightLayout::HuggingFaceLlama},
        {"qwen3", attention::WeightLayout::HuggingFaceQwen3},
        {"gemma3", attention::WeightLayout::HuggingFaceGemma3},
        {"olmo3", attention::WeightLayout::HuggingFaceOlmo3},
        {"tiny_aya", attention::WeightLayout::HuggingFaceCohere2},
        {"qwen3_5", attention::WeightLayout::HuggingFaceQwen3_5},
        {"gemma4", attention::WeightLayout::HuggingFaceGemma4}};
    options.layout(layouts.at(family));
  } else if (family == "gemma4") {
    // The book's Gemma 4 attention keeps Hugging Face's names (q_proj ... o_proj).
    options.layout(attention::WeightLayout::Llama);
  }
  return attention::load_weights(*model, path, options);
}

}  // namespace zoo
