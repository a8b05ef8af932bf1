/* The installed header compiles as C11 and links from C. */
#include <string.h>

#include "shortconv/shortconv.h"

int consumer_c_version_ok(void) {
  return sc_version() == SC_VERSION_MAJOR * 10000 + SC_VERSION_MINOR * 100 + SC_VERSION_PATCH &&
         strlen(sc_version_string()) > 0;
}
