#include "json_text.h"

#include <cmath>
#include <utility>

namespace tandem {
namespace {

void name_non_finite_numbers(nlohmann::json& value) {
  if (value.is_number_float()) {
    const double x = value.get<double>();
    if (std::isnan(x)) value = "NaN";
    else if (std::isinf(x)) value = x > 0 ? "Infinity" : "-Infinity";
  } else if (value.is_structured()) {
    for (nlohmann::json& element : value) name_non_finite_numbers(element);
  }
}

}  // namespace

std::string json_text(nlohmann::json value, int indent) {
  name_non_finite_numbers(value);
  return value.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace tandem
