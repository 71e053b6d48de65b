#include <attention/paged_kv_cache.h>

#include "checks.h"
#include "memory/int8_rows.h"
#include "modules/shared.h"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <unordered_set>

namespace attention {

namespace {

constexpr const char* kName = "attention::PagedKVCache";
constexpr const char* kExtend = "attention::PagedKVCache::extend";
constexpr const char* kPagesNeeded = "attention::PagedKVCache::pages_needed";
constexpr const char* kWrite = "attention::PagedKVCache::write";
constexpr const char* kAddSequence = "attention::PagedKVCache::add_sequence";
constexpr const char* kAddTokens = "attention::PagedKVCache::add_tokens";

// A cached page's hash: the page before it and its tokens (FNV-1a over 64-bit words, each step
// mixed). Only a first look: a match is confirmed by both.
uint64_t page_hash(uint64_t parent, const int64_t* tokens, int64_t count) {
  uint64_t h = 14695981039346656037ull ^ parent;
  for (int64_t i = 0; i < count; ++i) {
    h = (h ^ static_cast<uint64_t>(tokens[i])) * 1099511628211ull;
    h ^= h >> 29;
  }
  return h;
}

// Every change of every cache takes the next value, so that a batch names one state of one cache.
uint64_t next_version() {
  static std::atomic<uint64_t> counter{0};
  return ++counter;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return a / b + (a % b != 0);
}

// a * b, or nullopt when it overflows int64.
c10::optional<int64_t> product(std::initializer_list<int64_t> factors) {
  int64_t result = 1;
  for (const int64_t f : factors) {
    if (__builtin_mul_overflow(result, f, &result)) return c10::nullopt;
  }
  return result;
}

}  // namespace

// What a step does to each of its sequences, decided before anything changes.
struct PagedKVCache::Plan {
  struct Entry {
    Sequence* sequence = nullptr;  // unset by pages_needed(), which changes nothing
    int64_t release_to = 0;        // pages [released, release_to) go back (sliding window)
    bool copy_last = false;        // the shared, partly filled last page is copied first
    int64_t new_pages = 0;
  };
  std::vector<Entry> entries;
  int64_t taken = 0;         // pages taken from the pool: new ones and copies
  int64_t returned = 0;      // pages the releases give back to the pool
  bool beyond_pool = false;  // a sequence asks for more tokens than the whole pool holds
};

PagedKVCache::PagedKVCache(const PagedKVCacheOptions& options)
    : options_(options), version_(next_version()) {
  const auto& o = options_;
  for (const auto& [value, name] : {std::pair{o.num_pages(), "num_pages"},
                                    {o.page_size(), "page_size"},
                                    {o.num_kv_heads(), "num_kv_heads"},
                                    {o.head_dim(), "head_dim"},
                                    {o.num_layers(), "num_layers"}}) {
    detail::check_positive(value, name, kName);
  }
  TORCH_CHECK_VALUE(!o.sliding_window() || *o.sliding_window() >= 1, kName,
                    ": expected sliding_window >= 1 (unset for none), got ", *o.sliding_window());
  const auto dtype = o.dtype();
  TORCH_CHECK_TYPE(dtype == torch::kFloat || dtype == torch::kDouble || dtype == torch::kBFloat16 ||
                       dtype == torch::kChar,
                   kName, ": expected dtype Float, Double, BFloat16 or Char (8-bit), got ", dtype);
  // 8-bit rows carry a float scale each: head_dim + 4 bytes a row.
  const bool quantized = dtype == torch::kChar;
  const auto row_bytes =
      product({o.head_dim(), static_cast<int64_t>(c10::elementSize(dtype))}).value_or(-1);
  const auto bytes =
      row_bytes < 0 || (quantized && row_bytes > std::numeric_limits<int64_t>::max() - 4)
          ? c10::nullopt
          : product({2, o.num_layers(), o.num_pages(), o.page_size(), o.num_kv_heads(),
                     row_bytes + (quantized ? 4 : 0)});
  TORCH_CHECK_VALUE(bytes.has_value(), kName, ": a pool of ", o.num_pages(), " pages of ",
                    o.page_size(), " tokens, ", o.num_kv_heads(), " heads of ", o.head_dim(),
                    " features, ", o.num_layers(), " layers in ", dtype,
                    " needs more than 2^63 bytes");
  memory_bytes_ = *bytes;
  // One tensor: a copy-on-write copies a page of every layer's keys and values in one op.
  auto pool = torch::empty(
      {2, o.num_layers(), o.num_pages(), o.num_kv_heads(), o.page_size(), o.head_dim()},
      torch::TensorOptions().dtype(dtype).device(o.device()));
  if (quantized) {
    scales_ = torch::empty({2, o.num_layers(), o.num_pages(), o.num_kv_heads(), o.page_size()},
                           torch::TensorOptions().dtype(torch::kFloat).device(o.device()));
  }
  pool_ = std::move(pool);
  free_count_ = o.num_pages();
}

void PagedKVCache::changed() {
  version_ = next_version();
}

const PagedKVCache::Sequence& PagedKVCache::find(int64_t sequence, const char* caller) const {
  const auto it = sequences_.find(sequence);
  if (it != sequences_.end()) return it->second;
  const bool made = sequence >= 0 && sequence < next_id_;
  if (made) TORCH_CHECK_VALUE(false, caller, ": sequence ", sequence, " was freed");
  TORCH_CHECK_VALUE(false, caller, ": unknown sequence ", sequence,
                    " (the cache has made ids 0 to ", next_id_ - 1, ")");
  return it->second;  // not reached: the checks above throw
}

PagedKVCache::Sequence& PagedKVCache::find(int64_t sequence, const char* caller) {
  return const_cast<Sequence&>(static_cast<const PagedKVCache*>(this)->find(sequence, caller));
}

int64_t PagedKVCache::add_sequence() {
  offer_written_pages();
  const int64_t id = next_id_++;
  Sequence s;
  s.written.assign(options_.num_layers(), 0);
  sequences_.emplace(id, std::move(s));
  changed();
  return id;
}

std::vector<int64_t> PagedKVCache::token_ids(const torch::Tensor& tokens, int64_t capacity,
                                             const char* caller) {
  TORCH_CHECK_VALUE(tokens.defined(), caller,
                    ": expected a 1-D tensor of token ids, got an undefined tensor");
  TORCH_CHECK_TYPE(c10::isIntegralType(tokens.scalar_type(), /*includeBool=*/false), caller,
                   ": expected token ids of an integer dtype, got ", tokens.scalar_type());
  TORCH_CHECK_VALUE(tokens.layout() == torch::kStrided && tokens.dim() == 1, caller,
                    ": expected a 1-D tensor of token ids, got ", tokens.dim(), " dimensions (",
                    detail::shape_str(tokens.sizes()), ", layout ", tokens.layout(), ")");
  TORCH_CHECK_VALUE(tokens.device().is_cpu(), caller, ": expected token ids on the CPU, got ",
                    tokens.device());
  TORCH_CHECK_VALUE(tokens.numel() <= capacity, caller, ": ", tokens.numel(),
                    " tokens are more than the pool holds (", capacity, ")");
  const auto ids = tokens.to(torch::kLong).contiguous();
  return std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel());
}

