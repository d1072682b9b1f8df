// Checks of numeric options with messages a user can act on. CLI11's own PositiveNumber and
// NonNegativeNumber answer "--batch 0" with "Value 0 not in range 0.000000 to 1797...(300
// digits)", and an unsigned option takes "-1" as 2^64-1 without a word.
#pragma once

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "bind_address.h"

namespace tandem::cli {

namespace detail {

// The option's text as a finite number, or false.
inline bool finite_number(const std::string& text, double& value) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  value = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size() && errno == 0 && std::isfinite(value);
}

}  // namespace detail

// A number above zero ("INT:POSITIVE" in the help, as CLI11's check showed it).
inline CLI::Validator positive_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double value = 0;
        if (!detail::finite_number(text, value) || value <= 0)
          return "must be a number above 0, got '" + text + "'";
        return {};
      },
      "POSITIVE");
}

// Zero or a number above it.
inline CLI::Validator non_negative_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double value = 0;
        if (!detail::finite_number(text, value) || value < 0)
          return "must be 0 or a number above it, got '" + text + "'";
        return {};
      },
      "NONNEGATIVE");
}

// A number from `low` (exclusive when `above`) to `high`, for options a program turns into clock
// durations or milliseconds in an int (past those, they overflow).
inline CLI::Validator number_in(double low, double high, bool above, const std::string& name) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double value = 0;
        const bool in = detail::finite_number(text, value) &&
                        (above ? value > low : value >= low) && value <= high;
        if (in) return {};
        // (Whole limits in full: %g wrote 2^30 as 1.07374e+09.)
        const auto limit = [](double x) {
          char text[40];
          const bool whole = x == std::floor(x) && std::fabs(x) < 1e15;
          std::snprintf(text, sizeof text, whole ? "%.0f" : "%g", x);
          return std::string(text);
        };
        const std::string range = std::string(above ? "above " : "at least ") + limit(low) +
                                  " and at most " + limit(high);
        return "must be a number " + range + ", got '" + text + "'";
      },
      name);
}

// A ZeroMQ address to bind (transport::bind_address_problem), refused as the option is read.
inline CLI::Validator bind_address() {
  return CLI::Validator(
      [](std::string& text) { return transport::bind_address_problem(text); }, "ADDRESS");
}

// A whole number from 0 to 2^64-1 written in decimal digits (a seed): no sign, no wrap-around.
inline CLI::Validator unsigned_integer() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const std::string message = "must be a whole number from 0 to 18446744073709551615, got '" +
                                    text + "'";
        if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) return message;
        errno = 0;
        std::strtoull(text.c_str(), nullptr, 10);
        if (errno == ERANGE) return message;
        return {};
      },
      "UINT");
}

}  // namespace tandem::cli
