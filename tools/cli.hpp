// Small helpers shared by the CLI subcommands: option parsing with clear
// errors for unknown options, backends by the library's names, JSON output.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "harness/harness.hpp"
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

// Parses argv into opt.  Returns -1 to go on, or the exit status: 2 after a
// usage error (message on stderr), 0 after --help / -h (usage on stdout).
inline int parse_command_line(Options& opt, int argc, char** argv, const char* cmd,
                              void (*usage)(FILE*)) {
  std::string err;
  if (!opt.parse(argc, argv, cmd, &err)) {
    std::fprintf(stderr, "%s\n", err.c_str());
    return 2;
  }
  if (opt.has("--help") || opt.has("-h")) {
    usage(stdout);
    return 0;
  }
  return -1;
}

// ---- backends: the library's names (sc_backend_name), nothing of our own ----

// The names of every backend the library knows, compiled in or not, joined
// by `sep` and, before the last, by `last`: "cpu, cuda or ref".
inline std::string backend_names(const char* sep, const char* last) {
  std::vector<std::string> names;
  for (int32_t id = 0; const char* name = sc_backend_name(id); ++id) names.push_back(name);
  std::string s;
  for (size_t i = 0; i < names.size(); ++i)
    s += (i == 0 ? "" : i + 1 == names.size() ? last : sep) + names[i];
  return s;
}

// The backend the library calls `name`; false when it knows no such name.
inline bool parse_backend(const std::string& name, sc_backend* b) {
  for (int32_t id = 0; const char* n = sc_backend_name(id); ++id)
    if (name == n) {
      *b = sc_backend(id);
      return true;
    }
  return false;
}

// --backend (default: the ABI's default, the CPU backend): -1 to go on, or
// exit status 2 with the message on stderr when the name is not a backend.
inline int backend_option(const Options& opt, const char* cmd, sc_backend* b, std::string* name) {
  *name = opt.get("--backend", sc_backend_name(SC_BACKEND_CPU));
  if (parse_backend(*name, b)) return -1;
  std::fprintf(stderr, "shortconv %s: --backend: expected %s, got '%s'\n", cmd,
               backend_names(", ", " or ").c_str(), name->c_str());
  return 2;
}

// A backend this build and machine can run: -1 to go on, or exit status 1
// with the reason on stderr (not compiled in; no device for a device backend).
inline int require_backend(sc_backend b, const std::string& name, const char* cmd) {
  if (!sc_has_backend(b)) {
    std::fprintf(stderr, "shortconv %s: the %s backend is not compiled into this build\n", cmd,
                 name.c_str());
    return 1;
  }
  if (!harness::usable(b)) {
    std::fprintf(stderr, "shortconv %s: --backend %s: no CUDA device is present\n", cmd,
                 name.c_str());
    return 1;
  }
  return -1;
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
