# CPU backend sources (owned by src/cpu).
file(GLOB SHORTCONV_CPU_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.cpp)
target_sources(shortconv PRIVATE ${SHORTCONV_CPU_SOURCES})
# GCC 12 warns about _mm512_undefined_* inside its own intrinsic headers.
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/cpu_isa.cpp PROPERTIES COMPILE_OPTIONS "-Wno-maybe-uninitialized")
# A micro-benchmark of this backend (not a test, not part of the library).
if(SHORTCONV_BUILD_CLI)
  add_executable(shortconv_cpu_bench ${CMAKE_CURRENT_LIST_DIR}/bench/cpu_bench.cpp)
  target_link_libraries(shortconv_cpu_bench PRIVATE shortconv OpenMP::OpenMP_CXX)
endif()
