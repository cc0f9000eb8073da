// A batch-size schedule (forgec --batch-schedule, build option "batch_schedule"):
// how many samples a rank takes per optimizer step, by step. The text form is
// "S1:N1,S2:N2,...,Sn": S1 samples for steps 1..N1, S2 for steps N1+1..N2, ...,
// Sn for every later step (steps are 1-based and global, counted as forge.step).
// Each S is a multiple of the bundle's batch (the micro-batch), and a step takes
// S / batch micro-batches of the accumulation loop. forgec checks the text with
// parse() and stores it unchanged; the trainer parses it again.
//
// Invariants of a parsed schedule: at least one stage; every size >= 1; the
// last steps strictly increase; the last stage has no last step (INT64_MAX).
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace forge::rt {

struct BatchSchedule {
  struct Stage {
    int64_t samples = 0;
    int64_t lastStep = std::numeric_limits<int64_t>::max();
  };
  std::vector<Stage> stages;

  bool empty() const { return stages.empty(); }
  /// Samples of (1-based) `step`.
  int64_t samplesAt(int64_t step) const {
    for (const Stage &s : stages)
      if (step <= s.lastStep)
        return s.samples;
    return stages.empty() ? 0 : stages.back().samples;
  }
  int64_t maxSamples() const {
    int64_t m = 0;
    for (const Stage &s : stages)
      m = std::max(m, s.samples);
    return m;
  }

  /// Parses the text form; on failure returns false and says why in `error`.
  static bool parse(std::string_view text, BatchSchedule &out, std::string &error) {
    out.stages.clear();
    auto number = [&](std::string_view s, int64_t &v, const char *what) {
      auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      if (s.empty() || ec != std::errc() || end != s.data() + s.size() || v < 1) {
        error = "bad " + std::string(what) + " '" + std::string(s) + "' in '" +
                std::string(text) + "' (a positive integer)";
        return false;
      }
      return true;
    };
    size_t at = 0;
    while (at <= text.size()) {
      size_t comma = text.find(',', at);
      std::string_view part =
          text.substr(at, comma == std::string_view::npos ? std::string_view::npos : comma - at);
      Stage s;
      size_t colon = part.find(':');
      if (!number(part.substr(0, colon), s.samples, "batch size"))
        return false;
      if (colon != std::string_view::npos) {
        if (!number(part.substr(colon + 1), s.lastStep, "step"))
          return false;
        if (!out.stages.empty() && s.lastStep <= out.stages.back().lastStep) {
          error = "the steps of '" + std::string(text) + "' must increase";
          return false;
        }
      }
      if (!out.stages.empty() &&
          out.stages.back().lastStep == std::numeric_limits<int64_t>::max()) {
        error = "in '" + std::string(text) + "' only the last batch size has no step";
        return false;
      }
      out.stages.push_back(s);
      if (comma == std::string_view::npos)
        break;
      at = comma + 1;
    }
    if (out.stages.back().lastStep != std::numeric_limits<int64_t>::max()) {
      error = "the last batch size of '" + std::string(text) +
              "' has a step; it is the size from then on (e.g. 64:1000,256)";
      return false;
    }
    return true;
  }
};

} // namespace forge::rt
