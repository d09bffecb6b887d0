// Key lists in store errors: "'a', 'b', ... (n more)", at most eight keys shown.
#pragma once
#include <string>
#include <vector>

namespace shoal {

inline std::string quote_keys(const std::vector<std::string>& keys) {
  std::string s;
  size_t shown = 0;
  for (auto& k : keys) {
    if (shown == 8) {
      s += ", ... (" + std::to_string(keys.size() - shown) + " more)";
      break;
    }
    if (shown++) s += ", ";
    s += "'" + k + "'";
  }
  return s;
}

}  // namespace shoal
