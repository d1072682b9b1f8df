// The fields of a JSON object that came from another process or a file (a coordinator's reply,
// cluster settings from the public API or a coordinator, a parameter server's stats, a cluster
// spec file), each read as its type or refused with an InputError naming the object, the field,
// its value and what was expected. nlohmann's own conversions cast a number of the wrong kind
// (2.5 for an integer: 2; 1e10 for an int, or 1e300 for a float: undefined behaviour), throw
// their own exceptions for a wrong type, and name no field.
//
// Two forms: the json_* functions read one field of a message (a cluster message, named by its
// key alone), the _or ones tolerantly; JsonFields reads a whole object and names it in errors.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

// JSON from another process or a file is refused when nested deeper than this, before it is
// parsed: nlohmann parses deep documents fine, but dump() (every error that shows a value) and
// copies recurse once per level, so 100,000 brackets (200 KB) would overflow the stack.
constexpr int kMaxJsonDepth = 64;
// Whether the characters of a JSON text, fed in order, lie outside its strings (escapes
// included): for the scans that read JSON text without parsing it.
class JsonStringTracker {
 public:
  // Whether `c` is outside every string (a quote that opens or closes one is not).
  bool outside(char c) {
    if (in_string_) {
      if (escaped_) escaped_ = false;
      else if (c == '\\') escaped_ = true;
      else if (c == '"') in_string_ = false;
      return false;
    }
    if (c == '"') {
      in_string_ = true;
      return false;
    }
    return true;
  }

 private:
  bool in_string_ = false, escaped_ = false;
};

// The deepest nesting of brackets in JSON text, strings skipped; scanned without parsing.
int json_depth(std::string_view text);
// `text` as JSON, or a discarded value (is_discarded()) when it is not JSON or is nested deeper
// than kMaxJsonDepth: what every message from another process and every spec file is read with.
nlohmann::json parse_bounded_json(std::string_view text);
// `text` as JSON; where it is not, a discarded value and why in `problem` ("JSON nested more
// than 64 levels deep", or "not valid JSON (the parser's message)": invalid UTF-8 and a number
// past double's range included), for an error that names the file. Empty `problem` otherwise.
nlohmann::json parse_json_file_text(std::string_view text, std::string& problem);

// True, with `out` set, for an integer within int64's range (an integral float up to 2^53
// included: 3.0 from a language without integers).
bool json_as_integer(const nlohmann::json& value, int64_t& out);

// `message[key]` as a number: NaN for null (a NaN sent as JSON), `missing` when absent.
// InputError naming the key for anything else.
double json_number(const nlohmann::json& message, const char* key, double missing);
// `message[key]` as an integer, `missing` when absent. InputError naming the key for anything
// else, a number with a fraction or out of int64's range included (nlohmann's own conversion
// of such a number is undefined behaviour).
int64_t json_integer(const nlohmann::json& message, const char* key, int64_t missing);
// `message[key]` as text, `missing` when absent. InputError naming the key for anything else.
std::string json_string(const nlohmann::json& message, const char* key, const std::string& missing);
// The same, for what is read but not checked (what a role reported, for a state; a replay's
// number): `fallback` when absent or of any other type, never an error.
int64_t json_integer_or(const nlohmann::json& message, const char* key, int64_t fallback);
double json_number_or(const nlohmann::json& message, const char* key, double fallback);
std::string json_string_or(const nlohmann::json& message, const char* key,
                           const std::string& fallback);

// A whole object, field by field.
class JsonFields {
 public:
  // `whose` starts every error ("cluster settings", "the coordinator's reply to 'work'"). The
  // object must outlive the reader. InputError when `object` is not a JSON object.
  JsonFields(const nlohmann::json& object, std::string whose);
  JsonFields(nlohmann::json&& object, std::string whose) = delete;  // it would dangle

  // `fallback`: the value when the field is absent (from an older release, or optional); null:
  // the field is required.
  bool has(const char* key) const;
  std::string text(const char* key, const std::string* fallback = nullptr) const;
  bool flag(const char* key, const bool* fallback = nullptr) const;
  double number(const char* key, const double* fallback = nullptr) const;
  float single(const char* key) const;  // a number within float32's range
  int64_t integer(const char* key, const int64_t* fallback = nullptr) const;
  int small_integer(const char* key, const int64_t* fallback = nullptr) const;  // int32's range
  uint64_t unsigned_integer(const char* key) const;
  std::vector<int64_t> integers(const char* key) const;  // an array of integers
  const nlohmann::json& object(const char* key) const;   // a nested object, as it is
  const nlohmann::json& array(const char* key) const;    // a nested array, as it is

  const std::string& whose() const { return whose_; }

 private:
  template <typename T>
  T typed(const char* key, const T* fallback, bool (nlohmann::json::*is)() const noexcept,
          const char* expected) const;
  const nlohmann::json* find(const char* key, bool optional) const;
  [[noreturn]] void wrong(const char* key, const nlohmann::json& value,
                          const char* expected) const;

  const nlohmann::json& j_;
  std::string whose_;
};

}  // namespace tandem
