#include "prometheus_text.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "tandem/error.h"

namespace tandem {
namespace {

bool is_alpha_(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

// [a-zA-Z_:][a-zA-Z0-9_:]*
bool valid_metric_name(const std::string& name) {
  if (name.empty() || !(is_alpha_(name[0]) || name[0] == ':')) return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return is_alpha_(c) || is_digit(c) || c == ':'; });
}

// [a-zA-Z_][a-zA-Z0-9_]*, and not the reserved __ prefix.
bool valid_label_name(const std::string& name) {
  if (name.empty() || !is_alpha_(name[0]) || name.rfind("__", 0) == 0) return false;
  return std::all_of(name.begin(), name.end(), [](char c) { return is_alpha_(c) || is_digit(c); });
}

}  // namespace

std::string PrometheusText::escape_label_value(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string PrometheusText::escape_help(const std::string& help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string PrometheusText::format_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof(buf), value);
  return std::string(buf, result.ptr);
}

void PrometheusText::gauge(const std::string& name, const std::string& help, double value,
                           const PrometheusLabels& labels) {
  add("gauge", name, help, value, labels);
}

void PrometheusText::counter(const std::string& name, const std::string& help, double value,
                             const PrometheusLabels& labels) {
  if (!(value >= 0.0))
    throw InputError("Prometheus counter " + name + " must be >= 0, got " + format_value(value));
  add("counter", name, help, value, labels);
}

void PrometheusText::add(const std::string& type, const std::string& name, const std::string& help,
                         double value, const PrometheusLabels& labels) {
  if (!valid_metric_name(name))
    throw InputError("bad Prometheus metric name \"" + name + "\" (want [a-zA-Z_:][a-zA-Z0-9_:]*)");
  std::string label_text;
  for (size_t i = 0; i < labels.size(); ++i) {
    const auto& [key, value_text] = labels[i];
    if (!valid_label_name(key))
      throw InputError("bad Prometheus label name \"" + key + "\" on " + name +
                       " (want [a-zA-Z_][a-zA-Z0-9_]*, not starting with __)");
    for (size_t j = 0; j < i; ++j)
      if (labels[j].first == key) throw InputError("label " + key + " repeated on " + name);
    label_text += (i == 0 ? "{" : ",") + key + "=\"" + escape_label_value(value_text) + "\"";
  }
  if (!label_text.empty()) label_text += "}";

  auto family = std::find_if(families_.begin(), families_.end(),
                             [&](const Family& f) { return f.name == name; });
  if (family == families_.end()) {
    families_.push_back(Family{name, help, type, {}, {}});
    family = families_.end() - 1;
  } else if (family->type != type) {
    throw InputError("Prometheus metric " + name + " added as " + type + ", was " + family->type);
  } else if (family->help != help) {
    throw InputError("Prometheus metric " + name + " added with another help text");
  }
  if (std::find(family->label_sets.begin(), family->label_sets.end(), label_text) !=
      family->label_sets.end())
    throw InputError("Prometheus sample " + name + label_text + " added twice");
  family->label_sets.push_back(label_text);
  family->lines.push_back(name + label_text + " " + format_value(value));
}

std::string PrometheusText::str() const {
  std::string out;
  for (const auto& family : families_) {
    out += "# HELP " + family.name + " " + escape_help(family.help) + "\n";
    out += "# TYPE " + family.name + " " + family.type + "\n";
    for (const auto& line : family.lines) out += line + "\n";
  }
  return out;
}

}  // namespace tandem
