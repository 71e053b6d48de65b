#include "golden/harness.h"

#include "source_paths.h"

#include <attention/testing.h>

#include <attention/attention.h>

#include <fmt/format.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>

namespace golden {

std::string& directory() {
  static std::string dir = test::golden_dir();
  return dir;
}

std::string& selected_case() {
  static std::string name;
  return name;
}

std::string& selected_module() {
  static std::string name;
  return name;
}

std::vector<Case> read_manifest(const std::string& dir) {
  std::ifstream in(dir + "/manifest.json");
  TORCH_CHECK(in, "golden: cannot open ", dir, "/manifest.json");
  const auto manifest = nlohmann::json::parse(in);
  std::vector<Case> cases;
  for (const auto& entry : manifest.at("cases")) {
    Case c;
    c.name = entry.at("name");
    c.module = entry.at("module");
    c.args = entry.at("args");
    c.seed = entry.at("seed");
    const std::string dtype = entry.at("dtype");
    c.dtype = dtype == "float64"    ? torch::kDouble
              : dtype == "bfloat16" ? torch::kBFloat16
                                    : torch::kFloat;
    c.mode = entry.value("mode", "train");
    c.path = entry.value("path", "math");
    c.inputs = entry.at("inputs").get<std::vector<std::string>>();
    c.forward = entry.at("forward");
    c.seeded = entry.value("seeded", true);
    c.atol = entry.at("tolerance").at("atol");
    c.rtol = entry.at("tolerance").at("rtol");
    c.weights_path = dir + "/" + entry.at("weights").get<std::string>();
    c.tensors_path = dir + "/" + entry.at("tensors").get<std::string>();
    c.state_dict_path = dir + "/" + entry.at("state_dict").get<std::string>();
    c.safetensors_path = dir + "/" + entry.at("safetensors").get<std::string>();
    cases.push_back(c);
  }
  return cases;
}

torch::Tensor relative_positions(const torch::Tensor& s, const attention::ScoreTile& t) {
  const auto options = torch::TensorOptions().dtype(torch::kLong);
  const auto queries = torch::arange(t.query_begin, t.query_begin + s.size(0), options);
  const auto keys = torch::arange(t.key_begin, t.key_begin + s.size(1), options);
  return keys.view({1, -1}) - (queries + t.query_offset).view({-1, 1});
}

attention::ScoreMod score_mod_of(const std::string& name) {
  using attention::ScoreTile;
  TORCH_CHECK(name == "wavy", "golden: unknown score_mod ", name);
  const auto slope = [](const ScoreTile& t) {
    return 1 + 0.1 * static_cast<double>(t.head) + 0.2 * static_cast<double>(t.batch);
  };
  const auto wave = [](const torch::Tensor& s, const ScoreTile& t) {
    return relative_positions(s, t).to(s.scalar_type()).mul(0.05).cos();
  };
  return attention::ScoreMod(
      [wave, slope](const torch::Tensor& s, const ScoreTile& t) {
        return s * slope(t) + s.sin() * wave(s, t) * 0.5;
      },
      [wave, slope](const torch::Tensor& s, const torch::Tensor& g, const ScoreTile& t) {
        return g * (s.cos() * wave(s, t) * 0.5 + slope(t));
      });
}

namespace {

using Output = attention::functional::AttentionOutput;

// The backend a case asks for (forward["backend"], "auto" when absent).
attention::functional::Backend backend_of(const nlohmann::json& forward) {
  using attention::functional::Backend;
  const std::map<std::string, Backend> backends = {{"auto", Backend::Auto},
                                                   {"math", Backend::Math},
                                                   {"chunked", Backend::Chunked},
                                                   {"native", Backend::Native}};
  return backends.at(forward.value("backend", "auto"));
}

// x (B, T, ...) fed to `step` in chunks of the sizes `decode` along T, the outputs joined along T:
// a case's decoding through a cache, which must equal one forward over x.
template <typename Step>
torch::Tensor in_chunks(const torch::Tensor& x, const std::vector<int64_t>& decode, Step step) {
  std::vector<torch::Tensor> outputs;
  int64_t start = 0;
  for (const int64_t n : decode) {
    outputs.push_back(step(x.narrow(1, start, n)));
    start += n;
  }
  TORCH_CHECK(start == x.size(1), "golden: the decode chunks do not cover the input");
  return torch::cat(outputs, 1);
}

// A case's block mask (forward["block_mask"]) over T tokens, made as an application would: the
// library's builders, or a mask function written here (make_golden.py writes each kind's
// definition once more, as the dense mask Python's module takes).
attention::BlockMask block_mask_of(const nlohmann::json& spec, int64_t t) {
  using attention::BlockMask;
  const std::string kind = spec.at("kind");
  const int64_t block = spec.at("block");
  if (kind == "document") {
    std::vector<int64_t> ids;
    int64_t document = 0;
    for (const int64_t n : spec.at("lengths").get<std::vector<int64_t>>()) {
      ids.insert(ids.end(), static_cast<size_t>(n), document++);
    }
    TORCH_CHECK(static_cast<int64_t>(ids.size()) == t, "golden: the documents do not cover T");
    auto mask = BlockMask::document(torch::tensor(ids), block);
    return spec.value("causal", false) ? mask & BlockMask::causal(t, t, block) : mask;
  }
  if (kind == "prefix_lm") return BlockMask::prefix_lm(t, spec.at("prefix"), block);
  if (kind == "global_dilated") {
    const int64_t globals = spec.at("globals"), dilation = spec.at("dilation");
    return BlockMask::from_function(
        [globals, dilation](int64_t, int64_t, int64_t q, int64_t kv) {
          return kv < globals || q < globals || (q - kv) % dilation == 0;
        },
        1, 1, t, t, block);
  }
  TORCH_CHECK(false, "golden: unknown block mask kind ", kind);
}

template <typename M, typename F>
Module wrap(M module, F forward) {
  return {module.ptr(), [module, forward](const Module::Inputs& in) mutable -> Output {
            return forward(module, in);
          }};
}

// Packed sequences (forward["packed"]: their lengths; forward["packed_context"]: the context's):
// the module's projections of the packed tokens, every sequence in one varlen_attention call
// with the module's variants, and its output projection. Python runs the book's module on each
// sequence alone.
Module packed_multi_head_attention(attention::MultiHeadAttention mha, const nlohmann::json& f,
                                   attention::functional::Backend backend) {
  namespace F = attention::functional;
  const auto offsets = [](const std::vector<int64_t>& lengths) {
    std::vector<int64_t> at{0};
    for (const int64_t n : lengths) at.push_back(at.back() + n);
    return torch::tensor(at, torch::kLong);
  };
  const auto lengths = f.at("packed").get<std::vector<int64_t>>();
  const auto cu_q = offsets(lengths);
  const auto cu_k = offsets(f.value("packed_context", lengths));
  return wrap(mha, [=](attention::MultiHeadAttention& m, const Module::Inputs& in) {
    const auto& o = m->options;
    const auto& x = in.at("x");
    const auto& source = in.count("context") ? in.at("context") : x;
    const int64_t hd = o.d_out() / o.num_heads();
    const auto q = m->W_query(x).view({x.size(0), o.num_heads(), hd});
    const auto k = m->W_key(source).view({source.size(0), o.num_kv_heads(), hd});
    const auto v = m->W_value(source).view({source.size(0), o.num_kv_heads(), hd});
    auto options = F::ScaledDotProductAttentionOptions()
                       .is_causal(o.causal())
                       .causal_alignment(o.causal_alignment())
                       .softcap(o.softcap())
                       .backend(backend);
    if (o.sliding_window()) {
      options.window_left(*o.sliding_window() - 1);
      if (!o.causal()) options.window_right(*o.sliding_window() - 1);
    }
    if (o.alibi()) options.alibi_slopes(F::alibi_slopes(o.num_heads()).to(x.scalar_type()));
    if (m->sinks.defined()) options.sinks(m->sinks);
    const auto out = F::varlen_attention(q, k, v, cu_q, cu_k, options);
    return Output{m->out_proj(out.reshape({x.size(0), o.d_out()})), {}};
  });
}

// Sequences sharing a PagedKVCache (forward["paged"]: page_size, num_pages, window, steps, each
// a list of [sequence, new tokens], and forks, each [step, parent, child]: before that step the
// child starts as a copy of the parent). x is (S, T, d_in): sequence s's tokens in row s. Each
// step gives the new tokens of its sequences, packed, to MultiHeadAttention::forward_paged; the
// output is (S, T, d_out), zeros past a sequence's length, a fork's rows before it forked its
// parent's. Python runs the book's module on each sequence alone.
Module paged_multi_head_attention(attention::MultiHeadAttention mha, const nlohmann::json& f,
                                  attention::functional::Backend backend) {
  const auto spec = f.at("paged");
  return wrap(mha, [=](attention::MultiHeadAttention& m, const Module::Inputs& in) {
    torch::NoGradGuard no_grad;
    const auto& x = in.at("x");
    auto cache_options = attention::PagedKVCacheOptions(spec.at("num_pages"), spec.at("page_size"),
                                                        m->options.num_kv_heads(), m->head_dim())
                             .dtype(x.scalar_type());
    if (spec.contains("window")) cache_options.sliding_window(spec.at("window").get<int64_t>());
    attention::PagedKVCache cache(cache_options);
    const int64_t count = x.size(0);
    std::vector<int64_t> ids(count, -1), done(count, 0);
    std::map<int64_t, std::pair<int64_t, int64_t>> forked;  // child: (parent, length at the fork)
    const auto forks = spec.at("forks").get<std::vector<std::vector<int64_t>>>();
    for (const auto& fork : forks) forked[fork.at(2)] = {fork.at(1), 0};
    for (int64_t s = 0; s < count; ++s) {
      if (!forked.count(s)) ids[s] = cache.add_sequence();
    }
    auto out = torch::zeros({count, x.size(1), m->options.d_out()}, x.options());
    const auto steps = spec.at("steps").get<std::vector<std::vector<std::vector<int64_t>>>>();
    for (size_t step = 0; step < steps.size(); ++step) {
      for (const auto& fork : forks) {
        if (fork.at(0) != static_cast<int64_t>(step)) continue;
        const int64_t parent = fork.at(1), child = fork.at(2);
        ids[child] = cache.fork_sequence(ids[parent]);
        done[child] = done[parent];
        forked[child].second = done[parent];
      }
      std::vector<int64_t> sequences, counts;
      std::vector<torch::Tensor> rows;
      for (const auto& entry : steps[step]) {
        const int64_t s = entry.at(0), n = entry.at(1);
        sequences.push_back(ids[s]);
        counts.push_back(n);
        rows.push_back(x[s].narrow(0, done[s], n));
      }
      const auto batch = cache.extend(sequences, counts);
      const auto y = m->forward_paged(torch::cat(rows), cache, batch, 0, backend);
      int64_t row = 0;
      for (const auto& entry : steps[step]) {
        const int64_t s = entry.at(0), n = entry.at(1);
        out[s].narrow(0, done[s], n).copy_(y.narrow(0, row, n));
        row += n;
        done[s] += n;
      }
    }
    for (const auto& [child, from] : forked) {
      out[child].narrow(0, 0, from.second).copy_(out[from.first].narrow(0, 0, from.second));
    }
    return Output{out, {}};
  });
}

Module multi_head_attention_forward(attention::MultiHeadAttention mha, const nlohmann::json& f);

Module make_multi_head_attention(const Case& c) {
  const auto& a = c.args;
  auto mha_options =
      attention::MultiHeadAttentionOptions(a.at("d_in"), a.at("d_out"), a.at("num_heads"))
          .context_length(a.at("context_length"))
          .dropout(a.at("dropout"))
          .qkv_bias(a.at("qkv_bias"))
          .num_kv_heads(a.value("num_kv_heads", a.at("num_heads").get<int64_t>()))
          .causal(a.value("causal", true))
          .d_in_kv(a.value("d_in_kv", a.at("d_in").get<int64_t>()))
          .alibi(a.value("alibi", false))
          .sinks(a.value("sinks", false))
          .gate(c.module == "GatedMultiHeadAttention");
  // The reference's 0 means "none" for the window and the cap.
  if (a.value("sliding_window", 0) > 0)
    mha_options.sliding_window(a.at("sliding_window").get<int64_t>());
  if (a.value("softcap", 0.0) > 0.0) mha_options.softcap(a.at("softcap").get<double>());
  if (a.contains("relative_bias")) {
    const auto r = a.at("relative_bias").get<std::vector<int64_t>>();
    mha_options.relative_bias(
        attention::functional::RelativeBuckets::t5(r.at(0), r.at(1), r.at(2) != 0));
  }
  if (a.value("top_left", false)) {
    mha_options.causal_alignment(attention::functional::CausalAlignment::TopLeft);
  }
  if (a.value("rope_theta", 0.0) > 0.0) {
    auto rope = attention::functional::RotaryOptions()
                    .theta(a.at("rope_theta").get<double>())
                    .rotary_dim(a.value("rotary_dim", int64_t{0}));
    if (a.value("rope_interleaved", false)) {
      rope.layout(attention::functional::RotaryLayout::Interleaved);
    }
    if (a.contains("llama3_scaling")) {
      const auto s = a.at("llama3_scaling").get<std::vector<double>>();
      rope.llama3_scaling(attention::functional::Llama3RopeScaling()
                              .factor(s.at(0))
                              .low_freq_factor(s.at(1))
                              .high_freq_factor(s.at(2))
                              .original_context_length(static_cast<int64_t>(s.at(3))));
    }
    mha_options.rope(rope);
  }
  return multi_head_attention_forward(attention::MultiHeadAttention(mha_options), c.forward);
}

// The forward a case asks of a MultiHeadAttention (forward: packed, paged, block_mask,
// score_mod, decode, sliding_cache, need_weights, backend, and the inputs by name).
Module multi_head_attention_forward(attention::MultiHeadAttention mha, const nlohmann::json& f) {
  const auto backend = backend_of(f);
  if (f.contains("packed")) return packed_multi_head_attention(mha, f, backend);
  if (f.contains("paged")) return paged_multi_head_attention(mha, f, backend);
  const auto decode = f.value("decode", std::vector<int64_t>{});
  const int64_t sliding_window = f.value("sliding_cache", int64_t{0});
  return wrap(mha, [f, backend, decode, sliding_window](attention::MultiHeadAttention& m,
                                                        const Module::Inputs& in) {
    auto options = attention::MultiHeadAttentionForwardOptions()
                       .need_weights(f.value("need_weights", false))
                       .average_attn_weights(f.value("average_attn_weights", true))
                       .backend(backend);
    if (f.contains("block_mask")) {
      const auto& x = in.at("x");
      options.block_mask(block_mask_of(f.at("block_mask"), x.size(-2)));
    }
    if (f.contains("score_mod")) options.score_mod(score_mod_of(f.at("score_mod")));
    for (const auto& [name, tensor] : in) {
      if (name == "context") options.context(tensor);
      if (name == "key_padding_mask") options.key_padding_mask(tensor);
      if (name == "attn_mask") options.attn_mask(tensor);
    }
    const auto& x = in.at("x");
    if (decode.empty()) return m(x, options);
    // Chunk by chunk through a KV cache: the concatenated outputs must equal one
    // forward.
    attention::KVCache cache(x.size(1));
    attention::SlidingKVCache sliding(std::max<int64_t>(1, sliding_window));
    if (sliding_window > 0) {
      options.sliding_kv_cache(&sliding);
    } else {
      options.kv_cache(&cache);
    }
    return Output{
        in_chunks(x, decode, [&](const torch::Tensor& chunk) { return m(chunk, options).output; }),
        {}};
  });
}

// The attention layer of a family of the book's chapter-5 zoo (scripts/reference.py's
// ZooAttention: examples/zoo/book_zoo.py's Attention as the family's make_block makes it, or its
// Gemma4Attention) for a layer of kind args["layer"], the other args being the book's config
// keys: MultiHeadAttention with the family's options, written here from the book's classes (as
// examples/zoo/zoo_model.cpp's describe() sets them). The QK-norms are the Attention class's,
// eps 1e-6 (Gemma 4's: layer_norm_eps).
Module make_zoo_attention(const Case& c) {
  namespace F = attention::functional;
  using attention::HeadNormOptions;
  using attention::HeadNormScope;
  using attention::NormKind;
  using attention::NormParameter;
  const auto& a = c.args;
  const std::string family = a.at("family"), layer = a.at("layer");
  TORCH_CHECK(layer == "sliding_attention" || layer == "full_attention",
              "golden: unknown zoo layer ", layer);
  const bool sliding = layer == "sliding_attention";
  const auto number = [&](const char* key) { return a.at(key).get<double>(); };
  const auto integer = [&](const char* key) { return a.at(key).get<int64_t>(); };
  const int64_t d = integer("emb_dim"), heads = integer("n_heads");
  const int64_t kv_heads =
      a.contains("n_kv_groups") ? integer("n_kv_groups") : integer("n_kv_heads");
  // Llama 3.2's head_dim is always emb_dim / n_heads; Gemma 4's full layers have their own.
  const bool has_head_dim = a.contains("head_dim") && !a.at("head_dim").is_null();
  int64_t head_dim = family != "llama32" && has_head_dim ? integer("head_dim") : d / heads;
  if (family == "gemma4" && !sliding) head_dim = integer("global_head_dim");
  const bool bias = a.value("attention_bias", false);
  auto o = attention::MultiHeadAttentionOptions(d, d, heads)
               .num_kv_heads(kv_heads)
               .head_dim(head_dim)
               .qkv_bias(bias)
               .out_bias(bias);
  if (sliding) o.sliding_window(integer("sliding_window"));
  // The rotary embedding, when the layer has one: its base set by each family below.
  F::RotaryOptions r;
  const auto per_head = HeadNormOptions().eps(1e-6);
  const bool qk_norm = a.value("qk_norm", false);
  if (family == "llama32") {
    r.theta(number("rope_base"));
    if (a.contains("rope_freq") && !a.at("rope_freq").is_null()) {
      const auto& s = a.at("rope_freq");
      r.llama3_scaling(
          F::Llama3RopeScaling()
              .factor(s.at("factor").get<double>())
              .low_freq_factor(s.at("low_freq_factor").get<double>())
              .high_freq_factor(s.at("high_freq_factor").get<double>())
              .original_context_length(s.at("original_context_length").get<int64_t>()));
    }
    o.rope(r);
  } else if (family == "qwen3") {
    o.rope(r.theta(number("rope_base")));
    if (qk_norm) o.qk_norm(HeadNormOptions(per_head).parameter_name(NormParameter::Scale));
  } else if (family == "gemma3") {
    o.rope(r.theta(number(sliding ? "rope_local_base" : "rope_base")));
    if (qk_norm) {
      o.qk_norm(HeadNormOptions(per_head)
                    .kind(NormKind::ZeroCenteredRMS)
                    .parameter_name(NormParameter::Scale));
    }
    const auto& s = a.at("query_pre_attn_scalar");
    o.scale(1.0 / std::sqrt(s.is_null() ? static_cast<double>(head_dim) : s.get<double>()));
  } else if (family == "olmo3") {
    r.theta(number("rope_base"));
    if (a.at("rope_type").get<std::string>() == "yarn") {
      r.yarn_scaling(F::YarnRopeScaling()
                         .factor(number("rope_factor"))
                         .original_context_length(integer("rope_orig_max"))
                         .attention_factor(number("rope_attention_factor")));
    }
    o.rope(r).qk_norm(HeadNormOptions(per_head).scope(HeadNormScope::Projection));
  } else if (family == "tiny_aya") {
    // Rotary on the sliding layers only; the full layers have no position encoding.
    if (sliding) o.rope(r.theta(number("rope_base")).layout(F::RotaryLayout::Interleaved));
  } else if (family == "qwen3_5") {
    auto rotary =
        static_cast<int64_t>(static_cast<double>(head_dim) * a.value("partial_rotary_factor", 1.0));
    rotary = std::max<int64_t>(2, rotary - rotary % 2);
    o.rope(r.theta(number("rope_base")).rotary_dim(rotary)).gate(true).gate_in_query(true);
    if (qk_norm) o.qk_norm(HeadNormOptions(per_head).kind(NormKind::ZeroCenteredRMS));
  } else if (family == "gemma4") {
    const auto norm = HeadNormOptions().eps(number("layer_norm_eps"));
    o.scale(1.0).qk_norm(norm).value_norm(HeadNormOptions(norm).elementwise_affine(false));
    if (sliding) {
      o.rope(r.theta(number("rope_local_base")));
    } else {
      r.theta(number("rope_global_base"));
      if (a.at("rope_global_type").get<std::string>() == "proportional") {
        // The first int(fraction * head_dim / 2) pairs turn, with the whole head's exponents.
        r.rotated_pairs(static_cast<int64_t>(number("rope_global_partial_rotary_factor") *
                                             static_cast<double>(head_dim) / 2));
      }
      o.rope(r);
    }
  } else {
    TORCH_CHECK(false, "golden: unknown zoo family ", family);
  }
  return multi_head_attention_forward(attention::MultiHeadAttention(o), c.forward);
}

// The book's MultiHeadLatentAttention; forward["decode"]: chunk sizes fed through a LatentCache
// (the absorbed form), whose outputs joined must equal Python's one forward.
Module make_multi_head_latent_attention(const Case& c) {
  const auto& a = c.args;
  attention::MultiHeadLatentAttentionOptions options(a.at("d_in"), a.at("d_out"),
                                                     a.at("num_heads"));
  if (!a.at("latent_dim").is_null()) options.latent_dim(a.at("latent_dim"));
  options.qkv_bias(a.at("qkv_bias")).dropout(a.at("dropout"));
  // DeepSeek-V2's parts, which the book's class leaves out.
  options.rope_dim(a.value("rope_dim", int64_t{0})).rope_theta(a.value("rope_theta", 10000.0));
  options.q_latent_dim(a.value("q_latent_dim", int64_t{0}))
      .latent_norm(a.value("latent_norm", false));
  options.backend(backend_of(c.forward));
  const auto decode = c.forward.value("decode", std::vector<int64_t>{});
  return wrap(
      attention::MultiHeadLatentAttention(options),
      [decode](attention::MultiHeadLatentAttention& m, const Module::Inputs& in) {
        const auto& x = in.at("x");
        if (decode.empty()) return Output{m(x), {}};
        attention::LatentCache cache(x.size(1));
        return Output{
            in_chunks(x, decode, [&](const torch::Tensor& chunk) { return m(chunk, &cache); }), {}};
      });
}

// The book's cross-layer KV sharing: MultiHeadAttention layers (`layers.i`) with residual
// connections; the first n_kv_producing_layers share their keys and values, every later layer
// reads the last producer's. With `caches`, one KVCache per producing layer.
struct KVSharingStackImpl : torch::nn::Module {
  KVSharingStackImpl(const nlohmann::json& a, attention::functional::Backend backend)
      : layers(register_module("layers", torch::nn::ModuleList())),
        producing(a.at("n_kv_producing_layers")),
        backend(backend) {
    const int64_t d = a.at("d_in");
    for (int64_t i = 0; i < a.at("n_layers").get<int64_t>(); ++i) {
      layers->push_back(attention::MultiHeadAttention(
          attention::MultiHeadAttentionOptions(d, d, a.at("num_heads"))
              .qkv_bias(a.at("qkv_bias"))));
    }
  }
  torch::Tensor forward(torch::Tensor x, std::vector<attention::KVCache>* caches) {
    attention::SharedKV shared;
    for (int64_t i = 0; i < static_cast<int64_t>(layers->size()); ++i) {
      auto options = attention::MultiHeadAttentionForwardOptions().backend(backend);
      if (i < producing) {
        options.share_kv(&shared).kv_cache(caches ? &(*caches)[i] : nullptr);
      } else {
        options.shared_kv(&shared);
      }
      x = x + layers[i]->as<attention::MultiHeadAttention>()->forward(x, options).output;
    }
    return x;
  }
  torch::nn::ModuleList layers;
  int64_t producing;
  attention::functional::Backend backend;
};
TORCH_MODULE(KVSharingStack);

// forward["decode"]: chunk sizes fed through a KVCache per producing layer; the outputs joined
// must equal Python's one forward.
Module make_kv_sharing_stack(const Case& c) {
  const auto decode = c.forward.value("decode", std::vector<int64_t>{});
  const int64_t producing = c.args.at("n_kv_producing_layers");
  return wrap(KVSharingStack(c.args, backend_of(c.forward)), [decode, producing](
                                                                 KVSharingStack& m,
                                                                 const Module::Inputs& in) {
    const auto& x = in.at("x");
    if (decode.empty()) return Output{m(x, nullptr), {}};
    std::vector<attention::KVCache> caches(producing, attention::KVCache(x.size(1)));
    return Output{
        in_chunks(x, decode, [&](const torch::Tensor& chunk) { return m(chunk, &caches); }), {}};
  });
}

// The book's GatedDeltaNet; forward["decode"]: chunk sizes fed through a GatedDeltaNetState,
// whose outputs joined must equal Python's one forward.
Module make_gated_delta_net(const Case& c) {
  const auto& a = c.args;
  attention::GatedDeltaNetOptions options(a.at("d_in"), a.at("d_out"), a.at("num_heads"));
  options.qkv_bias(a.at("qkv_bias")).dropout(a.at("dropout")).backend(backend_of(c.forward));
  const auto decode = c.forward.value("decode", std::vector<int64_t>{});
  return wrap(attention::GatedDeltaNet(options), [decode](attention::GatedDeltaNet& m,
                                                          const Module::Inputs& in) {
    const auto& x = in.at("x");
    if (decode.empty()) return Output{m(x), {}};
    attention::GatedDeltaNetState state;
    return Output{
        in_chunks(x, decode, [&](const torch::Tensor& chunk) { return m(chunk, &state); }), {}};
  });
}

// The book's MultiHeadAttentionWithDSA; forward["decode"]: chunk sizes fed through a
// SparseAttentionCache, whose outputs joined must equal Python's one forward.
Module make_deepseek_sparse_attention(const Case& c) {
  const auto& a = c.args;
  attention::DeepSeekSparseAttentionOptions options(a.at("d_in"), a.at("d_out"), a.at("num_heads"));
  options.qkv_bias(a.at("qkv_bias")).dropout(a.at("dropout")).backend(backend_of(c.forward));
  options.index_n_heads(a.at("index_n_heads")).index_head_dim(a.at("index_head_dim"));
  options.topk(a.at("topk"));
  const auto decode = c.forward.value("decode", std::vector<int64_t>{});
  return wrap(
      attention::DeepSeekSparseAttention(options),
      [decode](attention::DeepSeekSparseAttention& m, const Module::Inputs& in) {
        const auto& x = in.at("x");
        if (decode.empty()) return Output{m(x), {}};
        attention::SparseAttentionCache cache(x.size(1));
        return Output{
            in_chunks(x, decode, [&](const torch::Tensor& chunk) { return m(chunk, &cache); }), {}};
      });
}

}  // namespace

Module make_module(const Case& c) {
  const auto& a = c.args;
  auto arg = [&](const char* name) { return a.at(name).get<int64_t>(); };
  torch::manual_seed(c.seed);
  Module m;
  if (c.module == "SelfAttention") {
    m = wrap(attention::SelfAttention(arg("d_in"), arg("d_out_kq"), arg("d_out_v")),
             [](auto& sa, const Module::Inputs& in) {
               return Output{sa(in.at("x")), {}};
             });
  } else if (c.module == "MultiHeadAttentionWrapper") {
    m = wrap(attention::MultiHeadAttentionWrapper(arg("d_in"), arg("d_out_kq"), arg("d_out_v"),
                                                  arg("num_heads")),
             [](auto& mha, const Module::Inputs& in) {
               return Output{mha(in.at("x")), {}};
             });
  } else if (c.module == "CausalSelfAttention") {
    m = wrap(attention::CausalSelfAttention(arg("d_in"), arg("d_out_kq"), arg("d_out_v")),
             [](auto& causal, const Module::Inputs& in) {
               return Output{causal(in.at("x")), {}};
             });
  } else if (c.module == "CrossAttention") {
    attention::CrossAttentionOptions options(arg("d_in"), arg("d_out_kq"), arg("d_out_v"));
    if (a.contains("d_in_kv")) options.d_in_kv(arg("d_in_kv"));
    m = wrap(attention::CrossAttention(options), [](auto& cross, const Module::Inputs& in) {
      return Output{cross(in.at("x_1"), in.at("x_2")), {}};
    });
  } else if (c.module == "MultiHeadAttention" || c.module == "GatedMultiHeadAttention") {
    // The book's gated attention is MultiHeadAttention with gate(true).
    m = make_multi_head_attention(c);
  } else if (c.module == "ZooAttention") {
    m = make_zoo_attention(c);
  } else if (c.module == "MultiHeadLatentAttention") {
    m = make_multi_head_latent_attention(c);
  } else if (c.module == "KVSharingStack") {
    m = make_kv_sharing_stack(c);
  } else if (c.module == "GatedDeltaNet") {
    m = make_gated_delta_net(c);
  } else if (c.module == "MultiHeadAttentionWithDSA") {
    m = make_deepseek_sparse_attention(c);
  } else {
    TORCH_CHECK(false, "golden: case ", c.name, " names an unknown module ", c.module);
  }
  m.module->to(c.dtype);
  m.module->eval();
  return m;
}

std::map<std::string, torch::Tensor> read_tensors(const Case& c) {
  std::ifstream in(c.tensors_path, std::ios::binary);
  TORCH_CHECK(in, "golden: cannot open ", c.tensors_path);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : torch::pickle_load(bytes).toGenericDict()) {
    out[item.key().toStringRef()] = item.value().toTensor();
  }
  return out;
}

