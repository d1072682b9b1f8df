#include "search_space.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>

#include "json_fields.h"
#include "tandem/error.h"

namespace tandem {

namespace {

const char* const kKeys = "lr, hidden, batch, optimizer, seed";

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

// The fields of `text` between separators, empty ones kept ("100x" is 100 and ""): std::getline
// drops a trailing empty field, which let "lr=0.1," and "hidden=100x" pass as if whole.
std::vector<std::string> fields(const std::string& text, char separator) {
  std::vector<std::string> out;
  size_t from = 0;
  while (true) {
    const size_t at = text.find(separator, from);
    out.push_back(text.substr(from, at == std::string::npos ? std::string::npos : at - from));
    if (at == std::string::npos) return out;
    from = at + 1;
  }
}

[[noreturn]] void bad(const std::string& where, const std::string& key, const std::string& value,
                      const std::string& expected) {
  throw InputError(where + ": " + key + "=" + value + ": expected " + expected);
}

// `v` as a whole number of at least `min`, or false.
bool whole_number(const std::string& v, int64_t min, int64_t& out) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0 || x < min) return false;
  out = x;
  return true;
}

int64_t parse_int(const std::string& where, const std::string& key, const std::string& v,
                  int64_t min) {
  int64_t x = 0;
  if (!whole_number(v, min, x)) bad(where, key, v, "a whole number >= " + std::to_string(min));
  return x;
}

// Sets `key` of `config` from its text form.
void set_value(TrialConfig& config, const std::string& where, const std::string& key,
               const std::string& raw) {
  const std::string v = trim(raw);
  if (key == "lr") {
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !std::isfinite(x) || x <= 0)
      bad(where, key, v, "a positive number");
    config.lr = x;
  } else if (key == "hidden") {
    // 256x128 (or 256,128 from a JSON string) -> "256,128"
    const std::string expected = "layer widths such as 100 or 256x128 (whole numbers >= 1)";
    if (v.empty()) bad(where, key, v, expected);
    std::string widths;
    for (const std::string& part : fields(v, v.find('x') != std::string::npos ? 'x' : ',')) {
      // The whole value in the message: "hidden=8,4x" once said "hidden=: expected ...".
      int64_t width = 0;
      if (!whole_number(trim(part), 1, width)) bad(where, key, v, expected);
      widths += (widths.empty() ? "" : ",") + std::to_string(width);
    }
    config.hidden = widths;
  } else if (key == "batch") {
    config.batch = parse_int(where, key, v, 1);
  } else if (key == "optimizer") {
    if (v != "adam" && v != "sgd") bad(where, key, v, "adam or sgd");
    config.optimizer = v;
  } else if (key == "seed") {  // any uint64, as tandem train --seed takes
    errno = 0;
    const unsigned long long x = std::strtoull(v.c_str(), nullptr, 10);
    if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos || errno != 0)
      bad(where, key, v, "a whole number from 0 to 18446744073709551615");
    config.seed = x;
  } else {
    throw InputError(where + ": unknown key '" + key + "' (known: " + kKeys + ")");
  }
}

std::string number_text(double x) {
  std::ostringstream out;
  out << x;  // shortest form that reads back: 0.001, 1e-05
  return out.str();
}

}  // namespace

std::vector<std::string> TrialConfig::train_args() const {
  std::ostringstream lr_text;
  lr_text.precision(17);
  lr_text << lr;
  return {"--lr", lr_text.str(), "--hidden", hidden, "--batch", std::to_string(batch),
          "--optimizer", optimizer, "--seed", std::to_string(seed)};
}

std::string TrialConfig::describe() const {
  std::string h = hidden;
  for (char& c : h)
    if (c == ',') c = 'x';
  return "lr=" + number_text(lr) + " hidden=" + h + " batch=" + std::to_string(batch) +
         " optimizer=" + optimizer + " seed=" + std::to_string(seed);
}

nlohmann::json TrialConfig::to_json() const {
  std::string h = hidden;
  for (char& c : h)
    if (c == ',') c = 'x';
  return {{"lr", lr}, {"hidden", h}, {"batch", batch}, {"optimizer", optimizer}, {"seed", seed}};
}

std::vector<TrialConfig> parse_grid(const std::vector<std::string>& terms) {
  if (terms.empty()) throw InputError("--grid: no terms (expected key=v1,v2,... terms)");
  std::vector<TrialConfig> trials{TrialConfig{}};
  std::set<std::string> seen;
  for (const std::string& term : terms) {
    const std::string where = "--grid term '" + term + "'";
    const size_t eq = term.find('=');
    if (eq == std::string::npos) throw InputError(where + ": expected key=v1,v2,...");
    const std::string key = trim(term.substr(0, eq));
    if (!seen.insert(key).second) throw InputError(where + ": key '" + key + "' given twice");
    if (trim(term.substr(eq + 1)).empty()) throw InputError(where + ": no values");
    const std::vector<std::string> values = fields(term.substr(eq + 1), ',');
    std::vector<TrialConfig> next;
    for (const TrialConfig& base : trials)
      for (const std::string& v : values) {
        TrialConfig c = base;
        set_value(c, where, key, v);
        next.push_back(c);
      }
    trials = std::move(next);
  }
  return trials;
}

std::vector<TrialConfig> parse_trial_list(const nlohmann::json& list) {
  if (!list.is_array() || list.empty())
    throw InputError("trial list: expected a non-empty JSON list of objects");
  std::vector<TrialConfig> trials;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = "trial " + std::to_string(i);
    if (!list[i].is_object()) throw InputError(where + ": expected an object");
    TrialConfig c;
    for (const auto& [key, value] : list[i].items()) {
      std::string text;
      if (value.is_string()) {
        text = value.get<std::string>();
      } else if (value.is_number_integer() || value.is_number_unsigned()) {
        text = value.dump();
      } else if (value.is_number_float()) {
        std::ostringstream out;
        out.precision(17);
        out << value.get<double>();
        text = out.str();
      } else if (value.is_array() && key == "hidden") {
        for (const auto& w : value) text += (text.empty() ? "" : "x") + w.dump();
      } else {
        bad(where, key, value.dump(), "a number or a string");
      }
      set_value(c, where, key, text);
    }
    trials.push_back(c);
  }
  return trials;
}

std::vector<TrialConfig> load_trial_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw IoError(path + ": cannot open the trial list");
  // Parsed whole: `in >> list` stopped after the first value, and took "[...], {...}]" (a typo)
  // as the first list alone.
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  std::string problem;
  const nlohmann::json list = parse_json_file_text(text, problem);
  if (!problem.empty()) throw InputError(path + ": " + problem + "; expected a list of trials");
  try {
    return parse_trial_list(list);
  } catch (const InputError& e) {
    throw InputError(path + ": " + e.what());
  }
}

}  // namespace tandem