int64_t PagedKVCache::find_cached(uint64_t parent, const int64_t* tokens) const {
  const int64_t page_size = options_.page_size();
  const auto range = by_hash_.equal_range(page_hash(parent, tokens, page_size));
  for (auto it = range.first; it != range.second; ++it) {
    const CachedPage& c = cached_.at(it->second);
    if (c.parent == parent && std::equal(c.tokens.begin(), c.tokens.end(), tokens)) {
      return it->second;
    }
  }
  return -1;
}

PrefixHit PagedKVCache::add_sequence(const torch::Tensor& tokens) {
  const int64_t page_size = options_.page_size();
  std::vector<int64_t> ids = token_ids(tokens, options_.num_pages() * page_size, kAddSequence);
  offer_written_pages();
  Sequence s;
  // Whole pages, and never the last token: its query makes the next token's logits.
  const int64_t reusable = ids.empty() ? 0 : (static_cast<int64_t>(ids.size()) - 1) / page_size;
  uint64_t parent = 0;
  for (int64_t j = 0; j < reusable; ++j) {
    const int64_t page = find_cached(parent, ids.data() + j * page_size);
    if (page < 0) break;
    s.pages.push_back(page);
    parent = cached_.at(page).serial;
    s.offered.push_back(parent);
  }
  for (const int64_t page : s.pages) {
    CachedPage& c = cached_.at(page);
    if (c.idle) {  // back from the idle pages to a sequence
      lru_.erase(c.used);
      c.idle = false;
      --free_count_;
    }
    ++references_[page];
  }
  s.length = static_cast<int64_t>(s.pages.size()) * page_size;
  s.written.assign(options_.num_layers(), s.length);
  s.tokens = std::move(ids);
  const int64_t id = next_id_++;
  const int64_t cached = s.length;
  sequences_.emplace(id, std::move(s));
  changed();
  return PrefixHit{id, cached};
}