namespace {

// Whether the case's files name the projections as Hugging Face does: the zoo's Gemma 4.
bool hugging_face_names(const Case& c) {
  return c.module == "ZooAttention" && c.args.at("family") == "gemma4";
}

}  // namespace

attention::LoadOptions load_options(const Case& c) {
  // The book's Gemma 4 attention keeps Hugging Face's names, q_proj ... o_proj.
  if (hugging_face_names(c)) return attention::LoadOptions().layout(attention::WeightLayout::Llama);
  return {};
}

namespace {

// The name of a parameter in the case's files: the module's, or the Hugging Face name it loads
// from (load_options()).
std::string file_name(const Case& c, const std::string& name) {
  if (!hugging_face_names(c)) return name;
  static const std::map<std::string, std::string> hf = {{"W_query.", "q_proj."},
                                                        {"W_key.", "k_proj."},
                                                        {"W_value.", "v_proj."},
                                                        {"out_proj.", "o_proj."}};
  for (const auto& [mine, theirs] : hf) {
    if (name.rfind(mine, 0) == 0) return theirs + name.substr(mine.size());
  }
  return name;
}

// The golden case as the parity kit reads a recorded one: the same tensors under the kit's names
// (output -> output.0, grad_output -> grad_output.0, grad.<input> -> grad.input.<input>,
// grad.<parameter> -> grad.param.<parameter>), so that one harness, the kit's, checks both.
attention::testing::ParityCase as_parity_case(const Case& c, const torch::nn::Module& module,
                                              const std::map<std::string, torch::Tensor>& golden) {
  attention::testing::ParityCase p;
  p.name = c.name;
  p.rtol = c.rtol;
  p.atol = c.atol;
  p.gradients = c.mode == "train";
  p.input_names = c.inputs;
  for (const auto& name : c.inputs) {
    p.inputs.push_back(golden.at("input." + name));
    p.tensors["input." + name] = golden.at("input." + name);
    const auto grad = golden.find("grad." + name);
    if (p.gradients && grad != golden.end()) p.tensors["grad.input." + name] = grad->second;
  }
  p.output_names = {"0"};
  p.tensors["output.0"] = golden.at("output");
  if (golden.count("weights")) {
    p.output_names.push_back("weights");
    p.tensors["output.weights"] = golden.at("weights");
  }
  if (p.gradients) {
    p.tensors["grad_output.0"] = golden.at("grad_output");
    for (const auto& parameter : module.named_parameters()) {
      p.parameter_names.push_back(parameter.key());
      p.tensors["grad.param." + parameter.key()] =
          golden.at("grad." + file_name(c, parameter.key()));
    }
  }
  return p;
}

}  // namespace

