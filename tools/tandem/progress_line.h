// A single status line redrawn in place on a terminal (stderr), silent when stderr is a file or
// pipe so logs stay clean. Redraws at most a few times a second.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace tandem::cli {

// 486123 -> "486.1k", 2.3e6 -> "2.30M": rates on a progress line.
// (The thresholds are where rounding carries into the next unit: 999,960 is "1.00M", not
// "1000.0k".)
inline std::string human(double x) {
  char text[32];
  if (x >= 999.95e3) std::snprintf(text, sizeof(text), "%.2fM", x / 1e6);
  else if (x >= 999.5) std::snprintf(text, sizeof(text), "%.1fk", x / 1e3);
  else std::snprintf(text, sizeof(text), "%.0f", x);
  return text;
}

class ProgressLine {
 public:
  ProgressLine() : enabled_(isatty(STDERR_FILENO) == 1) {}
  ~ProgressLine() { finish(); }

  void update(const std::string& text, bool force = false) {
    if (!enabled_) return;
    const auto now = std::chrono::steady_clock::now();
    if (!force && now - last_ < std::chrono::milliseconds(200)) return;
    last_ = now;
    std::fprintf(stderr, "\r\033[K%s", text.c_str());
    std::fflush(stderr);
    shown_ = true;
  }
  // Prints a permanent line (to stderr), replacing the status line on a terminal.
  void print_line(const std::string& text) {
    if (enabled_) std::fprintf(stderr, "\r\033[K");
    std::fprintf(stderr, "%s\n", text.c_str());
    shown_ = false;
  }
  // Takes the status line off the screen, for output of another stream (stdout) to start on a
  // line of its own; the next update() draws it again.
  void clear() {
    if (shown_) std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    shown_ = false;
  }
  // Leaves the last text on screen and moves to a new line.
  void finish() {
    if (shown_) std::fputc('\n', stderr);
    shown_ = false;
  }

 private:
  bool enabled_;
  bool shown_ = false;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace tandem::cli
