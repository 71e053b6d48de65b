// attention-demo: Raschka's article, step by step, with every printed value checked.

#include <attention/attention.h>

#include "demo/article.h"

#include <ATen/Parallel.h>
#include <fmt/core.h>
#include <torch/nn/modules/embedding.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>

namespace {

struct Checker {
  int64_t reproduced = 0;
  int64_t total = 0;

  void check(const std::string& what, const torch::Tensor& computed, const torch::Tensor& printed) {
    const int64_t ok = article::count_matching(computed, printed);
    reproduced += ok;
    total += printed.numel();
    if (ok != printed.numel()) {
      fmt::print("MISMATCH in {}: {} of {} values differ from the article's\n", what,
                 printed.numel() - ok, printed.numel());
    }
  }
};

void section(const std::string& title) {
  fmt::print("\n== {} ==\n", title);
}

void show(const std::string& name, const torch::Tensor& t) {
  fmt::print("{} = {}\n", name, t);
}

struct Arguments {
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::string heatmap_dir;
};

Arguments parse_arguments(int argc, char** argv) {
  Arguments args;
  int& threads = args.threads;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--threads" && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (arg == "--heatmap" && i + 1 < argc) {
      args.heatmap_dir = argv[++i];
    } else if (arg == "--help" || arg == "-h") {
      fmt::print("usage: attention-demo [--threads N] [--heatmap DIR]\n");
      std::exit(0);
    } else {
      fmt::print(stderr, "attention-demo: unknown argument '{}' (try --help)\n", arg);
      std::exit(2);
    }
  }
  if (threads < 1) {
    fmt::print(stderr, "attention-demo: --threads expects a positive number\n");
    std::exit(2);
  }
  return args;
}

// The attention weights of queries x_q against keys and values of x_kv under given projections.
torch::Tensor weights_of(const torch::Tensor& x_q, const torch::Tensor& x_kv,
                         const torch::Tensor& W_query, const torch::Tensor& W_key,
                         const torch::Tensor& W_value, bool causal) {
  namespace F = attention::functional;
  return F::scaled_dot_product_attention(
             x_q.matmul(W_query), x_kv.matmul(W_key), x_kv.matmul(W_value),
             F::ScaledDotProductAttentionOptions().is_causal(causal).need_weights(true))
      .weights;
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out) {
    fmt::print(stderr, "attention-demo: cannot write {}\n", path);
    std::exit(1);
  }
  fmt::print("wrote {}\n", path);
}

}  // namespace

