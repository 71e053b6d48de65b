#include <attention/multi_head_attention.h>
#include <attention/paged_attention.h>

#include "functional/paged_step.h"
#include "functional/relative_buckets.h"
#include "functional/rotary_cache.h"
#include "modules/attention_caches.h"
#include "modules/projection.h"
#include "modules/shared.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

namespace attention {

namespace {

constexpr const char* kMultiHeadAttentionName = "attention::MultiHeadAttention";

// Folds the key padding mask (B, Tk), true = padding, into the attention mask.
torch::Tensor combine_masks(const torch::Tensor& attn_mask, const torch::Tensor& key_padding_mask) {
  if (!key_padding_mask.defined()) return attn_mask;
  const auto padding = key_padding_mask.unsqueeze(-2).unsqueeze(-3);  // (B, 1, 1, Tk)
  if (!attn_mask.defined()) return padding;
  if (attn_mask.scalar_type() == at::kBool) return attn_mask.logical_or(padding);
  return attn_mask.masked_fill(padding, -std::numeric_limits<double>::infinity());
}

}  // namespace

MultiHeadAttentionImpl::MultiHeadAttentionImpl(const MultiHeadAttentionOptions& options_)
    : options(options_) {
  reset();
}

namespace {

// A Norm of `size` features as `options` describe it.
Norm make_norm(const HeadNormOptions& options, int64_t size) {
  return Norm(NormOptions(size)
                  .kind(options.kind())
                  .eps(options.eps())
                  .elementwise_affine(options.elementwise_affine())
                  .parameter_name(options.parameter_name()));
}

// `options` of a head norm, checked before any parameter is made.
void check_head_norm(const HeadNormOptions& options, const char* which) {
  TORCH_CHECK_VALUE(std::isfinite(options.eps()) && options.eps() >= 0.0, kMultiHeadAttentionName,
                    ": expected ", which, " with a finite eps >= 0, got ", options.eps());
}

}  // namespace

void MultiHeadAttentionImpl::reset() {
  const auto& o = options;
  for (const auto& [value, name] : {std::pair{o.d_in(), "d_in"},
                                    {o.d_out(), "d_out"},
                                    {o.num_heads(), "num_heads"},
                                    {o.num_kv_heads(), "num_kv_heads"},
                                    {o.d_in_kv(), "d_in_kv"}}) {
    detail::check_positive(value, name, kMultiHeadAttentionName);
  }
  TORCH_CHECK_VALUE(o.head_dim() >= 0, kMultiHeadAttentionName,
                    ": expected head_dim >= 0 (0: d_out / num_heads), got ", o.head_dim());
  TORCH_CHECK_VALUE(o.head_dim() > 0 || o.d_out() % o.num_heads() == 0, kMultiHeadAttentionName,
                    ": expected num_heads to divide d_out, ", "got d_out ", o.d_out(),
                    " and num_heads ", o.num_heads(), " (or give head_dim)");
  TORCH_CHECK_VALUE(o.num_heads() % o.num_kv_heads() == 0, kMultiHeadAttentionName,
                    ": expected num_kv_heads to divide num_heads, got num_heads ", o.num_heads(),
                    " and num_kv_heads ", o.num_kv_heads());
  // The heads' width, twice it for the queries with their gate: products that must fit.
  int64_t heads_width = 0, query_width = 0;
  TORCH_CHECK_VALUE(
      !__builtin_mul_overflow(o.num_heads(), head_dim(), &heads_width) &&
          !__builtin_mul_overflow(heads_width, o.gate_in_query() ? 2 : 1, &query_width),
      kMultiHeadAttentionName, ": num_heads x head_dim = ", o.num_heads(), " x ", head_dim(),
      " (twice that with gate_in_query) exceeds INT64_MAX");
  TORCH_CHECK_VALUE(o.output_projection() || heads_width == o.d_out(), kMultiHeadAttentionName,
                    ": without out_proj the output is the heads joined: expected d_out = "
                    "num_heads x head_dim = ",
                    heads_width, ", got ", o.d_out());
  TORCH_CHECK_VALUE(
      !o.gate_in_query() || o.gate(), kMultiHeadAttentionName,
      ": gate_in_query places the output gate's rows in W_query: expected gate(true)");
  TORCH_CHECK_VALUE(o.context_length() >= 0, kMultiHeadAttentionName,
                    ": expected context_length >= 0, got ", o.context_length());
  TORCH_CHECK_VALUE(o.dropout() >= 0.0 && o.dropout() < 1.0, kMultiHeadAttentionName,
                    ": expected dropout in [0, 1), got ", o.dropout());
  TORCH_CHECK_VALUE(!o.sliding_window() || *o.sliding_window() >= 1, kMultiHeadAttentionName,
                    ": expected sliding_window >= 1 (unset for none), got ", *o.sliding_window());
  TORCH_CHECK_VALUE(!o.softcap() || (std::isfinite(*o.softcap()) && *o.softcap() > 0.0),
                    kMultiHeadAttentionName,
                    ": expected a finite softcap > 0 (unset for none), got ", *o.softcap());
  TORCH_CHECK_VALUE(!o.scale() || std::isfinite(*o.scale()), kMultiHeadAttentionName,
                    ": expected a finite scale (unset for 1 / sqrt(head_dim)), got ", *o.scale());
  if (o.qk_norm()) check_head_norm(*o.qk_norm(), "qk_norm");
  if (o.value_norm()) check_head_norm(*o.value_norm(), "value_norm");
  if (o.relative_bias()) {
    detail::check_relative_buckets(*o.relative_bias(), "relative_bias", kMultiHeadAttentionName);
  }
  alibi_slopes_ = o.alibi() ? functional::alibi_slopes(o.num_heads()) : torch::Tensor();
  rotary_ = o.rope() ? std::make_shared<detail::RotaryCache>(
                           detail::resolve_rotary(*o.rope(), head_dim(), kMultiHeadAttentionName))
                     : nullptr;
  const int64_t kv_dim = o.num_kv_heads() * head_dim();
  using torch::nn::LinearOptions;
  W_query = register_module(
      "W_query", torch::nn::Linear(LinearOptions(o.d_in(), query_width).bias(o.qkv_bias())));
  // The book's GatedMultiHeadAttention makes its gate right after the queries.
  W_gate = o.gate() && !o.gate_in_query()
               ? register_module(
                     "W_gate",
                     torch::nn::Linear(LinearOptions(o.d_in(), heads_width).bias(o.qkv_bias())))
               : torch::nn::Linear(nullptr);
  W_key = register_module("W_key",
                          torch::nn::Linear(LinearOptions(o.d_in_kv(), kv_dim).bias(o.qkv_bias())));
  W_value = register_module(
      "W_value", torch::nn::Linear(LinearOptions(o.d_in_kv(), kv_dim).bias(o.qkv_bias())));
  if (o.output_projection()) {
    out_proj = register_module(
        "out_proj", torch::nn::Linear(LinearOptions(heads_width, o.d_out()).bias(o.out_bias())));
  }
  // The norms after out_proj, as the zoo's classes make them; they draw nothing from the
  // generator, so the other parameters keep the book's seeded values.
  const auto norm_size = [&](const HeadNormOptions& n, int64_t heads) {
    return n.scope() == HeadNormScope::PerHead ? head_dim() : heads * head_dim();
  };
  if (o.qk_norm()) {
    q_norm =
        register_module("q_norm", make_norm(*o.qk_norm(), norm_size(*o.qk_norm(), o.num_heads())));
    k_norm = register_module("k_norm",
                             make_norm(*o.qk_norm(), norm_size(*o.qk_norm(), o.num_kv_heads())));
  }
  if (o.value_norm()) {
    v_norm = register_module(
        "v_norm", make_norm(*o.value_norm(), norm_size(*o.value_norm(), o.num_kv_heads())));
  }
  // Drawn after out_proj, so that the other parameters keep the book's seeded values.
  sinks = o.sinks() ? register_parameter("sinks", torch::randn({o.num_heads()}) * 0.02)
                    : torch::Tensor();
  relative_attention_bias =
      o.relative_bias()
          ? register_parameter(
                "relative_attention_bias",
                torch::randn({o.relative_bias()->num_buckets(), o.num_heads()}) * 0.02)
          : torch::Tensor();
}

torch::Tensor MultiHeadAttentionImpl::output_of(const torch::Tensor& context,
                                                const torch::Tensor& gate) {
  const auto gated = gate.defined() ? context * torch::sigmoid(gate) : context;
  return out_proj ? detail::project(out_proj, gated) : gated;
}

functional::ScaledDotProductAttentionOptions MultiHeadAttentionImpl::variants(
    functional::ScaledDotProductAttentionOptions attention) const {
  const auto& o = options;
  attention.causal_alignment(o.causal_alignment()).softcap(o.softcap()).scale(o.scale());
  if (o.sliding_window()) {
    attention.window_left(*o.sliding_window() - 1);
    if (!o.causal()) attention.window_right(*o.sliding_window() - 1);
  }
  if (alibi_slopes_.defined()) attention.alibi_slopes(alibi_slopes_);
  if (sinks.defined()) attention.sinks(sinks);
  if (relative_attention_bias.defined()) {
    attention.relative_bias(relative_attention_bias).relative_buckets(*o.relative_bias());
  }
  return attention;
}

bool MultiHeadAttentionImpl::reads_codes_in_place(
    const torch::Tensor& x, const MultiHeadAttentionForwardOptions& forward_options) const {
  // What the paged kernel refuses (dense masks, weights, dropout, gradients), and what it would
  // read differently (a block mask or score_mod made for the batch): those take the keys and
  // values the codes stand for.
  const bool dropout = is_training() && options.dropout() > 0.0;
  const bool grad =
      detail::records_grad(x) || (c10::GradMode::is_enabled() && W_query->weight.requires_grad());
  return !forward_options.attn_mask().defined() && !forward_options.key_padding_mask().defined() &&
         !forward_options.need_weights() && !forward_options.block_mask() &&
         !forward_options.score_mod() && !dropout && !grad;
}

torch::Tensor MultiHeadAttentionImpl::attend_codes(const torch::Tensor& queries,
                                                   const KVCache& cache,
                                                   functional::Backend backend) const {
  // Each batch row a sequence whose keys are one page: the cache's storage, read in place.
  const int64_t B = queries.size(0), H = queries.size(1), t_q = queries.size(2);
  const int64_t hd = queries.size(3);
  const auto cpu_long = torch::TensorOptions().dtype(torch::kLong);
  const auto packed = queries.transpose(1, 2).reshape({B * t_q, H, hd});
  const auto out = functional::paged_attention(
      packed, cache.keys(), cache.key_scales(), cache.values(), cache.value_scales(),
      torch::arange(0, (B + 1) * t_q, t_q, cpu_long), torch::full({B}, cache.length(), cpu_long),
      torch::arange(B, cpu_long).view({B, 1}),
      variants(functional::ScaledDotProductAttentionOptions()
                   .is_causal(options.causal())
                   .backend(backend)));
  return out.view({B, t_q, H, hd}).transpose(1, 2);
}

void MultiHeadAttentionImpl::pretty_print(std::ostream& stream) const {
  const auto& o = options;
  stream << kMultiHeadAttentionName << "(d_in=" << o.d_in() << ", d_out=" << o.d_out()
         << ", num_heads=" << o.num_heads() << ", num_kv_heads=" << o.num_kv_heads()
         << ", context_length=" << o.context_length() << ", dropout=" << o.dropout()
         << ", qkv_bias=" << std::boolalpha << o.qkv_bias() << ", out_bias=" << o.out_bias()
         << ", causal=" << o.causal() << ", d_in_kv=" << o.d_in_kv();
  if (o.causal_alignment() == functional::CausalAlignment::TopLeft) {
    stream << ", causal_alignment=TopLeft";
  }
  if (o.sliding_window()) stream << ", sliding_window=" << *o.sliding_window();
  if (o.softcap()) stream << ", softcap=" << *o.softcap();
  if (o.alibi()) stream << ", alibi=true";
  if (o.sinks()) stream << ", sinks=true";
  if (o.gate()) stream << ", gate=true";
  if (o.relative_bias()) {
    const auto& r = *o.relative_bias();
    if (r.kind == functional::RelativeBuckets::Kind::T5) {
      stream << ", relative_bias=t5(num_buckets=" << r.num_buckets()
             << ", max_distance=" << r.max_distance << ", bidirectional=" << r.bidirectional << ")";
    } else {
      stream << ", relative_bias=distance(max_distance=" << r.max_distance << ")";
    }
  }
  if (rotary_) {
    const auto& r = rotary_->options();
    stream << ", rope(theta=" << r.theta() << ", rotary_dim=" << r.rotary_dim() << ", layout="
           << (r.layout() == functional::RotaryLayout::HalfSplit ? "HalfSplit" : "Interleaved");
    if (r.rotated_pairs() > 0) stream << ", rotated_pairs=" << r.rotated_pairs();
    stream << (r.llama3_scaling() ? ", llama3_scaling" : "")
           << (r.yarn_scaling() ? ", yarn_scaling" : "") << ")";
  }
  if (o.head_dim() > 0) stream << ", head_dim=" << o.head_dim();
  if (o.gate_in_query()) stream << ", gate_in_query=true";
  if (o.scale()) stream << ", scale=" << *o.scale();
  const auto norm = [&](const char* name, const c10::optional<HeadNormOptions>& n) {
    if (!n) return;
    const char* kinds[] = {"RMS", "ZeroCenteredRMS", "LayerNorm"};
    stream << ", " << name << "(" << kinds[static_cast<int>(n->kind())]
           << (n->scope() == HeadNormScope::PerHead ? ", per head" : ", over the projection")
           << ", eps=" << n->eps() << (n->elementwise_affine() ? "" : ", no weight") << ")";
  };
  norm("qk_norm", o.qk_norm());
  norm("value_norm", o.value_norm());
  stream << ")";
}

struct MultiHeadAttentionImpl::Call {
  torch::Tensor x;       // (B, T, d_in): the input, batched
  torch::Tensor source;  // (B, Tk_new, d_in_kv): what the keys and values are projected from
  bool unbatched = false;
  int64_t batch = 0, tokens = 0;
  int64_t keys = 0;             // how many keys the call attends to, the cache's included
  torch::Tensor mask;           // attn_mask with the key padding folded in (batched)
  bool codes_in_place = false;  // an 8-bit KVCache read in place (attend_codes)
};

struct MultiHeadAttentionImpl::Heads {
  torch::Tensor queries, keys, values, gate;
};

MultiHeadAttentionImpl::Call MultiHeadAttentionImpl::check_forward(
    const torch::Tensor& x, const MultiHeadAttentionForwardOptions& forward_options,
    const detail::AttentionCaches& caches) const {
  using detail::shape_str;
  const auto& weight = W_query->weight;
  detail::check_module_input(x, options.d_in(), weight, kMultiHeadAttentionName, "input");
  Call call;
  call.unbatched = x.dim() == 2;
  const auto batched = [&](const torch::Tensor& t) { return call.unbatched ? t.unsqueeze(0) : t; };
  call.x = batched(x);
  call.source = call.x;
  if (forward_options.context().defined()) {
    const auto& context = forward_options.context();
    detail::check_module_input(context, options.d_in_kv(), weight, kMultiHeadAttentionName,
                               "context");
    detail::check_same_batch(x, context, kMultiHeadAttentionName, "x", "context");
    call.source = batched(context);
  }
  auto* const sliding = forward_options.sliding_kv_cache();
  TORCH_CHECK_VALUE(!(sliding && forward_options.kv_cache()), kMultiHeadAttentionName,
                    ": expected at most one of kv_cache and sliding_kv_cache, got both");
  if (sliding && options.sliding_window()) {
    TORCH_CHECK_VALUE(sliding->sink_tokens() == 0 && sliding->window() >= *options.sliding_window(),
                      kMultiHeadAttentionName,
                      ": expected a sliding_kv_cache of window >= sliding_window = ",
                      *options.sliding_window(), " and no sink tokens, got window ",
                      sliding->window(), " and ", sliding->sink_tokens(), " sink tokens");
  }
  // Top-left alignment would place the new queries at the first cached positions.
  const bool placed =
      options.causal() || options.sliding_window() || options.alibi() || options.relative_bias();
  TORCH_CHECK_VALUE(!(sliding || forward_options.kv_cache()) || !placed ||
                        options.causal_alignment() == functional::CausalAlignment::BottomRight,
                    kMultiHeadAttentionName,
                    ": a kv_cache or sliding_kv_cache needs causal_alignment BottomRight (the new "
                    "tokens follow the cached ones), got TopLeft");
  TORCH_CHECK_VALUE(!rotary_ || !forward_options.context().defined(), kMultiHeadAttentionName,
                    ": rotary embeddings need queries and keys of one sequence; got a context "
                    "(cross-attention): use a module without rope for it");
  call.batch = call.x.size(0);
  call.tokens = call.x.size(1);
  if (forward_options.shared_kv()) {
    check_shared_kv(*forward_options.shared_kv(), forward_options, call.batch, call.tokens);
  }
  TORCH_CHECK_VALUE(!(forward_options.share_kv() && sliding), kMultiHeadAttentionName,
                    ": share_kv hands on the keys of a kv_cache or of this call, not of a "
                    "sliding_kv_cache (their positions move with the window)");
  const int64_t new_keys = call.source.size(1);
  call.keys = caches.keys(new_keys);
  TORCH_CHECK_VALUE(options.context_length() == 0 || call.keys <= options.context_length(),
                    kMultiHeadAttentionName,
                    ": expected at most context_length = ", options.context_length(), " keys, got ",
                    call.keys);
  const int64_t t_q = call.tokens, t_k = call.keys, B = call.batch, H = options.num_heads();
  const auto& padding = forward_options.key_padding_mask();
  if (padding.defined()) {
    const auto expected = call.unbatched ? std::vector<int64_t>{t_k} : std::vector<int64_t>{B, t_k};
    TORCH_CHECK_TYPE(padding.scalar_type() == at::kBool, kMultiHeadAttentionName,
                     ": expected key_padding_mask of dtype bool (true = padding), got ",
                     padding.scalar_type());
    TORCH_CHECK_VALUE(padding.sizes() == c10::IntArrayRef(expected), kMultiHeadAttentionName,
                      ": expected key_padding_mask ", shape_str(expected), ", got ",
                      shape_str(padding.sizes()));
    TORCH_CHECK(padding.device() == x.device(), kMultiHeadAttentionName,
                ": expected key_padding_mask on device ", x.device(), " (the input's), got ",
                padding.device());
  }
  const auto& attn_mask = forward_options.attn_mask();
  if (attn_mask.defined()) {
    const auto scores =
        call.unbatched ? std::vector<int64_t>{H, t_q, t_k} : std::vector<int64_t>{B, H, t_q, t_k};
    // Checked before the key padding mask is folded in, which takes bool or floating masks.
    const auto dtype = W_query->weight.scalar_type();
    TORCH_CHECK_TYPE(attn_mask.scalar_type() == at::kBool || attn_mask.scalar_type() == dtype,
                     kMultiHeadAttentionName,
                     ": expected attn_mask of dtype bool (true = masked out) or ", dtype,
                     " (additive), got ", attn_mask.scalar_type());
    TORCH_CHECK_VALUE(detail::broadcastable_to(attn_mask.sizes(), scores), kMultiHeadAttentionName,
                      ": expected attn_mask broadcastable to ", shape_str(scores), ", got ",
                      shape_str(attn_mask.sizes()));
    TORCH_CHECK(attn_mask.device() == x.device(), kMultiHeadAttentionName,
                ": expected attn_mask on device ", x.device(), " (the input's), got ",
                attn_mask.device());
  }
  call.mask = combine_masks(attn_mask, padding.defined() ? batched(padding) : padding);
  TORCH_CHECK_VALUE(!(forward_options.score_mod() && sliding), kMultiHeadAttentionName,
                    ": takes no score_mod with a sliding_kv_cache (its keys' positions move with "
                    "the window)");
  const auto& blocks = forward_options.block_mask();
  if (blocks) {
    TORCH_CHECK_VALUE(!sliding, kMultiHeadAttentionName,
                      ": takes no block_mask with a sliding_kv_cache (its keys' positions move "
                      "with the window)");
    TORCH_CHECK_VALUE(blocks->t_q() == t_q && blocks->t_k() == t_k, kMultiHeadAttentionName,
                      ": expected a block_mask made for ", t_q, " queries and ", t_k,
                      " keys (with a kv_cache, its keys and this call's), got one made for ",
                      blocks->t_q(), " and ", blocks->t_k());
    TORCH_CHECK_VALUE((blocks->batch() == 1 || blocks->batch() == B) &&
                          (blocks->heads() == 1 || blocks->heads() == H),
                      kMultiHeadAttentionName, ": expected a block_mask of batch 1 or ", B,
                      " and heads 1 or ", H, ", got batch ", blocks->batch(), " and heads ",
                      blocks->heads());
  }
  // An 8-bit cache's codes are read in place where the paged kernel takes the call (and no later
  // layer wants the keys); otherwise its append() gives the keys and values they stand for.
  const KVCache* cache = forward_options.kv_cache();
  call.codes_in_place = cache && cache->quantized() && t_k > 0 && !forward_options.share_kv() &&
                        reads_codes_in_place(call.x, forward_options);
  return call;
}

MultiHeadAttentionImpl::Heads MultiHeadAttentionImpl::project_heads(const torch::Tensor& x,
                                                                    const torch::Tensor& source,
                                                                    bool own_keys) {
  const int64_t B = x.size(0), t_q = x.size(1), H = options.num_heads();
  const int64_t H_kv = options.num_kv_heads(), hd = head_dim();
  const auto& qk = options.qk_norm();
  const auto& v = options.value_norm();
  const auto over_projection = [](const c10::optional<HeadNormOptions>& n) {
    return n && n->scope() == HeadNormScope::Projection;
  };
  const auto per_head = [](const c10::optional<HeadNormOptions>& n) {
    return n && n->scope() == HeadNormScope::PerHead;
  };
  // (B, T, heads x hd) -> (B, heads, T, hd), normalized over the whole projection before the
  // split or per head after it.
  const auto split = [&](torch::Tensor flat, int64_t heads, Norm norm,
                         const c10::optional<HeadNormOptions>& n) {
    if (over_projection(n)) flat = norm(flat);
    auto split_heads = flat.view({B, flat.size(1), heads, hd}).transpose(1, 2);
    return per_head(n) ? norm(split_heads) : split_heads;
  };
  Heads heads;
  torch::Tensor q;
  if (own_keys) {
    auto [projected_q, k, projected_v] =
        detail::project_qkv(W_query, W_key, W_value, x, source, &workspace_);
    q = projected_q;
    heads.keys = split(k, H_kv, k_norm, qk);
    heads.values = split(projected_v, H_kv, v_norm, v);
  } else {
    q = detail::project(W_query, x, &workspace_);
  }
  if (options.gate_in_query()) {
    // Each head's queries, then its gate (Qwen3.5's q_proj).
    const auto both = q.view({B, t_q, H, 2 * hd});
    heads.gate = both.narrow(-1, hd, hd).reshape({B, t_q, H * hd});
    q = both.narrow(-1, 0, hd).reshape({B, t_q, H * hd});
  } else if (W_gate) {
    heads.gate = detail::project(W_gate, x);
  }
  heads.queries = split(q, H, q_norm, qk);
  return heads;
}

void MultiHeadAttentionImpl::rotate_heads(Heads& heads, const torch::Tensor& cos,
                                          const torch::Tensor& sin, bool keys_too) const {
  const auto layout = rotary_->options().layout();
  heads.queries = detail::rotate(heads.queries, cos, sin, layout);
  if (keys_too) heads.keys = detail::rotate(heads.keys, cos, sin, layout);
}

functional::AttentionOutput MultiHeadAttentionImpl::forward(
    const torch::Tensor& x, const MultiHeadAttentionForwardOptions& forward_options) {
  detail::AttentionCaches caches(forward_options);
  const Call call = check_forward(x, forward_options, caches);
  // Project, normalize and split into heads (a reading layer's keys and values are its
  // producer's: only its queries are its own).
  Heads heads = project_heads(call.x, call.source, !caches.shared());
  // Rotate: the new tokens continue the cache's positions (shared keys arrive rotated).
  if (rotary_) {
    auto [cos, sin] = rotary_->rows(caches.past(call.tokens), call.tokens,
                                    heads.queries.scalar_type(), heads.queries.device());
    rotate_heads(heads, cos, sin, !caches.shared());
  }
  // Cache, and attend.
  auto [keys, values] = caches.append(heads.keys, heads.values, call.codes_in_place);
  auto attention = call.codes_in_place
                       ? functional::AttentionOutput{attend_codes(heads.queries, *caches.kv_cache(),
                                                                  forward_options.backend()),
                                                     {}}
                       : functional::scaled_dot_product_attention(
                             heads.queries, keys, values,
                             variants(functional::ScaledDotProductAttentionOptions()
                                          .attn_mask(call.mask)
                                          .block_mask(forward_options.block_mask())
                                          .score_mod(forward_options.score_mod())
                                          .is_causal(options.causal())
                                          .dropout_p(is_training() ? options.dropout() : 0.0)
                                          .need_weights(forward_options.need_weights())
                                          .backend(forward_options.backend())));
  // Join the heads, gate, project.
  const int64_t width = options.num_heads() * head_dim();
  auto output = output_of(
      attention.output.transpose(1, 2).reshape({call.batch, call.tokens, width}), heads.gate);
  auto weights = attention.weights;
  if (weights.defined() && forward_options.average_attn_weights()) weights = weights.mean(1);
  if (call.unbatched) {
    output = output.squeeze(0);
    if (weights.defined()) weights = weights.squeeze(0);
  }
  caches.keep();
  if (forward_options.share_kv() != nullptr) {
    *forward_options.share_kv() = SharedKV{
        keys, values,
        rotary_ ? c10::optional<functional::RotaryOptions>(rotary_->options()) : c10::nullopt,
        true};
  }
  return {output, weights};
}

void MultiHeadAttentionImpl::check_shared_kv(
    const SharedKV& shared, const MultiHeadAttentionForwardOptions& forward_options, int64_t batch,
    int64_t tokens) const {
  TORCH_CHECK_VALUE(!forward_options.kv_cache() && !forward_options.sliding_kv_cache(),
                    kMultiHeadAttentionName,
                    ": a layer that reads shared_kv keeps no cache of its own (its producing "
                    "layer's cache holds the keys), got a kv_cache or sliding_kv_cache");
  TORCH_CHECK_VALUE(!forward_options.context().defined(), kMultiHeadAttentionName,
                    ": shared_kv gives the keys and values, got a context as well");
  TORCH_CHECK_VALUE(!forward_options.share_kv(), kMultiHeadAttentionName,
                    ": expected share_kv or shared_kv, got both (layers after a reading layer "
                    "read the producer's SharedKV too)");
  if (shared.produced) {
    // The producer's keys carry its rotary embedding: this layer's queries must turn alike (a
    // layer without one, or with another, would meet keys at positions it does not know).
    const auto describe = [](const c10::optional<functional::RotaryOptions>& r) {
      if (!r) return std::string("none");
      std::ostringstream text;
      text << "theta " << r->theta() << ", rotary_dim " << r->rotary_dim() << ", "
           << (r->layout() == functional::RotaryLayout::HalfSplit ? "HalfSplit" : "Interleaved")
           << ", rotated_pairs " << r->rotated_pairs()
           << (r->llama3_scaling() ? ", llama3_scaling" : "")
           << (r->yarn_scaling() ? ", yarn_scaling" : "");
      return text.str();
    };
    const auto mine =
        rotary_ ? c10::optional<functional::RotaryOptions>(rotary_->options()) : c10::nullopt;
    TORCH_CHECK_VALUE(describe(mine) == describe(shared.rope), kMultiHeadAttentionName,
                      ": shared_kv's keys carry their producer's rotary embedding (",
                      describe(shared.rope), "), and this layer's is ", describe(mine),
                      ": a reading layer needs its producer's rope");
  }
  const auto& keys = shared.keys;
  const auto& values = shared.values;
  TORCH_CHECK_VALUE(keys.defined() && values.defined(), kMultiHeadAttentionName,
                    ": expected shared_kv filled by an earlier layer's forward with share_kv, got "
                    "an empty SharedKV (does this layer run before its producer?)");
  const auto& weight = W_query->weight;
  // Keys of another rank have no T to compare: -1 fails the comparison below.
  const int64_t t = keys.dim() == 4 ? keys.size(2) : -1;
  const std::vector<int64_t> expected = {batch, options.num_kv_heads(), t, head_dim()};
  TORCH_CHECK_VALUE(keys.dim() == 4 && keys.sizes() == c10::IntArrayRef(expected) &&
                        values.sizes() == keys.sizes(),
                    kMultiHeadAttentionName, ": expected shared keys and values (", batch, ", ",
                    options.num_kv_heads(), ", T, ", head_dim(), "), got ",
                    detail::shape_str(keys.sizes()), " and ", detail::shape_str(values.sizes()));
  TORCH_CHECK_VALUE(keys.size(2) >= tokens, kMultiHeadAttentionName,
                    ": expected shared keys of at least x's ", tokens,
                    " tokens (they end with them), got ", keys.size(2));
  TORCH_CHECK_TYPE(
      keys.scalar_type() == weight.scalar_type() && values.scalar_type() == weight.scalar_type(),
      kMultiHeadAttentionName, ": expected shared keys and values of dtype ", weight.scalar_type(),
      " (the parameters' dtype), got ", keys.scalar_type(), " and ", values.scalar_type());
  TORCH_CHECK(keys.device() == weight.device() && values.device() == weight.device(),
              kMultiHeadAttentionName, ": expected shared keys and values on device ",
              weight.device(), " (the parameters' device), got ", keys.device(), " and ",
              values.device());
}

torch::Tensor MultiHeadAttentionImpl::forward_paged(const torch::Tensor& x, PagedKVCache& cache,
                                                    const PagedBatch& batch, int64_t layer,
                                                    functional::Backend backend) {
  return forward_paged(x, cache, batch, PagedForwardOptions().layer(layer).backend(backend));
}

torch::Tensor MultiHeadAttentionImpl::forward_paged(const torch::Tensor& x, PagedKVCache& cache,
                                                    const PagedBatch& batch,
                                                    const PagedForwardOptions& step) {
  constexpr const char* kForwardPaged = "attention::MultiHeadAttention::forward_paged";
  const int64_t layer = step.layer();
  using detail::shape_str;
  const auto& weight = W_query->weight;
  detail::check_module_input(x, options.d_in(), weight, kForwardPaged, "input");
  const int64_t total = batch.total_tokens(), H = options.num_heads();
  const int64_t H_kv = options.num_kv_heads(), hd = head_dim();
  TORCH_CHECK_VALUE(x.dim() == 2 && x.size(0) == total, kForwardPaged, ": expected x (", total,
                    ", ", options.d_in(), "), the batch's new tokens packed, got ",
                    shape_str(x.sizes()));
  TORCH_CHECK_VALUE(options.d_in_kv() == options.d_in(), kForwardPaged,
                    ": is self-attention: expected d_in_kv = d_in = ", options.d_in(), ", got ",
                    options.d_in_kv());
  TORCH_CHECK_VALUE(cache.holds(batch), kForwardPaged,
                    ": the batch does not describe the cache as it is now (it was made before the "
                    "cache last changed, or by another cache): extend() again");
  const auto& c = cache.options();
  TORCH_CHECK_VALUE(c.num_kv_heads() == H_kv && c.head_dim() == hd, kForwardPaged,
                    ": expected a cache of num_kv_heads = ", H_kv, " and head_dim = ", hd,
                    " (the module's), got ", c.num_kv_heads(), " and ", c.head_dim());
  TORCH_CHECK_TYPE(c.dtype() == weight.scalar_type() || cache.quantized(), kForwardPaged,
                   ": expected a cache of dtype ", weight.scalar_type(),
                   " (the module's) or Char (8-bit), got ", c.dtype());
  TORCH_CHECK_VALUE(layer >= 0 && layer < c.num_layers(), kForwardPaged,
                    ": expected a layer in [0, ", c.num_layers(), "), got ", layer);
  // A cache that lets pages go must not drop keys this module's queries still see.
  TORCH_CHECK_VALUE(
      !c.sliding_window() ||
          (options.sliding_window() && *options.sliding_window() <= *c.sliding_window()),
      kForwardPaged, ": a cache with sliding_window = ", c.sliding_window().value_or(0),
      " needs a module whose sliding_window is at most that, got ",
      options.sliding_window() ? std::to_string(*options.sliding_window()) : "none");
  const bool placed =
      options.causal() || options.sliding_window() || options.alibi() || options.relative_bias();
  TORCH_CHECK_VALUE(
      !placed || options.causal_alignment() == functional::CausalAlignment::BottomRight,
      kForwardPaged,
      ": needs causal_alignment BottomRight (the new tokens follow the cached ones), "
      "got TopLeft");
  const auto lengths = batch.key_lengths();
  const int64_t longest = lengths.numel() > 0 ? lengths.max().item<int64_t>() : 0;
  TORCH_CHECK_VALUE(options.context_length() == 0 || longest <= options.context_length(),
                    kForwardPaged, ": expected at most context_length = ", options.context_length(),
                    " keys, got ", longest);
  const auto parameters = this->parameters();
  const bool learns = c10::GradMode::is_enabled() &&
                      std::any_of(parameters.begin(), parameters.end(),
                                  [](const torch::Tensor& p) { return p.requires_grad(); });
  TORCH_CHECK(!detail::records_grad(x) && !learns, kForwardPaged,
              ": is for inference: the cache holds no gradients; call it under "
              "torch::NoGradGuard");
  if (step.block_mask()) {
    // Checked here, before the cache is written: each sequence reads its row's top-left corner.
    const BlockMask& blocks = *step.block_mask();
    const int64_t count = static_cast<int64_t>(batch.sequences().size());
    const auto starts = batch.query_starts();
    const int64_t most =
        count > 0 ? (starts.slice(0, 1) - starts.slice(0, 0, count)).max().item<int64_t>() : 0;
    TORCH_CHECK_VALUE((blocks.batch() == 1 || blocks.batch() == count) &&
                          (blocks.heads() == 1 || blocks.heads() == H),
                      kForwardPaged, ": expected a block_mask of batch 1 or ", count,
                      " (one row per sequence of the batch) and heads 1 or ", H, ", got batch ",
                      blocks.batch(), " and heads ", blocks.heads());
    TORCH_CHECK_VALUE(blocks.t_q() >= most && blocks.t_k() >= longest, kForwardPaged,
                      ": expected a block_mask made for at least ", most, " queries and ", longest,
                      " keys (the step's most new tokens of a sequence, its longest sequence), got "
                      "one made for ",
                      blocks.t_q(), " and ", blocks.t_k());
  }

  // Project, normalize and split into heads: (1, heads, total, hd), the step's tokens one
  // sequence after another.
  const auto step_tokens = x.unsqueeze(0);
  Heads heads = project_heads(step_tokens, step_tokens, /*own_keys=*/true);
  if (rotary_ && total > 0) {
    // Rotate: each token at its position in its own sequence.
    const auto& positions = batch.positions();
    const int64_t last = positions.max().item<int64_t>();
    const auto device = heads.queries.device();
    const auto compute = detail::rotary_compute_dtype(heads.queries.scalar_type());
    torch::Tensor cos, sin;
    if (last < detail::RotaryCache::kMaxCachedPositions) {
      std::tie(cos, sin) = rotary_->rows(0, last + 1, heads.queries.scalar_type(), device);
      const auto index = positions.to(device);
      cos = cos.index_select(0, index);
      sin = sin.index_select(0, index);
    } else {
      std::tie(cos, sin) = functional::rotary_tables(positions, rotary_->options(), compute);
      cos = cos.to(device);
      sin = sin.to(device);
    }
    rotate_heads(heads, cos, sin, /*keys_too=*/true);
  }
  // Cache (the batch's pages of this layer), and attend through the pages: whatever the
  // attention would refuse is refused before the pages are written.
  const auto packed = [](const torch::Tensor& t) { return t.squeeze(0).transpose(0, 1); };
  const auto attention = variants(functional::ScaledDotProductAttentionOptions()
                                      .is_causal(options.causal())
                                      .block_mask(step.block_mask())
                                      .score_mod(step.score_mod())
                                      .backend(step.backend()));
  const auto queries = packed(heads.queries), keys = packed(heads.keys);
  detail::check_paged_step(queries, cache.keys(layer), cache.key_scales(layer), cache.values(layer),
                           cache.value_scales(layer), batch.query_starts(), batch.key_lengths(),
                           batch.page_table(), attention, keys, kForwardPaged);
  cache.write(layer, batch, keys, packed(heads.values));
  const auto attended = functional::paged_attention(
      queries, cache.keys(layer), cache.key_scales(layer), cache.values(layer),
      cache.value_scales(layer), batch.query_starts(), batch.key_lengths(), batch.page_table(),
      attention);
  // Join the heads, gate, project.
  return output_of(attended.reshape({1, total, options.num_heads() * hd}), heads.gate).squeeze(0);
}

}  // namespace attention