void PagedKVCache::add_tokens(int64_t sequence, const torch::Tensor& tokens) {
  Sequence& s = find(sequence, kAddTokens);
  const int64_t capacity = options_.num_pages() * options_.page_size();
  std::vector<int64_t> ids = token_ids(tokens, capacity, kAddTokens);
  TORCH_CHECK_VALUE(
      static_cast<int64_t>(ids.size()) <= capacity - static_cast<int64_t>(s.tokens.size()),
      kAddTokens, ": sequence ", sequence, " would know ", s.tokens.size() + ids.size(),
      " tokens, more than the pool holds (", capacity, ")");
  offer_written_pages();
  s.tokens.insert(s.tokens.end(), ids.begin(), ids.end());
  changed();
}

int64_t PagedKVCache::fork_sequence(int64_t parent) {
  find(parent, "attention::PagedKVCache::fork_sequence");
  offer_written_pages();
  const Sequence copy = sequences_.at(parent);
  for (const int64_t page : copy.pages) {
    if (page >= 0) ++references_[page];
  }
  const int64_t id = next_id_++;
  sequences_.emplace(id, copy);
  changed();
  return id;
}

void PagedKVCache::free_sequence(int64_t sequence) {
  find(sequence, "attention::PagedKVCache::free_sequence");
  offer_written_pages();  // a finished request's pages stay for the next
  const Sequence& s = sequences_.at(sequence);
  for (const int64_t page : s.pages) {
    if (page >= 0) drop_page(page);
  }
  sequences_.erase(sequence);
  changed();
}

void PagedKVCache::truncate(int64_t sequence, int64_t length) {
  constexpr const char* kTruncate = "attention::PagedKVCache::truncate";
  Sequence& s = find(sequence, kTruncate);
  TORCH_CHECK_VALUE(length >= 0 && length <= s.length, kTruncate, ": cannot truncate sequence ",
                    sequence, " to ", length, " tokens: it has ", s.length);
  const int64_t page_size = options_.page_size();
  if (s.released > 0) {
    // The next query, at `length`, sees keys from length - W + 1 on: they must still be held.
    const int64_t first_held = s.released * page_size;
    const int64_t window = *options_.sliding_window();
    TORCH_CHECK_VALUE(length - window + 1 >= first_held, kTruncate, ": cannot truncate sequence ",
                      sequence, " to ", length, " tokens: a query there sees keys from position ",
                      length - window + 1, ", and the window let positions before ", first_held,
                      " go");
  }
  offer_written_pages();
  const int64_t keep = ceil_div(length, page_size);
  for (int64_t p = keep; p < static_cast<int64_t>(s.pages.size()); ++p) drop_page(s.pages[p]);
  s.pages.resize(keep);
  s.length = length;
  // The tokens past `length` are no longer the sequence's (rejected, or to be written again).
  s.tokens.resize(std::min<int64_t>(static_cast<int64_t>(s.tokens.size()), length));
  s.offered.resize(std::min<int64_t>(static_cast<int64_t>(s.offered.size()), length / page_size));
  for (int64_t& w : s.written) w = std::min(w, length);
  changed();
}

