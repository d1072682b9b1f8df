#include "search_space.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
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
    // tandem train keeps it in a float32, and refuses it once it rounds to 0 or overflows: every
    // trial of the value would fail.
    const float kept = static_cast<float>(x);
    if (!(kept > 0) || !std::isfinite(kept))
      bad(where, key, v, "a positive number float32 can hold (1.4e-45 to 3.4e38)");
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

// Two trials of one configuration train the same model (the same seed too): they tie, and take
// two of a rung's places. Refused, naming both, in `what` ("--grid", "trial list").
void refuse_repeated_configurations(const std::vector<TrialConfig>& trials,
                                    const std::string& what) {
  std::map<std::vector<std::string>, size_t> first;
  for (size_t i = 0; i < trials.size(); ++i) {
    TrialConfig trained = trials[i];
    trained.lr = static_cast<float>(trained.lr);  // 0.1 and 0.1000000001 train alike
    const auto [it, added] = first.emplace(trained.train_args(), i);
    if (!added)
      throw InputError(what + ": trials " + std::to_string(it->second) + " and " +
                       std::to_string(i) + " are the same configuration (" +
                       trials[i].describe() + "), which would train the same model twice; " +
                       "give each configuration once");
  }
}

// nlohmann keeps the last value of a key given twice in an object, silently; the grid refuses a
// key given twice, and so does a trial file. The first such key ("trial N: key 'K' given
// twice"), or "". `text` is valid JSON, a list.
std::string repeated_key(const std::string& text) {
  using Json = nlohmann::json;
  using Event = Json::parse_event_t;
  std::vector<std::set<std::string>> objects;
  int trial = -1;
  std::string found;
  const Json::parser_callback_t look = [&](int depth, Event event, Json& parsed) {
    // Depth 1: an element of the list (a trial), whatever it holds.
    if (depth == 1 && (event == Event::object_start || event == Event::array_start ||
                       event == Event::value))
      ++trial;
    if (event == Event::object_start) {
      objects.emplace_back();
    } else if (event == Event::object_end) {
      objects.pop_back();
    } else if (event == Event::key && found.empty() &&
               !objects.back().insert(parsed.get<std::string>()).second) {
      found = (trial >= 0 ? "trial " + std::to_string(trial) + ": " : std::string()) + "key '" +
              parsed.get<std::string>() + "' given twice";
    }
    return true;
  };
  [[maybe_unused]] const Json parsed = Json::parse(text, look);  // (only `look` is wanted)
  return found;
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
  refuse_repeated_configurations(trials, "--grid");
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
  refuse_repeated_configurations(trials, "trial list");
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
  // (Not in what is not a list: parse_trial_list says what a trial file holds.)
  const std::string repeated = list.is_array() ? repeated_key(text) : std::string();
  if (!repeated.empty()) throw InputError(path + ": " + repeated);
  try {
    return parse_trial_list(list);
  } catch (const InputError& e) {
    throw InputError(path + ": " + e.what());
  }
}

}  // namespace tandem
