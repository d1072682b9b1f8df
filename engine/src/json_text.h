// JSON records as text for people and programs: metrics logs, --json outputs, result files.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace tandem {

// `value` as JSON text (one line, or indented by `indent`), always valid JSON:
// - JSON has no NaN or infinity, and nlohmann writes them as null, so a diverged loss would read
//   as a missing one: they are the strings "NaN", "Infinity" and "-Infinity" (the names
//   JavaScript and protobuf's JSON mapping use), anywhere in the value;
// - text that is not UTF-8 (a path, a name) has U+FFFD in place of the bad bytes, where dump()
//   would throw a type_error and lose the whole record.
std::string json_text(nlohmann::json value, int indent = -1);

}  // namespace tandem
