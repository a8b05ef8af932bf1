# cmake -P script run by the install_consumer test (see CMakeLists.txt).
# Inputs: BUILD_DIR CONFIG PREFIX CONSUMER_SRC CONSUMER_BUILD GENERATOR
#         C_COMPILER CXX_COMPILER SANITIZE
function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install test: ${what} failed (${rc}):\n${out}")
  endif()
  message(STATUS "install test: ${what}: ok")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${PREFIX}" "${CONSUMER_BUILD}")
if(NOT CONFIG)
  set(CONFIG Release)
endif()

step("cmake --install" ${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${PREFIX}" --config ${CONFIG})
foreach(f include/shortconv/shortconv.h include/shortconv/shortconv.hpp)
  if(NOT EXISTS "${PREFIX}/${f}")
    message(FATAL_ERROR "install test: ${PREFIX}/${f} was not installed")
  endif()
endforeach()
file(GLOB_RECURSE config_files "${PREFIX}/*/shortconvConfig.cmake")
if(NOT config_files)
  message(FATAL_ERROR "install test: no shortconvConfig.cmake under ${PREFIX}")
endif()

set(flags "")
if(SANITIZE)  # an ASan-built library needs an ASan-built executable
  set(flags "-fsanitize=address,undefined")
endif()
step("configure consumer" ${CMAKE_COMMAND} -S "${CONSUMER_SRC}" -B "${CONSUMER_BUILD}" -G "${GENERATOR}"
  -DCMAKE_BUILD_TYPE=${CONFIG}
  -DCMAKE_C_COMPILER=${C_COMPILER} -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
  "-DCMAKE_C_FLAGS=${flags}" "-DCMAKE_CXX_FLAGS=${flags}"
  -DCMAKE_PREFIX_PATH=${PREFIX}
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
  -DSHORTCONV_EXPECTED_PREFIX=${PREFIX})
step("build consumer" ${CMAKE_COMMAND} --build "${CONSUMER_BUILD}" --config ${CONFIG})
file(GLOB_RECURSE exe "${CONSUMER_BUILD}/shortconv_consumer" "${CONSUMER_BUILD}/shortconv_consumer.exe")
if(NOT exe)
  message(FATAL_ERROR "install test: consumer executable not found in ${CONSUMER_BUILD}")
endif()
list(GET exe 0 exe)
step("run consumer" "${exe}")
message(STATUS "${step_output}")
