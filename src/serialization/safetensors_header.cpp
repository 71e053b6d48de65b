#include "serialization/safetensors_header.h"

#include "serialization/limits.h"

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>

namespace attention {
namespace serialization {
namespace {

constexpr const char* kName = "attention::safetensors";
constexpr uint64_t kMaxDimension = uint64_t{1} << 40;

struct DtypeName {
  const char* name;
  c10::ScalarType dtype;
};
constexpr DtypeName kDtypes[] = {
    {"F64", c10::kDouble}, {"F32", c10::kFloat}, {"F16", c10::kHalf},  {"BF16", c10::kBFloat16},
    {"I64", c10::kLong},   {"I32", c10::kInt},   {"I16", c10::kShort}, {"I8", c10::kChar},
    {"U8", c10::kByte},    {"BOOL", c10::kBool}};

// nlohmann's SAX interface: one call per token, in order. Each returns false to stop the parse,
// after saving the reason in `error_`. The parser keeps no tree, only this state.
class HeaderParser {
 public:
  using binary_t = nlohmann::json::binary_t;

  std::vector<HeaderEntry> entries;
  std::string error;

  bool null() { return scalar("null"); }
  bool boolean(bool value) { return scalar(value ? "true" : "false"); }
  bool number_integer(int64_t value) { return scalar(std::to_string(value)); }
  bool number_unsigned(uint64_t value) {
    if (place() == Place::Shape) return dimension(value);
    if (place() == Place::Offsets) return offset(value);
    return scalar(std::to_string(value));
  }
  bool number_float(double, const std::string& text) { return scalar(text); }
  bool binary(binary_t&) { return scalar("binary"); }
  bool string(std::string& value) {
    if (place() == Place::Entry && field_ == Field::Dtype) return dtype(value);
    if (place() == Place::Metadata) return true;
    return scalar('"' + excerpt(value) + '"');
  }

  bool start_object(std::size_t) {
    if (place() == Place::None) return push(Place::Top);
    if (place() == Place::Top)
      return push(name_ == "__metadata__" ? Place::Metadata : Place::Entry);
    return container("an object");
  }
  bool end_object() {
    const Place done = place();
    stack_.pop_back();
    return done == Place::Entry ? finish_entry() : true;
  }
  bool start_array(std::size_t) {
    if (place() == Place::Entry && field_ == Field::Shape) return push(Place::Shape);
    if (place() == Place::Entry && field_ == Field::Offsets) return push(Place::Offsets);
    return container("a list");
  }
  bool end_array() {
    const Place done = place();
    stack_.pop_back();
    if (done == Place::Offsets && offsets_ != 2) {
      return fail("entry '" + entry_.name + "' has invalid data_offsets (" +
                  std::to_string(offsets_) + " numbers, expected 2)");
    }
    return true;
  }
  bool key(std::string& key) {
    if (place() == Place::Top) {
      if (key.size() > kMaxNameLength) {
        return fail("a tensor name of " + std::to_string(key.size()) + " characters (at most " +
                    std::to_string(kMaxNameLength) + " are read): '" + excerpt(key) + "'");
      }
      name_ = std::move(key);
      return true;
    }
    if (place() == Place::Metadata) {
      name_ = std::move(key);
      return true;
    }
    if (place() == Place::Entry) {
      field_ = key == "dtype"          ? Field::Dtype
               : key == "shape"        ? Field::Shape
               : key == "data_offsets" ? Field::Offsets
                                       : Field::Other;
      if (field_ == Field::Other) return true;  // other fields are read past, as other readers do
      const auto bit = 1u << static_cast<unsigned>(field_);
      if (seen_ & bit) return fail("entry '" + entry_.name + "' gives " + key + " twice");
      seen_ |= bit;
      return true;
    }
    return true;  // a key inside a field this reader skips
  }

  bool parse_error(std::size_t position, const std::string&, const nlohmann::json::exception& e) {
    return fail("the header is not a JSON object (byte " + std::to_string(position) +
                "): " + e.what());
  }

 private:
  // Where the parse is: inside the header object, the metadata, an entry, or one of its lists.
  enum class Place { None, Top, Metadata, Entry, Shape, Offsets, Skipped };
  enum class Field { Dtype, Shape, Offsets, Other };

  Place place() const { return stack_.empty() ? Place::None : stack_.back(); }

  bool fail(std::string message) {
    error = std::move(message);
    return false;
  }

  bool push(Place next) {
    if (stack_.size() >= kMaxJsonDepth) {
      return fail("the header nests deeper than " + std::to_string(kMaxJsonDepth) +
                  " levels (the header, an entry, its shape)");
    }
    if (next == Place::Entry) {
      entry_ = HeaderEntry{};
      entry_.name = std::move(name_);
      field_ = Field::Other;
      seen_ = 0;
      offsets_ = 0;
    }
    stack_.push_back(next);
    return true;
  }

