#include <gtest/gtest.h>
#include "shortconv/shortconv.h"
TEST(Smoke, Version) { EXPECT_EQ(sc_version(), 100); }
