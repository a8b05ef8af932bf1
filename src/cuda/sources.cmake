# CUDA backend sources (owned by src/cuda).
file(GLOB SHORTCONV_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.cu ${CMAKE_CURRENT_LIST_DIR}/*.cpp)
target_sources(shortconv PRIVATE ${SHORTCONV_CUDA_SOURCES})
target_link_libraries(shortconv PRIVATE CUDA::cudart_static)