  // A value where the grammar has none of its kind: an error, or part of a field read past.
  bool scalar(const std::string& text) {
    switch (place()) {
      case Place::None:
        return fail("the header is not a JSON object");
      case Place::Top:
        if (name_ == "__metadata__") return fail("__metadata__ is not an object");
        return fail("entry '" + name_ + "' lacks dtype, shape or data_offsets (it is " + text +
                    ")");
      case Place::Metadata:
        return fail("__metadata__ value of '" + name_ + "' is not a string");
      case Place::Entry:
        if (field_ == Field::Dtype) {
          return fail("entry '" + entry_.name + "' has an unknown dtype " + text);
        }
        if (field_ == Field::Shape) {
          return fail("entry '" + entry_.name + "' has a shape that is not a list");
        }
        if (field_ == Field::Offsets) {
          return fail("entry '" + entry_.name + "' has invalid data_offsets " + text);
        }
        return true;
      case Place::Shape:
        return fail("entry '" + entry_.name + "' has an invalid dimension " + text);
      case Place::Offsets:
        return fail("entry '" + entry_.name + "' has invalid data_offsets (" + text + ")");
      case Place::Skipped:
        return true;
    }
    return true;
  }

  // An object or a list anywhere but where the grammar puts one: beyond the depth limit it is
  // refused for its depth; inside a field read past it nests; anywhere else it is an error.
  bool container(const char* what) {
    if (stack_.size() >= kMaxJsonDepth) return push(Place::Skipped);  // refused for its depth
    const Place at = place();
    if (at == Place::Skipped || (at == Place::Entry && field_ == Field::Other)) {
      return push(Place::Skipped);
    }
    return scalar(what);
  }

  bool dtype(const std::string& value) {
    for (const auto& d : kDtypes) {
      if (value == d.name) {
        entry_.dtype = d.dtype;
        entry_.dtype_name = d.name;
        return true;
      }
    }
    return fail("entry '" + entry_.name + "' has an unknown dtype \"" + excerpt(value) + "\"");
  }

  bool dimension(uint64_t d) {
    if (d > kMaxDimension) {
      return fail("entry '" + entry_.name + "' has an invalid dimension " + std::to_string(d));
    }
    if (entry_.shape.size() >= kMaxDimensions) {
      return fail("entry '" + entry_.name + "' has more than " + std::to_string(kMaxDimensions) +
                  " dimensions");
    }
    // numel * 8 bytes must stay addressable: no product of dimensions overflows.
    if (d != 0 && entry_.numel > std::numeric_limits<uint64_t>::max() / d / 8) {
      return fail("entry '" + entry_.name + "' is too large");
    }
    entry_.numel *= d;
    entry_.shape.push_back(static_cast<int64_t>(d));
    return true;
  }

  bool offset(uint64_t value) {
    if (offsets_ == 2) {
      return fail("entry '" + entry_.name + "' has invalid data_offsets (more than 2 numbers)");
    }
    (offsets_++ == 0 ? entry_.begin : entry_.end) = value;
    return true;
  }

  bool finish_entry() {
    if (seen_ != 0b111) {
      return fail("entry '" + entry_.name + "' lacks dtype, shape or data_offsets");
    }
    entries.push_back(std::move(entry_));
    return true;
  }

  std::vector<Place> stack_;
  std::string name_;  // the last key of the header or the metadata
  Field field_ = Field::Other;
  unsigned seen_ = 0;  // bits of the fields an entry gave
  int offsets_ = 0;
  HeaderEntry entry_;
};

}  // namespace

std::vector<HeaderEntry> parse_safetensors_header(const std::string& text) {
  HeaderParser parser;
  bool parsed = false;
  try {
    parsed = nlohmann::json::sax_parse(text, &parser);
  } catch (const nlohmann::json::exception& e) {
    parser.error = std::string("the header is not a JSON object: ") + e.what();
  }
  TORCH_CHECK_VALUE(parsed, kName, ": ",
                    parser.error.empty() ? "the header is not a JSON object" : parser.error);
  // Names given twice: sorted, so that no table of hashes can be flooded.
  std::vector<uint32_t> order(parser.entries.size());
  std::iota(order.begin(), order.end(), 0u);
  const auto& entries = parser.entries;
  std::sort(order.begin(), order.end(),
            [&](uint32_t a, uint32_t b) { return entries[a].name < entries[b].name; });
  for (std::size_t i = 1; i < order.size(); ++i) {
    TORCH_CHECK_VALUE(entries[order[i]].name != entries[order[i - 1]].name, kName, ": entry '",
                      entries[order[i]].name, "' is given twice");
  }
  return std::move(parser.entries);
}

const char* safetensors_dtype_name(c10::ScalarType dtype) {
  for (const auto& d : kDtypes) {
    if (d.dtype == dtype) return d.name;
  }
  TORCH_CHECK_VALUE(false, kName, ": no safetensors dtype for ", dtype);
}

}  // namespace serialization
}  // namespace attention
