// Every SHOAL_* environment variable shoal reads, in one table (name, meaning, default), and the
// one way to read them: a reader takes a registered name, returns nothing when the variable is
// unset or empty, and throws InvalidArgument naming the variable, its value and what is expected
// when the value is not one. README.md's configuration table is this table (`shoal-run
// --settings` prints it; tests/test_params.cpp checks the README has it).
#pragma once
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

namespace shoal::params {

enum class Kind { text, choice, integer, bytes, seconds, flag };

struct Param {
  const char* name;
  Kind kind;
  double lo, hi;        // integer, bytes, seconds: the values taken
  const char* choices;  // choice: the values taken, comma-separated
  const char* meaning;  // markdown
  const char* fallback;  // what applies when unset (markdown)
};

// The table, in the README's order.
const std::vector<Param>& all();

// Each reader takes a registered name of its kind (else Error: a bug in shoal) and returns its
// value if set and not empty, within the table's bounds.
std::optional<std::string> text(const char* name);
std::optional<std::string> choice(const char* name);
std::optional<long long> integer(const char* name);
std::optional<uint64_t> bytes(const char* name);  // digits with an optional K, M or G (KiB, MiB, GiB)
std::optional<double> seconds(const char* name);  // a decimal number
std::optional<bool> flag(const char* name);       // 0/1, false/true, no/yes
// "" if `p` is unset or holds a value it takes, else the error its reader throws.
std::string check(const Param& p);

// The README's configuration table: a header and one row per variable.
std::string markdown_table();
// `p`'s value as a report may show it: nothing if unset or empty, "(set)" for a secret.
std::optional<std::string> shown(const Param& p);
// The registered variables set in this process's environment, "NAME=value" each (as shown()).
std::vector<std::string> set_in_environment();
// SHOAL_* variables set here that are not shoal's but within two edits of one of its names,
// each with that name ("SHOAL_TIMOUT (did you mean SHOAL_TIMEOUT?)"): probable typos.
std::vector<std::string> probable_typos();

}  // namespace shoal::params
