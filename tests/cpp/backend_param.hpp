// Test suites parametrised over backends: one fixture that skips the CUDA
// backend where it is not compiled in or no device is present, and gtest
// parameter names from the library's backend names.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "harness/harness.hpp"

namespace shortconv::harness {

class BackendTest : public ::testing::TestWithParam<sc_backend> {
 protected:
  void SetUp() override {
    if (GetParam() == SC_BACKEND_CUDA &&
        !(sc_has_backend(SC_BACKEND_CUDA) && cuda_device_present()))
      GTEST_SKIP() << "no CUDA backend compiled in or no CUDA device present";
  }
};

inline std::string backend_param_name(const ::testing::TestParamInfo<sc_backend>& info) {
  return backend_name(info.param);
}

}  // namespace shortconv::harness