PagedKVCache::Plan PagedKVCache::plan(const std::vector<int64_t>& sequences,
                                      const std::vector<int64_t>& new_tokens,
                                      const char* caller) const {
  TORCH_CHECK_VALUE(sequences.size() == new_tokens.size(), caller,
                    ": expected one token count per sequence, got ", sequences.size(),
                    " sequences and ", new_tokens.size(), " counts");
  const int64_t page_size = options_.page_size();
  const int64_t capacity = options_.num_pages() * page_size;  // fits: the pool's bytes did
  Plan plan;
  std::unordered_set<int64_t> seen;
  std::vector<const Sequence*> held;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const int64_t id = sequences[i], count = new_tokens[i];
    held.push_back(&find(id, caller));
    TORCH_CHECK_VALUE(seen.insert(id).second, caller, ": sequence ", id,
                      " appears more than once in one step");
    TORCH_CHECK_VALUE(count >= 0, caller, ": expected new_tokens >= 0, got ", count,
                      " for sequence ", id);
    // More tokens than the pool holds never fit (and would overflow the counts below).
    if (count > capacity) plan.beyond_pool = true;
  }
  if (plan.beyond_pool) return plan;
  // References the step drops, by page: a page that two forks both let go (or both copy away
  // from) in one step loses both references.
  std::unordered_map<int64_t, int64_t> dropped;
  const auto references = [&](int64_t page) {
    const auto it = dropped.find(page);
    return references_[page] - (it == dropped.end() ? 0 : it->second);
  };
  plan.entries.resize(sequences.size());
  // Releases first, as extend() makes them: their pages serve the step.
  for (size_t i = 0; i < sequences.size() && options_.sliding_window(); ++i) {
    const Sequence& s = *held[i];
    // The step's first query, at position length, sees keys from length - W + 1 on.
    const int64_t keep_from = std::max<int64_t>(0, s.length - *options_.sliding_window() + 1);
    plan.entries[i].release_to = std::max(s.released, keep_from / page_size);
    for (int64_t p = s.released; p < plan.entries[i].release_to; ++p) {
      const int64_t page = s.pages[p];
      if (page < 0) continue;
      if (references(page) == 1) ++plan.returned;
      ++dropped[page];
    }
  }
  for (size_t i = 0; i < sequences.size(); ++i) {
    const Sequence& s = *held[i];
    const int64_t count = new_tokens[i];
    auto& entry = plan.entries[i];
    if (!options_.sliding_window()) entry.release_to = s.released;
    if (count == 0) continue;
    if (s.length % page_size != 0) {
      const int64_t last = s.pages[s.length / page_size];
      // Shared, or cached (offered to later sequences as it is): this sequence writes to a copy
      // of its own.
      if (references(last) > 1 || cached_.count(last) != 0) {
        entry.copy_last = true;
        ++dropped[last];
        ++plan.taken;
      }
    }
    entry.new_pages = ceil_div(s.length + count, page_size) - ceil_div(s.length, page_size);
    plan.taken += entry.new_pages;
  }
  return plan;
}

int64_t PagedKVCache::pages_needed(const std::vector<int64_t>& sequences,
                                   const std::vector<int64_t>& new_tokens) const {
  const Plan p = plan(sequences, new_tokens, kPagesNeeded);
  if (p.beyond_pool) return std::numeric_limits<int64_t>::max();
  return std::max<int64_t>(0, p.taken - p.returned);
}

