// Hostile weight files against the load budget of docs/SECURITY.md: each is loaded, with
// LoadOptions().trusted(false), in a child process of this test binary that reports what its load
// did and the peak memory it took, under a watchdog; a crash, a hang or a load beyond the budget
// fails the test. Each file is a small one made here where the original was large.

#include <attention/attention.h>

#include "helpers.h"
#include "serialization/limits.h"

#include <torch/torch.h>

#include <zlib.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

extern char** environ;

namespace {

namespace fs = std::filesystem;
using attention::LoadOptions;
using attention::WeightLayout;

// Under AddressSanitizer the process's memory holds the sanitizer's shadow and its quarantine of
// freed blocks: the resident set measures the sanitizer, not the library.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kMeasuresMemory = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kMeasuresMemory = false;
#else
constexpr bool kMeasuresMemory = true;
#endif
#else
constexpr bool kMeasuresMemory = true;
#endif

// A child that runs longer than this has hung: the slowest file here loads in seconds.
constexpr unsigned kWatchdogSeconds = 120;

std::string le(uint64_t v, int width) {
  std::string out;
  for (int i = 0; i < width; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

std::string safetensors_file(const std::string& header, const std::string& data = "") {
  return le(header.size(), 8) + header + data;
}

// A zip archive of stored records, written by hand so that its central directory can say what
// no writer would: `aliases` are entries that point at the local header of an earlier record.
std::string zip_archive(const std::vector<std::pair<std::string, std::string>>& records,
                        const std::vector<std::pair<std::string, std::size_t>>& aliases = {}) {
  std::string out, directory;
  std::vector<uint64_t> offsets;
  std::vector<uint32_t> crcs;
  auto central = [&](const std::string& name, std::size_t record) {
    const std::string& data = records[record].second;
    directory += le(0x02014b50, 4) + le(20, 2) + le(20, 2) + le(0, 2) + le(0, 2) + le(0, 4) +
                 le(crcs[record], 4) + le(data.size(), 4) + le(data.size(), 4) +
                 le(name.size(), 2) + le(0, 2) + le(0, 2) + le(0, 2) + le(0, 2) + le(0, 4) +
                 le(offsets[record], 4) + name;
  };
  for (const auto& [name, data] : records) {
    offsets.push_back(out.size());
    crcs.push_back(static_cast<uint32_t>(
        crc32(0, reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(data.size()))));
    out += le(0x04034b50, 4) + le(20, 2) + le(0, 2) + le(0, 2) + le(0, 4) + le(crcs.back(), 4) +
           le(data.size(), 4) + le(data.size(), 4) + le(name.size(), 2) + le(0, 2) + name + data;
  }
  for (std::size_t i = 0; i < records.size(); ++i) central(records[i].first, i);
  for (const auto& [name, record] : aliases) central(name, record);
  const std::size_t entries = records.size() + aliases.size();
  const uint64_t directory_offset = out.size();
  out += directory;
  out += le(0x06054b50, 4) + le(0, 2) + le(0, 2) + le(entries, 2) + le(entries, 2) +
         le(directory.size(), 4) + le(directory_offset, 4) + le(0, 2);
  return out;
}

// A torch.save archive around a pickle and its storage records ("archive/data/<i>").
std::string torch_save_file(const std::string& pickle,
                            const std::vector<std::string>& storages = {},
                            std::size_t aliases = 0) {
  std::vector<std::pair<std::string, std::string>> records = {{"archive/data.pkl", pickle}};
  for (std::size_t i = 0; i < storages.size(); ++i) {
    records.emplace_back("archive/data/" + std::to_string(i), storages[i]);
  }
  std::vector<std::pair<std::string, std::size_t>> shared;
  for (std::size_t i = 0; i < aliases; ++i) {
    shared.emplace_back("archive/data/" + std::to_string(storages.size() + i), 1);
  }
  return zip_archive(records, shared);
}

// Pickle opcodes (protocol 2).
const std::string kHostileProto("\x80\x02", 2);
std::string text(const std::string& s) {
  return "X" + le(s.size(), 4) + s;
}
std::string integer(int64_t v) {
  if (v >= INT32_MIN && v <= INT32_MAX) return "J" + le(static_cast<uint64_t>(v), 4);
  return std::string("\x8a\x08", 2) + le(static_cast<uint64_t>(v), 8);  // LONG1
}
// name: _rebuild_tensor_v2(storage `key` of `numel` floats, 0, sizes, strides, False, {}).
std::string tensor_entry(const std::string& name, const std::string& key, int64_t numel,
                         const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  std::string p = text(name) + "ctorch._utils\n_rebuild_tensor_v2\n((" + text("storage") +
                  "ctorch\nFloatStorage\n" + text(key) + text("cpu") + integer(numel) + "tQ" +
                  integer(0) + "(";
  for (int64_t s : sizes) p += integer(s);
  p += "t(";
  for (int64_t s : strides) p += integer(s);
  return p + "t\x89}tR";
}

std::string repeat(const std::string& s, std::size_t n) {
  std::string out;
  out.reserve(s.size() * n);
  for (std::size_t i = 0; i < n; ++i) out += s;
  return out;
}

// The module every file is loaded into: the book's wrapper layout fits it.
attention::MultiHeadAttention target_module() {
  torch::manual_seed(0);
  return attention::MultiHeadAttention(
      attention::MultiHeadAttentionOptions(8, 9, 3).context_length(6).output_projection(false));
}

struct HostileFile {
  std::string name;
  std::string why;  // what it did to the loaders before they kept the budget
  std::function<std::string()> bytes;
  LoadOptions options;
  std::string refusal;  // a fragment of the error it must raise; alternatives split by '|'
};

// True when `message` holds one of the '|'-separated fragments of `refusal`.
bool refused_as(const std::string& message, const std::string& refusal) {
  std::size_t begin = 0;
  while (true) {
    const std::size_t end = refusal.find('|', begin);
    if (message.find(refusal.substr(begin, end - begin)) != std::string::npos) return true;
    if (end == std::string::npos) return false;
    begin = end + 1;
  }
}

const std::vector<HostileFile>& hostile_files() {
  static const std::vector<HostileFile> files = [] {
    std::vector<HostileFile> out;
    const auto untrusted = LoadOptions().trusted(false);
    const std::string entry = R"("dtype":"F32","shape":[0],"data_offsets":[0,0])";
    out.push_back({"safetensors: a shape nested 10^6 deep", "stack overflow in the JSON library",
                   [] {
                     return safetensors_file(R"({"w":{"dtype":"F32","shape":)" +
                                             std::string(1000000, '[') + std::string(1000000, ']') +
                                             R"(,"data_offsets":[0,0]}})");
                   },
                   untrusted, "nests deeper than 3 levels"});
    out.push_back({"safetensors: 16 MiB of nested lists in an entry", "+1331 MiB of JSON tree",
                   [entry] {
                     return safetensors_file(R"({"w":{)" + entry + R"(,"x":[)" +
                                             repeat("[],", 16 << 18) + "[]]}}");
                   },
                   untrusted, "nests deeper than 3 levels"});
    out.push_back({"safetensors: 600k entries, the last one broken",
                   "hours: parsing was quadratic in the number of keys",
                   [entry] {
                     std::string header = "{";
                     for (int i = 0; i < 600000; ++i) {
                       header += "\"" + std::to_string(i) + "\":{" + entry + "},";
                     }
                     return safetensors_file(header + R"("last":{"dtype":"F8"}})");
                   },
                   untrusted, "unknown dtype"});
    out.push_back({"safetensors: a 2 MiB name under rename()", "stack overflow in std::regex",
                   [entry] {
                     return safetensors_file("{\"module." + std::string(2 << 20, 'a') + "\":{" +
                                             entry + "}}");
                   },
                   LoadOptions().trusted(false).rename({{"^module\\.(.*)$", "$1"}}),
                   "characters (at most 1024 are read)"});
    out.push_back(
        {"torch.save: a 2 MiB name under the wrapper layout", "stack overflow in std::regex",
         [] {
           return torch_save_file(
               kHostileProto + "}(" +
                   tensor_entry("heads.0." + std::string(2 << 20, 'b'), "0", 1, {1}, {1}) + "u.",
               {std::string(4, '\0')});
         },
         LoadOptions().trusted(false).layout(WeightLayout::BookMultiHeadAttentionWrapper),
         "over the limit of 1024"});
    out.push_back({"torch.save: two stride-0 (8192, 16384) views of one float, wrapper layout",
                   "+1033 MiB: the layout concatenated them before any shape check",
                   [] {
                     std::string p = kHostileProto + "}(";
                     for (const char* head : {"heads.0.W_query.weight", "heads.1.W_query.weight"}) {
                       p += tensor_entry(head, "0", 1, {8192, 16384}, {0, 0});
                     }
                     return torch_save_file(p + "u.", {std::string(4, '\0')});
                   },
                   LoadOptions().trusted(false).layout(WeightLayout::BookMultiHeadAttentionWrapper),
                   "shape of W_query.weight: module (9, 8), file (16384, 16384)"});
    out.push_back({"torch.save: 100 directory entries sharing one 4 MiB record",
                   "+414 MiB from 4.2 MB: each entry read into a storage of its own",
                   [] {
                     std::string p = kHostileProto + "}(";
                     for (int i = 0; i < 100; ++i) {
                       p += tensor_entry("w" + std::to_string(i), std::to_string(i), 1 << 20,
                                         {1 << 20}, {1});
                     }
                     return torch_save_file(p + "u.", {std::string(4 << 20, '\0')}, 99);
                   },
                   untrusted, "(zip records must not share bytes)"});
    out.push_back(
        {"torch.save: 2^22 - 8 NONE opcodes", "+645 MiB: values were counted, not bytes",
         [] { return torch_save_file(kHostileProto + std::string((1 << 22) - 8, 'N') + "."); },
         // Within the budget either way: the arena refused, or the pickle read to its end.
         untrusted, "values of more than|holds None, not a state dict"});
    out.push_back({"torch.save: _codecs.encode of one memoized 16 MiB text, 60 times",
                   "+1087 MiB: each call kept a copy",
                   [] {
                     const std::string call("h\x01(h\x00h\x02tR0", 10);
                     return torch_save_file(kHostileProto + text(std::string(16 << 20, 'a')) +
                                            std::string("q\x00", 2) + "c_codecs\nencode\nq\x01" +
                                            text("latin1") + "q\x02" + repeat(call, 60) + "N.");
                   },
                   untrusted, "holds None, not a state dict"});
    out.push_back(
        {"torch.save: a dict key of 30 nested pairs", "hang: the key's text doubled per level",
         [] { return torch_save_file(kHostileProto + "})" + repeat("2\x86", 30) + "Ns."); },
         untrusted, "not all name -> tensor"});
    out.push_back({"torch.save: one 4 MiB key set 10^6 times", "hang: each SETITEM rebuilt the key",
                   [] {
                     return torch_save_file(kHostileProto + "}" + text(std::string(4 << 20, 'k')) +
                                            std::string("q\x00"
                                                        "0"
                                                        "Nq\x01"
                                                        "0",
                                                        7) +
                                            repeat(std::string("h\x00h\x01s", 5), 1000000) + ".");
                   },
                   untrusted, "not all name -> tensor"});
    return out;
  }();
  return files;
}

// /proc/self/status fields, in bytes.
int64_t status_bytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::atoll(line.c_str() + field.size() + 1) * 1024;
  }
  return -1;
}

struct ChildResult {
  bool finished = false;  // exited on its own (no signal, no watchdog)
  std::string outcome;    // "loaded" or "refused"
  int64_t peak_bytes = 0;
  std::string message;
  std::string how;  // how it ended, for the report
};

// Runs the hidden test case below in a child process on `path`, as file `name` of the table.
ChildResult load_in_child(const std::string& name, const std::string& path) {
  const std::string result = path + ".result";
  std::vector<std::string> environment;
  for (char** e = environ; *e != nullptr; ++e) environment.emplace_back(*e);
  environment.push_back("ATTENTION_UNTRUSTED_CASE=" + name);
  environment.push_back("ATTENTION_UNTRUSTED_PATH=" + path);
  environment.push_back("ATTENTION_UNTRUSTED_RESULT=" + result);
  std::vector<char*> envp;
  for (auto& e : environment) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe", test_name = "untrusted files: one load in a child process";
  std::vector<char*> argv = {exe.data(), test_name.data(), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  ChildResult out;
  if (spawned != 0) {
    out.how = "could not start the child";
    return out;
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) {
    out.how = WTERMSIG(status) == SIGALRM ? "hung: stopped by the watchdog"
                                          : "died of signal " + std::to_string(WTERMSIG(status));
    return out;
  }
  std::ifstream in(result);
  out.finished = WIFEXITED(status) && std::getline(in, out.outcome) && (in >> out.peak_bytes);
  std::getline(in, out.message);
  std::getline(in, out.message);
  out.how = "exit status " + std::to_string(WEXITSTATUS(status));
  std::remove(result.c_str());
  return out;
}

// The load budget of docs/SECURITY.md for a file of `size` bytes.
int64_t budget(std::size_t size) {
  return static_cast<int64_t>(attention::serialization::kLoadBytesPerFileByte * size +
                              attention::serialization::kLoadBytesConstant);
}

}  // namespace

TEST_CASE("untrusted files: one load in a child process", "[.untrusted_child]") {
  const char* name = std::getenv("ATTENTION_UNTRUSTED_CASE");
  if (name == nullptr) return;
  alarm(kWatchdogSeconds);
  const std::string path = std::getenv("ATTENTION_UNTRUSTED_PATH");
  const HostileFile* file = nullptr;
  for (const auto& f : hostile_files()) file = f.name == name ? &f : file;
  REQUIRE(file != nullptr);
  auto module = target_module();
  {
    // A first load of a valid file, so that what LibTorch sets up once is not counted.
    attention::NamedTensors tensors;
    for (const auto& p : module->named_parameters()) tensors.emplace_back(p.key(), p.value());
    for (const auto& b : module->named_buffers()) tensors.emplace_back(b.key(), b.value());
    const auto own = attention::serialize_safetensors(tensors);
    attention::load_weights_from_memory(*module, own.data(), own.size(), file->options);
  }
  const int64_t before = status_bytes("VmRSS");
  std::ofstream("/proc/self/clear_refs") << "5";
  std::string outcome = "loaded", message;
  try {
    attention::load_weights(*module, path, file->options);
  } catch (const c10::Error& e) {
    outcome = "refused";
    message = e.what_without_backtrace();
    for (char& c : message) c = c == '\n' ? ' ' : c;
  }
  const int64_t peak = status_bytes("VmHWM") - before;
  std::ofstream(std::getenv("ATTENTION_UNTRUSTED_RESULT")) << outcome << "\n"
                                                           << peak << "\n"
                                                           << message.substr(0, 4000) << "\n";
}

TEST_CASE("untrusted files: hostile files are refused within the load budget",
          "[weights][untrusted]") {
  for (const auto& file : hostile_files()) {
    const std::string path =
        (fs::temp_directory_path() / ("attention-untrusted-" + std::to_string(getpid()))).string();
    const std::string bytes = file.bytes();
    {
      std::ofstream out(path, std::ios::binary);
      out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    }
    const ChildResult r = load_in_child(file.name, path);
    std::remove(path.c_str());
    INFO(file.name << " (" << bytes.size() << " bytes; before the budget: " << file.why
                   << "): " << r.how << ", " << r.outcome << " with a peak of "
                   << r.peak_bytes / (1 << 20) << " MiB (budget "
                   << budget(bytes.size()) / (1 << 20) << " MiB): " << r.message);
    // Each file on its own: one that crashes or hangs does not hide the others.
    CHECK(r.finished);
    if (!r.finished) continue;
    CHECK(r.outcome == "refused");
    CHECK(refused_as(r.message, file.refusal));
    if (kMeasuresMemory) CHECK(r.peak_bytes <= budget(bytes.size()));
  }
}

TEST_CASE("untrusted files: names are bounded before any regular expression sees them",
          "[weights][untrusted]") {
  auto module = target_module();
  const auto before = test::snapshot(*module);
  const std::string entry = R"({"dtype":"F32","shape":[0],"data_offsets":[0,0]})";
  const auto rename = LoadOptions().rename({{"^module\\.(.*)$", "$1"}}).strict(false);
  for (const std::size_t length : {std::size_t{1024}, std::size_t{1025}, std::size_t{2} << 20}) {
    INFO(length);
    const std::string name = "module." + std::string(length - 7, 'a');
    const std::string bytes = safetensors_file("{\"" + name + "\":" + entry + "}");
    if (length <= attention::serialization::kMaxNameLength) {
      const auto report =
          attention::load_weights_from_memory(*module, bytes.data(), bytes.size(), rename);
      CHECK(report.unexpected == std::vector<std::string>{std::string(length - 7, 'a')});
    } else {
      CHECK_THROWS_C10(
          attention::load_weights_from_memory(*module, bytes.data(), bytes.size(), rename),
          c10::ValueError,
          "a tensor name of " + std::to_string(length) + " characters (at most 1024 are read)");
    }
  }
  // A name the rules themselves make long is refused before the next rule sees it.
  const std::string short_file = safetensors_file("{\"w\":" + entry + "}");
  CHECK_THROWS_C10(attention::load_weights_from_memory(
                       *module, short_file.data(), short_file.size(),
                       LoadOptions().rename({{"^w$", std::string(1100, 'x')}, {"x+", "y"}})),
                   c10::ValueError,
                   "rule 'x+' is given a 1100-character name (made by the rules before it from "
                   "'w'); names over 1024 characters are refused");
  // torch.save names are bounded as well, for every layout.
  const std::string long_head = torch_save_file(
      kHostileProto + "}(" + tensor_entry("heads.0." + std::string(1100, 'b'), "0", 1, {1}, {1}) +
          "u.",
      {std::string(4, '\0')});
  CHECK_THROWS_C10(
      attention::load_weights_from_memory(
          *module, long_head.data(), long_head.size(),
          LoadOptions().layout(WeightLayout::BookMultiHeadAttentionWrapper).trusted(false)),
      c10::ValueError, "names a tensor with 1108 characters, over the limit of 1024");
  CHECK(test::unchanged(*module, before));
}

TEST_CASE("untrusted files: zip records that share or overlap bytes are refused",
          "[weights][untrusted]") {
  auto module = target_module();
  const std::string pickle = kHostileProto + "}(" + tensor_entry("a", "0", 1, {1}, {1}) +
                             tensor_entry("b", "1", 1, {1}, {1}) + "u.";
  const std::string four(4, '\0');
  // Two entries, one record.
  const std::string shared = torch_save_file(pickle, {four}, 1);
  CHECK_THROWS_C10(attention::load_weights_from_memory(*module, shared.data(), shared.size()),
                   c10::Error,
                   "record 'archive/data/0' overlaps record 'archive/data/1' (zip records must not "
                   "share bytes)");
  // A record whose bytes hold another record's local header and data.
  const std::string inner = zip_archive({{"archive/data/1", four}}).substr(0, 30 + 14 + 4);
  std::string nested = zip_archive(
      {{"archive/data.pkl", pickle}, {"archive/data/0", four}, {"archive/pad", inner}}, {});
  // Point a fourth entry at the local header inside "archive/pad".
  const std::size_t pad_data = nested.find(inner);
  REQUIRE(pad_data != std::string::npos);
  std::string with_alias =
      zip_archive({{"archive/data.pkl", pickle}, {"archive/data/0", four}, {"archive/pad", inner}},
                  {{"archive/data/1", 2}});
  // The alias entry is the last central directory entry: its local header offset is 4 bytes at
  // 42 past its signature.
  const std::size_t last = with_alias.rfind(std::string("PK\x01\x02", 4));
  with_alias.replace(last + 42, 4, le(pad_data, 4));
  with_alias.replace(last + 16, 4, with_alias.substr(pad_data + 14, 4));  // its CRC-32
  with_alias.replace(last + 20, 8, le(4, 4) + le(4, 4));                  // its sizes
  CHECK_THROWS_C10(
      attention::load_weights_from_memory(*module, with_alias.data(), with_alias.size()),
      c10::Error, "overlaps record 'archive/data/1'");
  // The same records apart load (and are refused only for not fitting the module).
  const std::string apart = torch_save_file(pickle, {four, four});
  CHECK_THROWS_C10(attention::load_weights_from_memory(*module, apart.data(), apart.size()),
                   c10::ValueError, "unexpected in the file: a, b");
}

TEST_CASE("untrusted files: a layout checks shapes before it concatenates",
          "[weights][untrusted]") {
  // The wrapper's heads of a file fit the module only when their concatenation does; a stride-0
  // view of any size is refused by its shape, not by an allocation.
  auto module = target_module();
  const auto before = test::snapshot(*module);
  std::string p = kHostileProto + "}(";
  for (int h = 0; h < 3; ++h) {
    for (const char* w : {"W_query", "W_key", "W_value"}) {
      p += tensor_entry("heads." + std::to_string(h) + "." + w + ".weight", "0", 1,
                        {int64_t{1} << 40, 8}, {0, 0});
    }
  }
  const std::string huge = torch_save_file(p + "u.", {std::string(4, '\0')});
  const auto wrapper = LoadOptions().layout(WeightLayout::BookMultiHeadAttentionWrapper);
  CHECK_THROWS_C10(attention::load_weights_from_memory(*module, huge.data(), huge.size(), wrapper),
                   c10::ValueError,
                   "shape of W_query.weight: module (9, 8), file (3298534883328, 8)");
  CHECK(test::unchanged(*module, before));
  // Stride-0 heads of the module's shape load, and are checked for NaN without being copied whole.
  std::string q = kHostileProto + "}(";
  for (int h = 0; h < 3; ++h) {
    for (const char* w : {"W_query", "W_key", "W_value"}) {
      q += tensor_entry("heads." + std::to_string(h) + "." + w + ".weight", "0", 1, {3, 8}, {0, 0});
    }
  }
  const std::string fits = torch_save_file(q + "u.", {le(0x40400000, 4)});  // 3.0f
  attention::load_weights_from_memory(*module, fits.data(), fits.size(), wrapper);
  CHECK(torch::equal(module->W_query->weight, torch::full({9, 8}, 3.0f)));
}

TEST_CASE("untrusted files: a stride-0 view of a module's shape is checked for NaN row by row",
          "[weights][untrusted]") {
  // A (1, 2^21) weight of one float: its single row is over the NaN check's slice, which is then
  // taken a dimension lower (never the same view again).
  torch::nn::Linear linear(int64_t{1} << 21, 1);
  const std::string p = kHostileProto + "}(" +
                        tensor_entry("weight", "0", 1, {1, int64_t{1} << 21}, {0, 0}) +
                        tensor_entry("bias", "0", 1, {1}, {1}) + "u.";
  const std::string file = torch_save_file(p, {le(0x40400000, 4)});  // 3.0f
  attention::load_weights_from_memory(*linear, file.data(), file.size(),
                                      LoadOptions().trusted(false));
  CHECK(torch::equal(linear->weight, torch::full({1, int64_t{1} << 21}, 3.0f)));
  CHECK(linear->bias.item<float>() == 3.0f);
  const std::string nan = torch_save_file(p, {le(0x7fc00000, 4)});
  CHECK_THROWS_C10(attention::load_weights_from_memory(*linear, nan.data(), nan.size(),
                                                       LoadOptions().trusted(false)),
                   c10::ValueError, "weight holds NaN or Inf values");
}
