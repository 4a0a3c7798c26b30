# The PyTorch allocator component (csrc/torch_ext): gpukeeper's pools as a CUDAAllocator.
# PyTorch's allocator interface is not part of its stable ABI, so there is one build per
# PyTorch release (major.minor), named by it: gpukeeper/torch_components/
# libgpukeeper_torch_2_11.so for 2.11 (python/gpukeeper/integrations/torch_builds.py), and
# Python loads only the build for the imported release. Builds come from two places:
#
#  - GPUKEEPER_TORCH_HEADERS: header folders made by scripts/torch_headers.py (the headers
#    of a release's wheel and its facts: version, C++ ABI, library SONAMEs), or folders of
#    such folders. Nothing of PyTorch needs to be installed: the component links against
#    empty stand-ins that carry the SONAMEs of PyTorch's libraries, so its DT_NEEDED
#    entries name them and its symbols bind, when it is loaded, to the libraries
#    `import torch` already loaded (the CUDA runtime's too, through libtorch_cuda.so's
#    own dependencies). The binary wheel is built this way (scripts/build-wheel.sh).
#  - the PyTorch importable by this build's Python, when it is a CUDA build
#    (GPUKEEPER_TORCH_COMPONENT=AUTO|ON|OFF): a source install beside PyTorch builds the
#    component for that release, linked against its real libraries.
#
# Without either (or with GPUKEEPER_TORCH_COMPONENT=OFF) no build is made, and Python
# builds one at first use where it can (torch_component.build) or falls back to PyTorch's
# pluggable-allocator interface and says what that lacks.
set(GPUKEEPER_TORCH_COMPONENT "AUTO" CACHE STRING
    "Build the PyTorch allocator component for the importable PyTorch: AUTO (when it is a CUDA build), ON (required) or OFF")
set(GPUKEEPER_TORCH_HEADERS "" CACHE STRING
    "Header folders of PyTorch releases (scripts/torch_headers.py), or folders of them: a component is built for each")

set(_gk_torch_sources
  csrc/torch_ext/allocator.cpp
  csrc/torch_ext/history.cpp
  csrc/torch_ext/install.cpp
  csrc/torch_ext/ipc.cpp
  csrc/torch_ext/stream_uses.cpp)
add_custom_target(gpukeeper_torch_components)
set(GPUKEEPER_TORCH_RELEASES "")

# One build: for `release` (2.11), against `includes`, linking `libraries`, looking for
# PyTorch's libraries at run time in the torch package beside gpukeeper, then `rpath`.
function(gpukeeper_torch_component release version abi includes libraries rpath)
  string(REPLACE "." "_" tag "${release}")
  set(target gpukeeper_torch_${tag})
  add_library(${target} MODULE ${_gk_torch_sources})
  target_include_directories(${target} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/csrc)
  target_include_directories(${target} SYSTEM PRIVATE ${includes} ${CUDAToolkit_INCLUDE_DIRS})
  target_compile_definitions(${target} PRIVATE _GLIBCXX_USE_CXX11_ABI=${abi})
  # 2.14's headers need C++20 (std::strong_ordering); the rule is torch_builds.cxx_standard's.
  if(release VERSION_GREATER_EQUAL 2.14)
    target_compile_features(${target} PRIVATE cxx_std_20)
  else()
    target_compile_features(${target} PRIVATE cxx_std_17)
  endif()
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE -Wall -Wextra)
  endif()
  # --no-as-needed: the stand-ins define no symbol, and a linker that drops unused
  # libraries (Ubuntu's default) would otherwise drop the DT_NEEDED entries the symbols
  # are found through.
  target_link_libraries(${target} PRIVATE "-Wl,--no-as-needed" ${libraries})
  # As for _core: a toolchain that links parts of its C++ runtime statically must keep them
  # to the component. Exported, they met PyTorch's libstdc++ in the same process, and a
  # message that formats a number crashed in locale code.
  if(CMAKE_SYSTEM_NAME STREQUAL "Linux")
    target_link_options(${target} PRIVATE "LINKER:--exclude-libs,ALL")
  endif()
  # Installed as gpukeeper/torch_components/<file>: torch is site-packages/torch.
  set_target_properties(${target} PROPERTIES
    PREFIX "lib" OUTPUT_NAME "gpukeeper_torch_${tag}"
    LIBRARY_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/torch_components"
    INSTALL_RPATH "$ORIGIN/../../torch/lib;${rpath}")
  if(rpath)
    set_target_properties(${target} PROPERTIES BUILD_RPATH "${rpath}")
  else()
    # Built against stand-ins: the file built is the file installed, with no path of
    # this machine in it (CMake would add the stand-ins' folder to a build RPATH).
    set_target_properties(${target} PROPERTIES BUILD_WITH_INSTALL_RPATH ON)
  endif()
  install(TARGETS ${target} LIBRARY DESTINATION gpukeeper/torch_components)
  add_dependencies(gpukeeper_torch_components ${target})
  message(STATUS "gpukeeper: PyTorch allocator component for torch ${release} (headers of ${version})")
endfunction()

