# CPU backend sources (owned by src/cpu).
file(GLOB SHORTCONV_CPU_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.cpp)
# The per-ISA kernel units: GCC 12 warns about _mm512_undefined_* inside its
# own intrinsic headers.  Under the sanitizers they build at -O1: at -O2 the
# instrumented inlining of a few hundred kernel instances takes many minutes.
file(GLOB SHORTCONV_CPU_ISA_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/cpu_isa_*.cpp)
# Without the AVX-512 unit the widest x86 table is AVX2 (for compilers without
# AVX-512 support, and for builds that will only ever run on machines without
# it: the sanitizer build of scripts/sanitize.sh on such a machine).
option(SHORTCONV_CPU_AVX512 "Build the CPU backend's AVX-512 kernels (x86)" ON)
if(NOT SHORTCONV_CPU_AVX512)
  list(FILTER SHORTCONV_CPU_SOURCES EXCLUDE REGEX "cpu_isa_avx512\\.cpp$")
  list(FILTER SHORTCONV_CPU_ISA_SOURCES EXCLUDE REGEX "cpu_isa_avx512\\.cpp$")
endif()
target_compile_definitions(shortconv PRIVATE SC_WITH_AVX512=$<BOOL:${SHORTCONV_CPU_AVX512}>)
target_sources(shortconv PRIVATE ${SHORTCONV_CPU_SOURCES})
# -Wno-psabi: the activation policies (core/activation.hpp) take SIMD vectors
# and are defined outside the units' target regions; they are always inlined,
# so no call crosses the ABI the warning is about.
set(SHORTCONV_CPU_ISA_OPTIONS -Wno-maybe-uninitialized -Wno-uninitialized -Wno-psabi)
# GCC's default -ffp-contract=fast would fuse a*b+c where it sees fit,
# differently in differently inlined copies of a kernel (x86: inside the
# units' FMA target regions): results must not depend on the tiling or on
# which kernel family (channel- or time-vectorised) computes an element
# (docs/semantics.md section 6), so fusion happens only where the code asks
# for it (OpsF::fma, OpsD::fma).
target_compile_options(shortconv PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-ffp-contract=off>)
if(SHORTCONV_SANITIZE)
  # ASan's checks as calls (__asan_load4 ...) rather than inline: the same checks,
  # much less code in the kernels' huge instrumented functions (this machine:
  # 211 s -> 132 s of compile for the 128-bit unit, 219 s -> 139 s for AVX2; the
  # fuzzer ran 5-10% more iterations per second, the suite as fast).
  list(APPEND SHORTCONV_CPU_ISA_OPTIONS -O1 --param=asan-instrumentation-with-call-threshold=0)
endif()
set_source_files_properties(${SHORTCONV_CPU_ISA_SOURCES} PROPERTIES COMPILE_OPTIONS "${SHORTCONV_CPU_ISA_OPTIONS}")
# A micro-benchmark of this backend (not a test, not part of the library).
if(SHORTCONV_BUILD_CLI)
  add_executable(shortconv_cpu_bench ${CMAKE_CURRENT_LIST_DIR}/bench/cpu_bench.cpp)
  target_link_libraries(shortconv_cpu_bench PRIVATE shortconv OpenMP::OpenMP_CXX)
  # Instruction counts under callgrind (one thread, a fixed small problem).
  add_executable(shortconv_cpu_probe ${CMAKE_CURRENT_LIST_DIR}/bench/cpu_probe.cpp)
  target_link_libraries(shortconv_cpu_probe PRIVATE shortconv)
endif()
