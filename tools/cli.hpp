// Small helpers shared by the CLI subcommands: option parsing with clear
// errors for unknown options, backend names, JSON string escaping.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "shortconv/shortconv.h"

namespace shortconv::cli {

// Options of one subcommand: flags (no value) and valued options.
// parse() fills the maps; an unknown option or a missing value is an error.
struct Options {
  std::vector<std::string> flags;   // e.g. "--json"
  std::vector<std::string> valued;  // e.g. "--backend"
  std::map<std::string, std::string> values;
  std::map<std::string, bool> set;

  bool parse(int argc, char** argv, const char* cmd, std::string* err) {
    for (int i = 0; i < argc; ++i) {
      std::string a = argv[i], v;
      const size_t eq = a.find('=');
      bool has_eq = false;
      if (a.rfind("--", 0) == 0 && eq != std::string::npos) {
        v = a.substr(eq + 1);
        a = a.substr(0, eq);
        has_eq = true;
      }
      bool known = false;
      for (const auto& f : flags)
        if (a == f) {
          if (has_eq) {
            *err = "shortconv " + std::string(cmd) + ": option " + a + " takes no value";
            return false;
          }
          set[a] = true;
          known = true;
        }
      for (const auto& o : valued)
        if (a == o) {
          if (!has_eq) {
            if (i + 1 >= argc) {
              *err = "shortconv " + std::string(cmd) + ": option " + a + " needs a value";
              return false;
            }
            v = argv[++i];
          }
          values[a] = v;
          set[a] = true;
          known = true;
        }
      if (!known) {
        *err = "shortconv " + std::string(cmd) + ": unknown option '" + argv[i] +
               "' (see shortconv " + cmd + " --help)";
        return false;
      }
    }
    return true;
  }
  bool has(const std::string& o) const { return set.count(o) != 0; }
  std::string get(const std::string& o, const std::string& def) const {
    auto it = values.find(o);
    return it == values.end() ? def : it->second;
  }
};

// "cpu" | "cuda" | "ref" -> backend; false on an unknown name.
inline bool parse_backend(const std::string& s, sc_backend* b) {
  if (s == "cpu") *b = SC_BACKEND_CPU;
  else if (s == "cuda") *b = SC_BACKEND_CUDA;
  else if (s == "ref") *b = SC_BACKEND_REF;
  else return false;
  return true;
}

// A non-negative integer; false when s is not one.
inline bool parse_int(const std::string& s, int64_t* v) {
  if (s.empty()) return false;
  int64_t r = 0;
  for (char ch : s) {
    if (ch < '0' || ch > '9') return false;
    r = r * 10 + (ch - '0');
    if (r > (int64_t(1) << 40)) return false;
  }
  *v = r;
  return true;
}

// A JSON number (non-finite values become null).
inline std::string json_num(double v) {
  if (!(v == v) || v > 1e300 || v < -1e300) return "null";
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

inline std::string json_str(const std::string& s) {
  std::string r = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') r += '\\';
    r += ch;
  }
  return r + "\"";
}

int check_main(int argc, char** argv);  // check.cpp
int bench_main(int argc, char** argv);  // bench.cpp

}  // namespace shortconv::cli