std::string path_name(attention::functional::Path path) {
  using attention::functional::Path;
  switch (path) {
    case Path::None:
      return "none";
    case Path::Direct:
      return "direct";
    case Path::Math:
      return "math";
    case Path::ChunkedFused:
      return "chunked_fused";
    case Path::ChunkedTiles:
      return "chunked_tiles";
    case Path::Native:
      return "native";
  }
  return "unknown";
}

Comparison compare(const Case& c, Module& m, const std::map<std::string, torch::Tensor>& golden) {
  const auto recorded = as_parity_case(c, *m.module, golden);
  std::string path;
  const auto report = attention::testing::check_parity(
      *m.module, recorded,
      [&](const std::vector<torch::Tensor>& in) {
        Module::Inputs inputs;
        for (size_t i = 0; i < in.size(); ++i) inputs[c.inputs[i]] = in[i];
        const auto out = m.forward(inputs);
        path = path_name(attention::functional::last_path());
        std::vector<torch::Tensor> outputs{out.output};
        if (recorded.output_names.size() == 2) outputs.push_back(out.weights);
        return outputs;
      },
      // The test has loaded the weights already, from the case's own files.
      attention::testing::ParityOptions().load_weights(false));
  Comparison result;
  result.max_abs_diff = report.max_abs_diff;
  if (path != c.path) {
    result.failures.push_back(
        fmt::format("path: the forward took {}, the case is for {}", path, c.path));
  }
  for (const auto& mismatch : report.mismatches) {
    result.failures.push_back(attention::testing::to_string(mismatch));
  }
  return result;
}

}  // namespace golden