PagedBatch PagedKVCache::extend(const std::vector<int64_t>& sequences,
                                const std::vector<int64_t>& new_tokens) {
  Plan p = plan(sequences, new_tokens, kExtend);
  const int64_t available = free_count_ + p.returned;
  TORCH_CHECK_VALUE(!p.beyond_pool && p.taken <= available, kExtend,
                    ": out of pages: the step needs ",
                    p.beyond_pool ? std::string("more pages than the pool has")
                                  : std::to_string(p.taken) + " new page(s)",
                    " and ", available, " of ", options_.num_pages(),
                    " are free (free finished sequences or make a larger pool); nothing was "
                    "changed");
  // Changes no count the plan made (and no page a step copies: those are partly filled).
  offer_written_pages();
  // Checked and counted: from here on nothing fails (but the allocation of the batch's small
  // tensors, made first).
  const int64_t page_size = options_.page_size();
  const int64_t count = static_cast<int64_t>(sequences.size());
  int64_t total = 0, widest = 0;
  for (int64_t i = 0; i < count; ++i) {
    const Sequence& s = sequences_.at(sequences[i]);
    total += new_tokens[i];
    widest = std::max(widest, ceil_div(s.length + new_tokens[i], page_size));
  }
  PagedBatch batch;
  const auto int64 = torch::TensorOptions().dtype(torch::kLong);
  batch.query_starts_ = torch::empty({count + 1}, int64);
  batch.key_lengths_ = torch::empty({count}, int64);
  batch.page_table_ = torch::full({count, widest}, -1, int64);
  batch.positions_ = torch::empty({total}, int64);
  batch.slots_.reserve(total);
  batch.sequences_ = sequences;
  batch.total_tokens_ = total;

  for (int64_t i = 0; i < count; ++i) p.entries[i].sequence = &sequences_.at(sequences[i]);
  for (auto& e : p.entries) {  // releases first: their pages serve this step
    Sequence& s = *e.sequence;
    for (int64_t page = s.released; page < e.release_to; ++page) {
      if (s.pages[page] >= 0) drop_page(s.pages[page]);
      s.pages[page] = -1;
    }
    s.released = e.release_to;
  }
  int64_t* starts = batch.query_starts_.data_ptr<int64_t>();
  int64_t* lengths = batch.key_lengths_.data_ptr<int64_t>();
  int64_t* table = batch.page_table_.data_ptr<int64_t>();
  int64_t* positions = batch.positions_.data_ptr<int64_t>();
  starts[0] = 0;
  for (int64_t i = 0; i < count; ++i) {
    const auto& e = p.entries[i];
    Sequence& s = *e.sequence;
    if (e.copy_last) {
      const int64_t index = s.length / page_size, shared = s.pages[index];
      const int64_t own = take_page();
      copy_page(shared, own);
      drop_page(shared);
      s.pages[index] = own;
    }
    for (int64_t k = 0; k < e.new_pages; ++k) s.pages.push_back(take_page());
    for (int64_t t = 0; t < new_tokens[i]; ++t) {
      const int64_t position = s.length + t;
      *positions++ = position;
      batch.slots_.push_back(s.pages[position / page_size] * page_size + position % page_size);
    }
    s.length += new_tokens[i];
    starts[i + 1] = starts[i] + new_tokens[i];
    lengths[i] = s.length;
    std::copy(s.pages.begin(), s.pages.end(), table + i * widest);
  }
  changed();
  batch.version_ = version_;
  return batch;
}

bool PagedKVCache::holds(const PagedBatch& batch) const {
  return batch.version_ == version_;
}

