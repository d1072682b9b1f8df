// The fields of a JSON object that came from another process or a file (a coordinator's reply,
// cluster settings from the public API or a coordinator, a parameter server's stats, a cluster
// spec file), each read as its type or refused with an InputError naming the object, the field,
// its value and what was expected. nlohmann's own conversions cast a number of the wrong kind
// (2.5 for an integer: 2; 1e10 for an int, or 1e300 for a float: undefined behaviour), throw
// their own exceptions for a wrong type, and name no field.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tandem {

// True, with `out` set, for an integer within int64's range (an integral float up to 2^53
// included: 3.0 from a language without integers).
bool json_as_integer(const nlohmann::json& value, int64_t& out);

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
