#include "serialization/sharded_checkpoint.h"

#include "serialization/byte_source.h"
#include "serialization/limits.h"

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace attention {
namespace serialization {
namespace {

constexpr const char* kLoadWeights = "attention::load_weights";

// The index's "weight_map": tensor name -> shard file name.
// An index lists names and file names: 64 MiB is some 500 000 tensors, far beyond any model's,
// and bounds what the JSON parser is given.
constexpr std::uintmax_t kMaxIndexBytes = std::uintmax_t{64} << 20;

std::map<std::string, std::string> read_weight_map(const std::string& path) {
  std::error_code error;
  const auto bytes = std::filesystem::file_size(path, error);
  TORCH_CHECK(!error, kLoadWeights, ": cannot open '", path, "': ", error.message());
  TORCH_CHECK_VALUE(bytes <= kMaxIndexBytes, kLoadWeights, ": '", path, "' is an index of ", bytes,
                    " bytes, expected at most ", kMaxIndexBytes);
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in, kLoadWeights, ": cannot open '", path, "'");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK_VALUE(false, kLoadWeights, ": '", path, "' is not a JSON index: ", e.what());
  }
  TORCH_CHECK_VALUE(
      index.is_object() && index.contains("weight_map") && index.at("weight_map").is_object(),
      kLoadWeights, ": '", path,
      "' has no \"weight_map\" object (a sharded checkpoint's index names the file "
      "of each tensor there)");
  std::map<std::string, std::string> files;
  for (const auto& [name, file] : index.at("weight_map").items()) {
    TORCH_CHECK_VALUE(file.is_string(), kLoadWeights, ": '", path, "': the file of '", name,
                      "' is not a string");
    TORCH_CHECK_VALUE(name.size() <= kMaxNameLength, kLoadWeights, ": '", path,
                      "' names a tensor of ", name.size(), " characters (at most ", kMaxNameLength,
                      ")");
    const auto shard = file.get<std::string>();
    TORCH_CHECK_VALUE(!shard.empty() && shard != "." && shard != ".." &&
                          shard.find('/') == std::string::npos &&
                          shard.find('\0') == std::string::npos,
                      kLoadWeights, ": '", path, "' gives '", name, "' the shard '", shard,
                      "': expected a file name beside the index");
    files.emplace(name, shard);
  }
  return files;
}

}  // namespace

bool is_shard_index(const std::string& path) {
  const std::string suffix = ".index.json";
  return path.size() >= suffix.size() &&
         path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0;
}

WeightFile read_sharded(const std::string& path, const ReadOptions& options) {
  const auto weight_map = read_weight_map(path);
  std::map<std::string, std::set<std::string>> shards;  // shard -> the names the index gives it
  for (const auto& [name, shard] : weight_map) shards[shard].insert(name);
  const auto folder = std::filesystem::path(path).parent_path();
  WeightFile all;
  for (const auto& [shard, names] : shards) {
    const std::string shard_path = (folder / shard).string();
    WeightFile part;
    {
      // A shard's reader names the shard in what it throws.
      const FileSource source(shard_path);
      part = read_weight_file(source, options);
    }
    TORCH_CHECK_VALUE(all.format.empty() || all.format == part.format, kLoadWeights, ": '", path,
                      "': shard '", shard, "' is ", part.format, ", the others ", all.format);
    all.format = part.format;
    std::set<std::string> found;
    for (auto& [name, tensor] : part.tensors) {
      TORCH_CHECK_VALUE(names.count(name), kLoadWeights, ": '", path, "': shard '", shard,
                        "' holds '", name, "', which the index ",
                        weight_map.count(name) ? "gives shard '" + weight_map.at(name) + "'"
                                               : std::string("does not name"));
      found.insert(name);
      all.tensors.emplace_back(name, std::move(tensor));
    }
    for (const auto& name : names) {
      TORCH_CHECK_VALUE(found.count(name), kLoadWeights, ": '", path, "' names '", name,
                        "' in shard '", shard, "', which lacks it");
    }
  }
  return all;
}

}  // namespace serialization
}  // namespace attention
