// TEMPORARY placeholder for the shortconv CLI.
#include <cstdio>
#include "shortconv/shortconv.h"
int main() { std::printf("shortconv %s\n", sc_version_string()); return 0; }
