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

struct Param {
  const char* name;
  const char* meaning;  // markdown
  const char* fallback;  // what applies when unset (markdown)
};

// The table, in the README's order.
const std::vector<Param>& all();

// The raw value of a registered variable, if set and not empty. An unregistered name is a bug in
// shoal (Error).
std::optional<std::string> text(const char* name);
// One of `allowed`.
std::optional<std::string> choice(const char* name, std::initializer_list<const char*> allowed);
// An integer in [lo, hi].
std::optional<long long> integer(const char* name, long long lo, long long hi);
// Bytes in [lo, hi]: digits with an optional K, M or G (KiB, MiB, GiB).
std::optional<uint64_t> bytes(const char* name, uint64_t lo, uint64_t hi);
// Seconds in [lo, hi] (a decimal number).
std::optional<double> seconds(const char* name, double lo, double hi);
// 0/1, false/true, no/yes.
std::optional<bool> flag(const char* name);

// The README's configuration table: a header and one row per variable.
std::string markdown_table();
// The registered variables set in this process's environment, "NAME=value" each.
std::vector<std::string> set_in_environment();
// SHOAL_* variables set here that are not shoal's but within two edits of one of its names,
// each with that name ("SHOAL_TIMOUT (did you mean SHOAL_TIMEOUT?)"): probable typos.
std::vector<std::string> probable_typos();

}  // namespace shoal::params
