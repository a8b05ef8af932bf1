# CPU backend sources (owned by src/cpu).
file(GLOB SHORTCONV_CPU_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.cpp)
target_sources(shortconv PRIVATE ${SHORTCONV_CPU_SOURCES})
