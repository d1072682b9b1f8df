// Prometheus text exposition (format 0.0.4), built safely: metric and label names are checked,
// label values and help texts escaped, and the samples of one metric kept together under a single
// `# HELP` / `# TYPE` pair whatever order they were added in.
//
//   PrometheusText text;
//   text.gauge("tandem_worker_samples_per_second", "Samples per second", 45000.0,
//              {{"worker", "worker0"}});
//   text.counter("tandem_ps_pushes_total", "Pushes received", 530, {{"server", "ps0"}});
//   std::string body = text.str();
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace tandem {

// Label name and value pairs, in the order they are written.
using PrometheusLabels = std::vector<std::pair<std::string, std::string>>;

class PrometheusText {
 public:
  // Add one sample. Throws InputError for a malformed metric or label name, a name reused with
  // another type or help text, a repeated label set, or a negative or NaN counter.
  void gauge(const std::string& name, const std::string& help, double value,
             const PrometheusLabels& labels = {});
  void counter(const std::string& name, const std::string& help, double value,
               const PrometheusLabels& labels = {});

  // The exposition: every metric family in the order first added, each ending in a newline.
  std::string str() const;

  // Escaping and number formatting per the exposition format, public for tests.
  static std::string escape_label_value(const std::string& value);  // \ " newline
  static std::string escape_help(const std::string& help);          // \ newline
  static std::string format_value(double value);  // shortest round-trip, NaN, +Inf, -Inf

 private:
  struct Family {
    std::string name, help, type;
    std::vector<std::string> label_sets;  // the rendered `{...}` of each sample, for duplicates
    std::vector<std::string> lines;
  };
  void add(const std::string& type, const std::string& name, const std::string& help,
           double value, const PrometheusLabels& labels);
  std::vector<Family> families_;
};

}  // namespace tandem
