#include "json_fields.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tandem/error.h"

namespace tandem {

using json = nlohmann::json;

namespace {

// A value as an error shows it: invalid UTF-8 replaced, at most about 200 bytes, cut between
// characters (the text reaches Python, which refuses a broken one).
std::string shown(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() <= 200) return text;
  size_t cut = 200;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return text.substr(0, cut) + "...";
}

}  // namespace

int json_depth(std::string_view text) {
  int depth = 0, deepest = 0;
  JsonStringTracker strings;
  for (const char c : text) {
    if (!strings.outside(c)) continue;
    if (c == '[' || c == '{') deepest = std::max(deepest, ++depth);
    else if (c == ']' || c == '}') --depth;
  }
  return deepest;
}

json parse_json_file_text(std::string_view text, std::string& problem) {
  problem.clear();
  // Before the depth: the brackets counted in a binary file given for a JSON one (which holds
  // NULs) made it "nested too deep".
  if (const size_t at = text.find('\0'); at != std::string_view::npos) {
    problem = "not valid JSON (a NUL byte at offset " + std::to_string(at) +
              ", which the parser would take for the end of the text)";
    return json(json::value_t::discarded);
  }
  if (json_depth(text) > kMaxJsonDepth) {
    problem = "JSON nested more than " + std::to_string(kMaxJsonDepth) + " levels deep";
    return json(json::value_t::discarded);
  }
  try {
    return json::parse(text);
  } catch (const json::exception& e) {  // a syntax error, or a number too large (out_of_range)
    problem = std::string("not valid JSON (") + e.what() + ")";
    return json(json::value_t::discarded);
  }
}

json parse_bounded_json(std::string_view text) {
  std::string problem;  // (the same checks, the reason left unsaid)
  return parse_json_file_text(text, problem);
}

bool json_as_integer(const json& value, int64_t& out) {
  if (value.is_number_unsigned()) {
    if (value.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) return false;
    out = int64_t(value.get<uint64_t>());
    return true;
  }
  if (value.is_number_integer()) {
    out = value.get<int64_t>();
    return true;
  }
  if (value.is_number_float()) {  // 3.0 from a language without integers
    const double v = value.get<double>();
    if (std::floor(v) != v || !(std::fabs(v) <= 9007199254740992.0)) return false;
    out = int64_t(v);
    return true;
  }
  return false;
}

double json_number(const json& message, const char* key, double missing) {
  const auto it = message.find(key);
  if (it == message.end()) return missing;
  if (it->is_null()) return std::numeric_limits<double>::quiet_NaN();
  if (!it->is_number())
    throw InputError(std::string("\"") + key + "\" is " + shown(*it) + ", expected a number");
  return it->get<double>();
}

int64_t json_integer(const json& message, const char* key, int64_t missing) {
  const auto it = message.find(key);
  if (it == message.end()) return missing;
  int64_t out = 0;
  if (!json_as_integer(*it, out))
    throw InputError(std::string("\"") + key + "\" is " + shown(*it) + ", expected an integer");
  return out;
}

int64_t json_integer_or(const json& message, const char* key, int64_t fallback) {
  try {
    return json_integer(message, key, fallback);
  } catch (const InputError&) {
    return fallback;
  }
}

double json_number_or(const json& message, const char* key, double fallback) {
  try {
    return json_number(message, key, fallback);
  } catch (const InputError&) {
    return fallback;
  }
}

std::string json_string_or(const json& message, const char* key,
                           const std::string& fallback) {
  const auto it = message.find(key);
  return it != message.end() && it->is_string() ? it->get<std::string>() : fallback;
}


std::string json_string(const json& message, const char* key, const std::string& missing) {
  const auto it = message.find(key);
  if (it == message.end()) return missing;
  if (!it->is_string())
    throw InputError(std::string("\"") + key + "\" is " + shown(*it) + ", expected text");
  return it->get<std::string>();
}

JsonFields::JsonFields(const json& object, std::string whose)
    : j_(object), whose_(std::move(whose)) {
  if (!j_.is_object()) throw InputError(whose_ + ": " + shown(j_) + " is not an object");
}

bool JsonFields::has(const char* key) const { return j_.find(key) != j_.end(); }

std::string JsonFields::text(const char* key, const std::string* fallback) const {
  return typed(key, fallback, &json::is_string, "text");
}

bool JsonFields::flag(const char* key, const bool* fallback) const {
  return typed(key, fallback, &json::is_boolean, "true or false");
}

double JsonFields::number(const char* key, const double* fallback) const {
  return typed(key, fallback, &json::is_number, "a number");
}

float JsonFields::single(const char* key) const {
  const double v = number(key);
  if (!(std::fabs(v) <= double(std::numeric_limits<float>::max())))
    wrong(key, j_.at(key), "a number within float32's range");
  return float(v);
}

int64_t JsonFields::integer(const char* key, const int64_t* fallback) const {
  const json* v = find(key, fallback != nullptr);
  if (v == nullptr) return *fallback;
  int64_t value = 0;
  if (!json_as_integer(*v, value)) wrong(key, *v, "an integer");
  return value;
}

int JsonFields::small_integer(const char* key, const int64_t* fallback) const {
  const int64_t v = integer(key, fallback);
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
    wrong(key, j_.at(key), "an integer within int32's range");
  return int(v);
}

uint64_t JsonFields::unsigned_integer(const char* key) const {
  const json* v = find(key, false);
  if (!v->is_number_unsigned() && !(v->is_number_integer() && v->get<int64_t>() >= 0))
    wrong(key, *v, "a non-negative integer");
  return v->get<uint64_t>();
}

std::vector<int64_t> JsonFields::integers(const char* key) const {
  const json& list = array(key);
  std::vector<int64_t> out;
  out.reserve(list.size());
  for (const json& item : list) {
    int64_t value = 0;
    if (!json_as_integer(item, value)) wrong(key, item, "an array of integers (one item is not)");
    out.push_back(value);
  }
  return out;
}

const json& JsonFields::object(const char* key) const {
  const json* v = find(key, false);
  if (!v->is_object()) wrong(key, *v, "an object");
  return *v;
}

const json& JsonFields::array(const char* key) const {
  const json* v = find(key, false);
  if (!v->is_array()) wrong(key, *v, "an array");
  return *v;
}

template <typename T>
T JsonFields::typed(const char* key, const T* fallback, bool (json::*is)() const noexcept,
                    const char* expected) const {
  const json* v = find(key, fallback != nullptr);
  if (v == nullptr) return *fallback;
  if (!(v->*is)()) wrong(key, *v, expected);
  return v->get<T>();
}

const json* JsonFields::find(const char* key, bool optional) const {
  const auto it = j_.find(key);
  if (it != j_.end()) return &*it;
  if (optional) return nullptr;
  throw InputError(whose_ + ": '" + key + "' is missing");
}

void JsonFields::wrong(const char* key, const json& value, const char* expected) const {
  throw InputError(whose_ + ": '" + key + "' is " + shown(value) + ", expected " + expected);
}

}  // namespace tandem