void PagedKVCache::write(int64_t layer, const PagedBatch& batch, const torch::Tensor& keys,
                         const torch::Tensor& values) {
  TORCH_CHECK_VALUE(holds(batch), kWrite,
                    ": the batch does not describe this cache as it is now (it was made before "
                    "the cache last changed, or by another cache): extend() again");
  const auto& o = options_;
  check_layer(layer, kWrite);
  const std::vector<int64_t> expected{batch.total_tokens(), o.num_kv_heads(), o.head_dim()};
  for (const auto* t : {&keys, &values}) {
    TORCH_CHECK_VALUE(t->defined() && t->sizes() == c10::IntArrayRef(expected), kWrite,
                      ": expected keys and values of shape ", detail::shape_str(expected),
                      " (total_tokens, num_kv_heads, head_dim), got ",
                      keys.defined() ? detail::shape_str(keys.sizes()) : "undefined", " and ",
                      values.defined() ? detail::shape_str(values.sizes()) : "undefined");
    if (quantized()) {
      TORCH_CHECK_TYPE(t->scalar_type() == torch::kFloat || t->scalar_type() == torch::kDouble ||
                           t->scalar_type() == torch::kBFloat16,
                       kWrite,
                       ": expected keys and values of dtype Float, Double or BFloat16 (the 8-bit "
                       "cache quantizes them), got ",
                       keys.scalar_type(), " and ", values.scalar_type());
    } else {
      TORCH_CHECK_TYPE(t->scalar_type() == o.dtype(), kWrite,
                       ": expected keys and values of dtype ", o.dtype(), " (the cache's), got ",
                       keys.scalar_type(), " and ", values.scalar_type());
    }
    TORCH_CHECK(t->device() == o.device(), kWrite, ": expected keys and values on ", o.device(),
                " (the cache's device), got ", keys.device(), " and ", values.device());
  }
  if (batch.total_tokens() == 0) return;
  if (!quantized()) {
    scatter(pool_[0][layer], keys.detach().contiguous(), batch);
    scatter(pool_[1][layer], values.detach().contiguous(), batch);
  } else {
    // Both quantized first: a failure leaves the pages as they were.
    const detail::Int8Rows rows[2] = {detail::quantize_rows(keys), detail::quantize_rows(values)};
    for (int64_t which = 0; which < 2; ++which) {
      scatter(pool_[which][layer], rows[which].codes, batch);
      scatter(scales_[which][layer].unsqueeze(-1), rows[which].scales.unsqueeze(-1), batch);
    }
  }
  // How far each sequence is written in this layer, from position 0 without a gap (a step whose
  // write never came leaves one). Only this layer's count changes: writes of other layers may run
  // on other threads meanwhile; the pages are offered at the cache's next change.
  const int64_t* starts = batch.query_starts_.data_ptr<int64_t>();
  const int64_t* lengths = batch.key_lengths_.data_ptr<int64_t>();
  for (size_t i = 0; i < batch.sequences_.size(); ++i) {
    int64_t& written = sequences_.at(batch.sequences_[i]).written[layer];
    const int64_t from = lengths[i] - (starts[i + 1] - starts[i]);
    if (written >= from) written = std::max(written, lengths[i]);
  }
}

void PagedKVCache::offer_written_pages() {
  for (auto& entry : sequences_) offer_pages(entry.second);
}

void PagedKVCache::offer_pages(Sequence& s) {
  const int64_t page_size = options_.page_size();
  int64_t complete = std::min<int64_t>(s.length, static_cast<int64_t>(s.tokens.size()));
  for (const int64_t w : s.written) complete = std::min(complete, w);
  for (int64_t j = static_cast<int64_t>(s.offered.size()); (j + 1) * page_size <= complete; ++j) {
    const int64_t page = s.pages[j];
    if (page < 0) return;  // the window let it go: the run of offered pages ends
    const uint64_t parent = j == 0 ? 0 : s.offered[j - 1];
    const int64_t* tokens = s.tokens.data() + j * page_size;
    const int64_t same = find_cached(parent, tokens);
    if (same >= 0) {
      s.offered.push_back(cached_.at(same).serial);
      continue;
    }
    if (cached_.count(page) != 0) return;  // cached as another prefix: not this one's to offer
    CachedPage c;
    c.serial = ++next_serial_;
    c.parent = parent;
    c.hash = page_hash(parent, tokens, page_size);
    c.tokens.assign(tokens, tokens + page_size);
    by_hash_.emplace(c.hash, page);
    s.offered.push_back(c.serial);
    cached_.emplace(page, std::move(c));
  }
}

void PagedKVCache::forget_page(int64_t page) {
  const auto it = cached_.find(page);
  const auto range = by_hash_.equal_range(it->second.hash);
  for (auto h = range.first; h != range.second; ++h) {
    if (h->second == page) {
      by_hash_.erase(h);
      break;
    }
  }
  cached_.erase(it);
}

void PagedKVCache::scatter(torch::Tensor pool, const torch::Tensor& from,
                           const PagedBatch& batch) const {
  const int64_t page_size = options_.page_size(), heads = options_.num_kv_heads();
  const int64_t width = from.size(2);
  if (!from.device().is_cpu()) {
    // (page, head, offset) of each token: advanced indices around a slice put the token dim
    // first, as `from` has it.
    const auto slots = torch::tensor(batch.slots_, torch::kLong).to(from.device());
    pool.index_put_(
        {slots.div(page_size, "floor"), torch::indexing::Slice(), slots.remainder(page_size)},
        from);
    return;
  }
  // On the CPU: one copy of a row per token and head.
  const size_t row = static_cast<size_t>(width) * from.element_size();
  const char* in = static_cast<const char*>(from.data_ptr());
  char* base = static_cast<char*>(pool.data_ptr());
  for (int64_t t = 0; t < batch.total_tokens(); ++t) {
    const int64_t slot = batch.slots_[t];
    const int64_t page = slot / page_size, offset = slot % page_size;
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t at = ((page * heads + h) * page_size + offset) * width;
      std::memcpy(base + at * from.element_size(), in + (t * heads + h) * row, row);
    }
  }
}