int main(int argc, char** argv) {
  const Arguments args = parse_arguments(argc, argv);
  const int threads = args.threads;
  at::set_num_threads(threads);
  torch::NoGradGuard no_grad;
  Checker checker;
  fmt::print("attention-demo: {} thread(s)\n", threads);

  section("Embedding an input sentence");
  std::string words_text = article::kSentence;
  words_text.erase(std::remove(words_text.begin(), words_text.end(), ','), words_text.end());
  std::vector<std::string> words;
  std::istringstream stream(words_text);
  for (std::string w; stream >> w;) words.push_back(w);
  auto sorted = words;
  std::sort(sorted.begin(), sorted.end());
  std::map<std::string, int64_t> dc;
  for (size_t i = 0; i < sorted.size(); ++i) dc[sorted[i]] = static_cast<int64_t>(i);
  fmt::print("sentence = '{}'\ndc = {{", article::kSentence);
  for (size_t i = 0; i < sorted.size(); ++i) {
    fmt::print("{}'{}': {}", i ? ", " : "", sorted[i], dc[sorted[i]]);
  }
  fmt::print("}}\n");
  std::vector<int64_t> ids;
  for (const auto& w : words) ids.push_back(dc[w]);
  auto sentence_int = torch::tensor(ids);
  show("sentence_int", sentence_int);
  checker.check("sentence_int", sentence_int, torch::tensor(article::kSentenceInt));

  torch::manual_seed(123);
  torch::nn::Embedding embed(50000, 3);
  auto embedded_sentence = embed(sentence_int).detach();
  show("embedded_sentence", embedded_sentence);
  fmt::print("{:s}\n", embedded_sentence);
  checker.check("embedded_sentence", embedded_sentence, article::embedded_sentence());

  section("Defining the weight matrices");
  torch::manual_seed(123);
  const int64_t d = embedded_sentence.size(1), d_q = 2, d_k = 2, d_v = 4;
  auto W_query = torch::rand({d, d_q});
  auto W_key = torch::rand({d, d_k});
  auto W_value = torch::rand({d, d_v});
  show("W_query", W_query);
  show("W_key", W_key);
  show("W_value", W_value);

  section("Unnormalized attention weights");
  auto x_2 = embedded_sentence[1];
  auto query_2 = x_2.matmul(W_query), key_2 = x_2.matmul(W_key), value_2 = x_2.matmul(W_value);
  fmt::print("query_2 {:s}, key_2 {:s}, value_2 {:s}\n", query_2, key_2, value_2);
  auto keys = embedded_sentence.matmul(W_key);
  auto values = embedded_sentence.matmul(W_value);
  fmt::print("keys.shape: {:s}\nvalues.shape: {:s}\n", keys, values);
  auto omega_24 = query_2.dot(keys[4]);
  show("omega_24", omega_24);
  checker.check("omega_24", omega_24, article::omega_24());
  auto omega_2 = query_2.matmul(keys.t());
  show("omega_2", omega_2);
  checker.check("omega_2", omega_2, article::omega_2());

  section("Attention weights and the context vector");
  auto attention_weights_2 = torch::softmax(omega_2 / std::sqrt(static_cast<double>(d_k)), 0);
  show("attention_weights_2", attention_weights_2);
  checker.check("attention_weights_2", attention_weights_2, article::attention_weights_2());
  auto context_vector_2 = attention_weights_2.matmul(values);
  show("context_vector_2", context_vector_2);
  checker.check("context_vector_2", context_vector_2, article::context_vector_2());

  section("SelfAttention");
  torch::manual_seed(123);
  attention::SelfAttention sa(3, 2, 4);
  fmt::print("{}\n", c10::str(*sa));
  auto sa_out = sa(embedded_sentence);
  show("sa(embedded_sentence)", sa_out);
  checker.check("SelfAttention output", sa_out, article::self_attention_output());

  section("Multi-head attention");
  torch::manual_seed(123);
  attention::SelfAttention single(3, 2, 1);
  auto single_out = single(embedded_sentence);
  show("single head, d_out_v = 1", single_out);
  checker.check("single-head output", single_out, article::single_head_output());
  torch::manual_seed(123);
  attention::MultiHeadAttentionWrapper mha(3, 2, 1, /*num_heads=*/4);
  auto context_vecs = mha(embedded_sentence);
  show("context_vecs", context_vecs);
  fmt::print("context_vecs.shape: {:s}\n", context_vecs);
  checker.check("MultiHeadAttentionWrapper output", context_vecs, article::wrapper_output());

  section("Causal self-attention");
  auto x = embedded_sentence;
  auto attn_scores = x.matmul(W_query).matmul(x.matmul(W_key).t());
  show("attn_scores", attn_scores);
  checker.check("attn_scores", attn_scores, article::attn_scores());
  auto attn_weights = torch::softmax(attn_scores / std::sqrt(static_cast<double>(d_k)), 1);
  show("attn_weights", attn_weights);
  checker.check("attn_weights", attn_weights, article::attn_weights());

  const int64_t block_size = attn_scores.size(0);
  auto mask_simple = torch::tril(torch::ones({block_size, block_size}));
  show("mask_simple", mask_simple);
  checker.check("mask_simple", mask_simple, article::mask_simple());
  auto masked_simple = attn_weights * mask_simple;
  show("masked_simple", masked_simple);
  checker.check("masked_simple", masked_simple, article::masked_simple());
  auto masked_simple_norm = masked_simple / masked_simple.sum(1, /*keepdim=*/true);
  show("masked_simple_norm", masked_simple_norm);
  checker.check("masked_simple_norm", masked_simple_norm, article::causal_weights());

  auto mask = torch::triu(torch::ones({block_size, block_size}), 1);
  auto masked = attn_scores.masked_fill(mask.to(torch::kBool), -INFINITY);
  show("masked", masked);
  checker.check("masked", masked, article::masked_scores());
  auto causal_weights = torch::softmax(masked / std::sqrt(static_cast<double>(d_k)), 1);
  show("attn_weights (masked with -inf)", causal_weights);
  checker.check("attn_weights (masked with -inf)", causal_weights, article::causal_weights());
  fmt::print("both masking approaches agree: max |difference| = {:.2e}\n",
             (causal_weights - masked_simple_norm).abs().max().item<double>());

  torch::manual_seed(123);
  attention::CausalSelfAttention causal(3, 2, 4);
  show("CausalSelfAttention(3, 2, 4)(embedded_sentence)", causal(embedded_sentence));

  section("Cross-attention");
  torch::manual_seed(123);
  attention::CrossAttention crossattn(3, 2, 4);
  auto first_input = embedded_sentence;
  auto second_input = torch::rand({8, 3});
  fmt::print("first input {:s}, second input {:s}\n", first_input, second_input);
  auto context_vectors = crossattn(first_input, second_input);
  show("context_vectors", context_vectors);
  fmt::print("context_vectors.shape: {:s}\n", context_vectors);
  checker.check("CrossAttention output", context_vectors, article::cross_attention_output());

  if (!args.heatmap_dir.empty()) {
    section("Attention heatmaps");
    std::filesystem::create_directories(args.heatmap_dir);
    const auto& x = embedded_sentence;
    const auto dir = args.heatmap_dir + "/";
    write_file(dir + "self_attention.svg",
               attention::heatmap_svg(weights_of(x, x, sa->W_query, sa->W_key, sa->W_value, false),
                                      words, words, "SelfAttention(3, 2, 4): attention weights"));
    write_file(dir + "causal_attention.svg",
               attention::heatmap_svg(
                   weights_of(x, x, causal->W_query, causal->W_key, causal->W_value, true), words,
                   words, "CausalSelfAttention(3, 2, 4): attention weights"));
    std::vector<std::string> second;
    for (int64_t i = 0; i < second_input.size(0); ++i) second.push_back(fmt::format("x_2[{}]", i));
    write_file(dir + "cross_attention.svg",
               attention::heatmap_svg(weights_of(x, second_input, crossattn->W_query,
                                                 crossattn->W_key, crossattn->W_value, false),
                                      words, second, "CrossAttention(3, 2, 4): attention weights"));
    for (size_t h = 0; h < mha->heads->size(); ++h) {
      const auto* head = mha->heads[h]->as<attention::SelfAttentionImpl>();
      write_file(dir + fmt::format("wrapper_head_{}.svg", h),
                 attention::heatmap_svg(
                     weights_of(x, x, head->W_query, head->W_key, head->W_value, false), words,
                     words, fmt::format("MultiHeadAttentionWrapper(3, 2, 1, 4): head {}", h)));
    }
  }

  fmt::print("\n{}/{} article values reproduced\n", checker.reproduced, checker.total);
  return checker.reproduced == checker.total ? 0 : 1;
}