# Empty shared libraries named as PyTorch's, in `dir`, for `sonames`; sets `out` to them.
function(gpukeeper_torch_stand_ins dir sonames out)
  file(MAKE_DIRECTORY "${dir}")
  file(WRITE "${dir}/empty.cpp" "// Stands in for a PyTorch library at link time: it only carries the SONAME.\n")
  set(libs "")
  foreach(soname IN LISTS sonames)
    if(NOT EXISTS "${dir}/${soname}")
      execute_process(
        COMMAND "${CMAKE_CXX_COMPILER}" -shared -fPIC -o "${dir}/${soname}" "-Wl,-soname,${soname}" "${dir}/empty.cpp"
        RESULT_VARIABLE rc ERROR_VARIABLE err)
      if(NOT rc EQUAL 0)
        message(FATAL_ERROR "gpukeeper: could not make the link stand-in ${soname}: ${err}")
      endif()
    endif()
    list(APPEND libs "${dir}/${soname}")
  endforeach()
  set(${out} "${libs}" PARENT_SCOPE)
endfunction()

# ---------------------------------------------------------------- the importable PyTorch

set(_gk_torch_found OFF)
if(NOT Python_EXECUTABLE)
  set(_gk_torch_why "no Python to import PyTorch with (GPUKEEPER_BUILD_PYTHON=OFF)")
elseif(NOT GPUKEEPER_TORCH_COMPONENT STREQUAL "OFF" AND GPUKEEPER_CUDA)
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
  string(REGEX MATCH "^[0-9]+\\.[0-9]+" _gk_release "${GPUKEEPER_TORCH_VERSION}")
  gpukeeper_torch_component("${_gk_release}" "${GPUKEEPER_TORCH_VERSION} (CUDA ${_gk_torch_cuda}, installed)"
    "${_gk_torch_abi}" "${_gk_torch_includes}"
    "${_gk_torch_lib}/libc10.so;${_gk_torch_lib}/libc10_cuda.so;${_gk_torch_lib}/libtorch_cuda.so"
    "${_gk_torch_lib}")
  list(APPEND GPUKEEPER_TORCH_RELEASES "${_gk_release}")
elseif(GPUKEEPER_TORCH_COMPONENT STREQUAL "ON")
  message(FATAL_ERROR "gpukeeper: the PyTorch allocator component was required, but ${_gk_torch_why}")
elseif(NOT GPUKEEPER_TORCH_HEADERS)
  message(STATUS "gpukeeper: PyTorch allocator component for the installed PyTorch skipped: ${_gk_torch_why}")
endif()

# ---------------------------------------------------------------- header folders

if(GPUKEEPER_TORCH_HEADERS)
  if(NOT GPUKEEPER_CUDA)
    message(FATAL_ERROR "gpukeeper: GPUKEEPER_TORCH_HEADERS needs a CUDA build (the component includes the CUDA runtime's headers)")
  endif()
  set(_gk_folders "")
  foreach(_gk_entry IN LISTS GPUKEEPER_TORCH_HEADERS)
    if(EXISTS "${_gk_entry}/facts.txt")
      list(APPEND _gk_folders "${_gk_entry}")
    else()
      file(GLOB _gk_inner LIST_DIRECTORIES true "${_gk_entry}/*/facts.txt")
      if(NOT _gk_inner)
        message(FATAL_ERROR "gpukeeper: GPUKEEPER_TORCH_HEADERS: ${_gk_entry} holds no header folder (scripts/torch_headers.py makes them)")
      endif()
      foreach(_gk_facts IN LISTS _gk_inner)
        get_filename_component(_gk_dir "${_gk_facts}" DIRECTORY)
        list(APPEND _gk_folders "${_gk_dir}")
      endforeach()
    endif()
  endforeach()
  foreach(_gk_dir IN LISTS _gk_folders)
    file(STRINGS "${_gk_dir}/facts.txt" _gk_facts REGEX "^[a-z0-9_]+=")
    foreach(_gk_line IN LISTS _gk_facts)
      if(_gk_line MATCHES "^([a-z0-9_]+)=(.*)$")
        set(_gk_fact_${CMAKE_MATCH_1} "${CMAKE_MATCH_2}")
      endif()
    endforeach()
    string(REPLACE "," ";" _gk_sonames "${_gk_fact_sonames}")
    if(_gk_fact_release IN_LIST GPUKEEPER_TORCH_RELEASES)
      message(STATUS "gpukeeper: torch ${_gk_fact_release} has a build already; ${_gk_dir} left out")
      continue()
    endif()
    gpukeeper_torch_stand_ins("${CMAKE_BINARY_DIR}/torch_stand_ins/${_gk_fact_release}" "${_gk_sonames}" _gk_libs)
    gpukeeper_torch_component("${_gk_fact_release}" "${_gk_fact_version}" "${_gk_fact_cxx11_abi}"
      "${_gk_dir}/include;${_gk_dir}/include/torch/csrc/api/include;${_gk_dir}/extra" "${_gk_libs}" "")
    list(APPEND GPUKEEPER_TORCH_RELEASES "${_gk_fact_release}")
  endforeach()
endif()

# The component's sources go into the package too, so that gpukeeper can build it at
# first use for a PyTorch release it carries no build for (torch_component.build).
install(DIRECTORY csrc/torch_ext DESTINATION gpukeeper/torch_components/src FILES_MATCHING PATTERN "*.?pp")
install(FILES csrc/gpukeeper/memory/pool_history.hpp DESTINATION gpukeeper/torch_components/src/gpukeeper/memory)
install(FILES csrc/gpukeeper/core/stream.hpp csrc/gpukeeper/core/text.hpp
        DESTINATION gpukeeper/torch_components/src/gpukeeper/core)
