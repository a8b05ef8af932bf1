// shortconv — the command-line tool.
//   shortconv check  the exactness suite (chunked == whole, against the oracle)
//   shortconv bench  timings against the memory-copy floor
#include <cstdio>
#include <cstring>
#include <string>

#include "cli.hpp"
#include "shortconv/shortconv.h"

namespace {

// " cpu ref": the library's names of the backends compiled into this build.
std::string compiled_backends() {
  std::string s;
  for (int32_t id = 0; const char* name = sc_backend_name(id); ++id)
    if (sc_has_backend(id)) s += std::string(" ") + name;
  return s;
}

void usage(FILE* f) {
  std::fprintf(f,
               "shortconv %s — short causal depthwise convolution, forward and backward\n"
               "\n"
               "usage: shortconv <command> [options]\n"
               "\n"
               "commands:\n"
               "  check   exactness suite: chunked vs whole gradients and forward, every forced\n"
               "          time tile, packed short segments, errors against the float64 oracle\n"
               "  bench   forward and forward+backward timings against the copy-bandwidth floor\n"
               "\n"
               "  shortconv <command> --help   options of a command\n"
               "  shortconv --version          print the version\n"
               "\n"
               "backends compiled in:%s\n",
               sc_version_string(), compiled_backends().c_str());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    usage(stdout);
    return 0;
  }
  if (cmd == "--version" || cmd == "version") {
    std::printf("shortconv %s\n", sc_version_string());
    return 0;
  }
  if (cmd == "check") return shortconv::cli::check_main(argc - 2, argv + 2);
  if (cmd == "bench") return shortconv::cli::bench_main(argc - 2, argv + 2);
  std::fprintf(stderr, "shortconv: unknown command '%s' (expected check or bench; see shortconv --help)\n",
               cmd.c_str());
  return 2;
}
