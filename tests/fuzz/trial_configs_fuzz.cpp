// Fuzz target: the trials of a search, as `tandem search` reads them. The input's first byte
// chooses: even, a JSON list of configurations (a --trials file); odd, --grid terms (the rest of
// the input split at whitespace). Bad input is an InputError naming the entry or term; the
// configurations accepted describe themselves as JSON that reads back as the same trials.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz_target.h"
#include "search_space.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::vector<tandem::TrialConfig> trials;
  if ((data[0] & 1) == 0) {
    const nlohmann::json list = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (list.is_discarded()) return 0;  // not JSON: load_trial_file's own error, not fuzzed here
    if (!tandem::fuzz::accepts([&] { trials = tandem::parse_trial_list(list); })) return 0;
  } else {
    std::istringstream in(text);
    std::vector<std::string> terms;
    for (std::string term; in >> term;) terms.push_back(term);
    if (!tandem::fuzz::accepts([&] { trials = tandem::parse_grid(terms); })) return 0;
  }
  nlohmann::json described = nlohmann::json::array();
  for (const tandem::TrialConfig& t : trials) {
    FUZZ_CHECK(!t.train_args().empty());
    described.push_back(t.to_json());
  }
  std::vector<tandem::TrialConfig> again;
  FUZZ_CHECK(tandem::fuzz::accepts([&] { again = tandem::parse_trial_list(described); }));
  FUZZ_CHECK(again.size() == trials.size());
  for (size_t i = 0; i < trials.size(); ++i) FUZZ_CHECK(again[i].describe() == trials[i].describe());
  return 0;
}
