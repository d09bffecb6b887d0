// Small text helpers shared by the library's reports and the tools (shoal doctor, shoal-bench).
#pragma once
#include <string>

namespace shoal {

// `s` escaped for a JSON string (without the quotes): ", \, and control characters.
std::string json_escape(const std::string& s);
// The CPU's model name from /proc/cpuinfo ("unknown" where it has none).
std::string cpu_model();

}  // namespace shoal