void PagedKVCache::check_layer(int64_t layer, const char* caller) const {
  TORCH_CHECK_VALUE(layer >= 0 && layer < options_.num_layers(), caller,
                    ": expected a layer in [0, ", options_.num_layers(), "), got ", layer);
}

torch::Tensor PagedKVCache::keys(int64_t layer) const {
  check_layer(layer, "attention::PagedKVCache::keys");
  return pool_[0][layer];
}

torch::Tensor PagedKVCache::values(int64_t layer) const {
  check_layer(layer, "attention::PagedKVCache::values");
  return pool_[1][layer];
}

torch::Tensor PagedKVCache::key_scales(int64_t layer) const {
  check_layer(layer, "attention::PagedKVCache::key_scales");
  return quantized() ? scales_[0][layer] : torch::Tensor();
}

torch::Tensor PagedKVCache::value_scales(int64_t layer) const {
  check_layer(layer, "attention::PagedKVCache::value_scales");
  return quantized() ? scales_[1][layer] : torch::Tensor();
}

int64_t PagedKVCache::length(int64_t sequence) const {
  return find(sequence, "attention::PagedKVCache::length").length;
}

std::vector<int64_t> PagedKVCache::pages(int64_t sequence) const {
  return find(sequence, "attention::PagedKVCache::pages").pages;
}

std::vector<int64_t> PagedKVCache::sequences() const {
  std::vector<int64_t> ids;
  ids.reserve(sequences_.size());
  for (const auto& entry : sequences_) ids.push_back(entry.first);
  return ids;
}

int64_t PagedKVCache::free_pages() const {
  return free_count_;
}

int64_t PagedKVCache::cached_pages() const {
  return static_cast<int64_t>(lru_.size());
}

bool PagedKVCache::page_cached(int64_t page) const {
  TORCH_CHECK_VALUE(page >= 0 && page < options_.num_pages(),
                    "attention::PagedKVCache::page_cached: expected a page in [0, ",
                    options_.num_pages(), "), got ", page);
  return cached_.count(page) != 0;
}

int64_t PagedKVCache::page_references(int64_t page) const {
  TORCH_CHECK_VALUE(page >= 0 && page < options_.num_pages(),
                    "attention::PagedKVCache::page_references: expected a page in [0, ",
                    options_.num_pages(), "), got ", page);
  return page < static_cast<int64_t>(references_.size()) ? references_[page] : 0;
}

int64_t PagedKVCache::take_page() {
  --free_count_;
  if (!free_list_.empty()) {
    const int64_t page = free_list_.back();
    free_list_.pop_back();
    references_[page] = 1;
    return page;
  }
  if (static_cast<int64_t>(references_.size()) < options_.num_pages()) {
    references_.push_back(1);  // a page never used before
    return static_cast<int64_t>(references_.size()) - 1;
  }
  // Every other free page is cached: the least recently used one is given back (no sequence
  // holds an idle page), and found no more under its tokens.
  const int64_t page = lru_.front();
  lru_.pop_front();
  forget_page(page);
  references_[page] = 1;
  return page;
}

void PagedKVCache::drop_page(int64_t page) {
  if (--references_[page] != 0) return;
  ++free_count_;
  const auto cached = cached_.find(page);
  if (cached == cached_.end()) {
    free_list_.push_back(page);
    return;
  }
  cached->second.idle = true;  // kept for a later sequence with the same tokens
  cached->second.used = lru_.insert(lru_.end(), page);
}

void PagedKVCache::copy_page(int64_t from, int64_t to) {
  pool_.select(2, to).copy_(pool_.select(2, from));
  if (quantized()) scales_.select(2, to).copy_(scales_.select(2, from));
}

}  // namespace attention
