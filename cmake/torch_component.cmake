# The PyTorch allocator component (csrc/torch_ext): gpukeeper's pools as a CUDAAllocator,
# built against the headers and libraries of the PyTorch installed where gpukeeper is
# built. PyTorch stays optional: without a CUDA build of it (or with
# GPUKEEPER_TORCH_COMPONENT=OFF) the component is skipped, and use_torch_allocator()
# falls back to PyTorch's pluggable-allocator interface and says what that lacks.
set(GPUKEEPER_TORCH_COMPONENT "AUTO" CACHE STRING
    "Build the PyTorch allocator component: AUTO (when a CUDA build of PyTorch is importable), ON (required) or OFF")

set(_gk_torch_found OFF)
if(NOT GPUKEEPER_TORCH_COMPONENT STREQUAL "OFF" AND GPUKEEPER_CUDA)
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import os, torch\nfrom torch.utils import cpp_extension as c\nprint(torch.__version__)\nprint(torch.version.cuda or '')\nprint(int(torch._C._GLIBCXX_USE_CXX11_ABI))\nprint(','.join(c.include_paths()))\nprint(os.path.join(os.path.dirname(torch.__file__), 'lib'))"
    OUTPUT_VARIABLE _gk_torch_out
    ERROR_VARIABLE _gk_torch_err
    RESULT_VARIABLE _gk_torch_rc
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(_gk_torch_rc EQUAL 0)
    string(REPLACE "\n" ";" _gk_torch_lines "${_gk_torch_out}")
    list(LENGTH _gk_torch_lines _gk_n)
    if(_gk_n EQUAL 5)
      list(GET _gk_torch_lines 0 GPUKEEPER_TORCH_VERSION)
      list(GET _gk_torch_lines 1 _gk_torch_cuda)
      list(GET _gk_torch_lines 2 _gk_torch_abi)
      list(GET _gk_torch_lines 3 _gk_torch_includes)
      list(GET _gk_torch_lines 4 _gk_torch_lib)
      string(REPLACE "," ";" _gk_torch_includes "${_gk_torch_includes}")
      if(_gk_torch_cuda AND EXISTS "${_gk_torch_lib}/libc10_cuda.so" AND EXISTS "${_gk_torch_lib}/libtorch_cuda.so")
        set(_gk_torch_found ON)
      else()
        set(_gk_torch_why "PyTorch ${GPUKEEPER_TORCH_VERSION} is not a CUDA build")
      endif()
    else()
      set(_gk_torch_why "could not read PyTorch's build settings")
    endif()
  else()
    set(_gk_torch_why "PyTorch is not importable by ${Python_EXECUTABLE}")
  endif()
elseif(NOT GPUKEEPER_CUDA)
  set(_gk_torch_why "gpukeeper is built without CUDA")
else()
  set(_gk_torch_why "GPUKEEPER_TORCH_COMPONENT=OFF")
endif()

if(_gk_torch_found)
  message(STATUS "gpukeeper: PyTorch allocator component for torch ${GPUKEEPER_TORCH_VERSION} (CUDA ${_gk_torch_cuda})")
  add_library(gpukeeper_torch MODULE
    csrc/torch_ext/allocator.cpp
    csrc/torch_ext/history.cpp
    csrc/torch_ext/install.cpp
    csrc/torch_ext/ipc.cpp
    csrc/torch_ext/stream_uses.cpp)
  target_include_directories(gpukeeper_torch PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/csrc)
  target_include_directories(gpukeeper_torch SYSTEM PRIVATE ${_gk_torch_includes} ${CUDAToolkit_INCLUDE_DIRS})
  target_compile_definitions(gpukeeper_torch PRIVATE _GLIBCXX_USE_CXX11_ABI=${_gk_torch_abi})
  target_compile_features(gpukeeper_torch PRIVATE cxx_std_17)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(gpukeeper_torch PRIVATE -Wall -Wextra)
  endif()
  # PyTorch's own libraries, found beside gpukeeper in site-packages at run time (and
  # where they were at build time); the CUDA runtime comes with them.
  target_link_libraries(gpukeeper_torch PRIVATE
    "${_gk_torch_lib}/libc10.so" "${_gk_torch_lib}/libc10_cuda.so" "${_gk_torch_lib}/libtorch_cuda.so")
  set_target_properties(gpukeeper_torch PROPERTIES
    PREFIX "lib" OUTPUT_NAME "gpukeeper_torch"
    BUILD_RPATH "${_gk_torch_lib}"
    INSTALL_RPATH "$ORIGIN/../torch/lib;${_gk_torch_lib}")
  install(TARGETS gpukeeper_torch LIBRARY DESTINATION gpukeeper)
elseif(GPUKEEPER_TORCH_COMPONENT STREQUAL "ON")
  message(FATAL_ERROR "gpukeeper: the PyTorch allocator component was required, but ${_gk_torch_why}")
else()
  message(STATUS "gpukeeper: PyTorch allocator component skipped: ${_gk_torch_why}")
endif()
