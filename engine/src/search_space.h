// The trials of a hyper-parameter search (`tandem search`): a grid given as `key=v1,v2,...` terms
// whose cartesian product is the trial list, or a JSON file holding a list of configurations.
// Keys: lr, hidden (widths joined by 'x': `256x128`, since commas separate values), batch,
// optimizer (adam, sgd), seed. A key not given keeps `tandem train`'s default.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tandem {

struct TrialConfig {
  double lr = 0.01;
  std::string hidden = "100";  // widths as `tandem train --hidden` takes them: "256,128"
  int64_t batch = 1000;
  std::string optimizer = "adam";
  uint64_t seed = 1;

  // The `tandem train` options that set this configuration.
  std::vector<std::string> train_args() const;
  // "lr=0.001 hidden=256x128 batch=100 optimizer=adam seed=1"
  std::string describe() const;
  nlohmann::json to_json() const;
};

// The cartesian product of the terms, the first term varying slowest. Throws InputError naming
// the term for an unknown key, a repeated key, a missing value or a bad value.
std::vector<TrialConfig> parse_grid(const std::vector<std::string>& terms);

// A JSON list of objects with the keys above (numbers or strings; hidden also as a list of
// widths). Throws InputError naming the entry and key.
std::vector<TrialConfig> parse_trial_list(const nlohmann::json& list);
std::vector<TrialConfig> load_trial_file(const std::string& path);

}  // namespace tandem
