# Where the core's CUDA runtime comes from when no system toolkit is used. The core needs
# only the runtime's headers and its static library (its device code is PTX that the
# driver compiles, CMakeLists.txt), so two kinds of folder serve, both laid out as
# <root>/include (cuda_runtime_api.h, cuda.h, crt/) and <root>/lib (libcudart_static.a):
#
#  - GPUKEEPER_CUDA_RUNTIME_ROOT, a folder given explicitly. The binary wheels are built
#    this way, against a folder that scripts/cuda_runtime_tree.py assembles from NVIDIA's
#    pip wheels of the CUDA major release the wheel is for (12 or 13).
#  - The tree NVIDIA's pip wheels of CUDA 13 lay out in this build's Python environment,
#    <site-packages>/nvidia/cu13: nvidia-cuda-runtime (headers, libcudart_static) and
#    nvidia-cuda-crt (crt/ headers). GPUKEEPER_PIP_CUDA: AUTO (default) uses it only where
#    no toolkit is found otherwise (nvcc on PATH, /usr/local/cuda, CUDA_PATH or
#    CUDAToolkit_ROOT); ON prefers it; OFF never looks.
#
# Either way this module defines CUDA::cudart_static and CUDAToolkit_INCLUDE_DIRS itself
# (FindCUDAToolkit insists on nvcc or a version file, which these folders lack), and
# CMakeLists.txt then skips FindCUDAToolkit.
set(GPUKEEPER_CUDA_RUNTIME_ROOT "" CACHE PATH
    "A folder with the CUDA runtime's include/ and lib/libcudart_static.a to build against")
set(GPUKEEPER_PIP_CUDA AUTO CACHE STRING "Use the CUDA runtime of NVIDIA's pip wheels (AUTO, ON, OFF)")
set_property(CACHE GPUKEEPER_PIP_CUDA PROPERTY STRINGS AUTO ON OFF)

# The pip packages that make the tree, pinned to CUDA 13.0 so that the code they build
# runs on every CUDA 13 driver.
set(GPUKEEPER_PIP_CUDA_PACKAGES "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-crt==13.0.*")

# Sets <absent> to the pieces `root` lacks for a runtime tree ("" when complete), naming
# the pip wheel that brings each.
function(gpukeeper_runtime_tree_gaps root absent)
  set(gaps "")
  if(NOT EXISTS "${root}/include/cuda_runtime_api.h" OR NOT EXISTS "${root}/lib/libcudart_static.a")
    list(APPEND gaps "nvidia-cuda-runtime")
  endif()
  if(NOT EXISTS "${root}/include/crt/host_defines.h")
    list(APPEND gaps "nvidia-cuda-crt")
  endif()
  set(${absent} "${gaps}" PARENT_SCOPE)
endfunction()

# CUDA::cudart_static from the tree at `root`, as FindCUDAToolkit would define it.
macro(gpukeeper_use_runtime_tree root)
  add_library(CUDA::cudart_static STATIC IMPORTED GLOBAL)
  set_target_properties(CUDA::cudart_static PROPERTIES
    IMPORTED_LOCATION "${root}/lib/libcudart_static.a"
    INTERFACE_INCLUDE_DIRECTORIES "${root}/include"
    INTERFACE_LINK_LIBRARIES "pthread;dl;rt")
  set(CUDAToolkit_FOUND TRUE)
  set(CUDAToolkit_INCLUDE_DIRS "${root}/include")
  set(GPUKEEPER_CUDA_RUNTIME_TREE "${root}")
endmacro()

# Sets <out> to the pip tree's root when a complete one is installed for this build's
# Python, else to "" with <missing> naming the absent pieces.
function(gpukeeper_find_pip_cuda out missing)
  set(${out} "" PARENT_SCOPE)
  set(python "${Python_EXECUTABLE}")
  if(NOT python)
    find_package(Python 3.9 QUIET COMPONENTS Interpreter)
    set(python "${Python_EXECUTABLE}")
  endif()
  if(NOT python)
    set(${missing} "a Python interpreter to look in" PARENT_SCOPE)
    return()
  endif()
  # purelib of the interpreter's own environment: under pip's build isolation too, this
  # is the environment the user installs into, where the wheels went.
  execute_process(
    COMMAND "${python}" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    OUTPUT_VARIABLE purelib OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
  set(root "${purelib}/nvidia/cu13")
  gpukeeper_runtime_tree_gaps("${root}" absent)
  if(NOT rc EQUAL 0 AND NOT absent)
    set(absent "nvidia-cuda-runtime")
  endif()
  if(absent)
    set(${missing} "${absent}" PARENT_SCOPE)
  else()
    set(${out} "${root}" PARENT_SCOPE)
  endif()
endfunction()

# Whether a toolkit is found without the pip tree.
function(gpukeeper_system_cuda_found out)
  set(found FALSE)
  if(DEFINED CUDAToolkit_ROOT OR DEFINED ENV{CUDAToolkit_ROOT} OR DEFINED ENV{CUDA_PATH}
     OR DEFINED CMAKE_CUDA_COMPILER OR DEFINED ENV{CUDACXX})
    set(found TRUE)
  else()
    find_program(system_nvcc nvcc PATHS /usr/local/cuda/bin NO_CACHE)
    if(system_nvcc)
      set(found TRUE)
    endif()
  endif()
  set(${out} ${found} PARENT_SCOPE)
endfunction()

# The NVIDIA driver's library is present: this machine could run a CUDA core.
function(gpukeeper_driver_present out)
  find_library(driver_lib NAMES cuda libcuda.so.1 NO_CACHE)
  if(driver_lib OR EXISTS /dev/nvidia0)
    set(${out} TRUE PARENT_SCOPE)
  else()
    set(${out} FALSE PARENT_SCOPE)
  endif()
endfunction()

set(GPUKEEPER_CUDA_RUNTIME_TREE "")
if(GPUKEEPER_WITH_CUDA AND GPUKEEPER_CUDA_RUNTIME_ROOT)
  gpukeeper_runtime_tree_gaps("${GPUKEEPER_CUDA_RUNTIME_ROOT}" _gk_gaps)
  if(_gk_gaps)
    string(REPLACE ";" ", " _gk_gaps "${_gk_gaps}")
    message(FATAL_ERROR "gpukeeper: GPUKEEPER_CUDA_RUNTIME_ROOT=${GPUKEEPER_CUDA_RUNTIME_ROOT} is not "
      "a CUDA runtime tree: it lacks the files of ${_gk_gaps} (include/cuda_runtime_api.h, "
      "include/crt/host_defines.h, lib/libcudart_static.a). scripts/cuda_runtime_tree.py makes one.")
  endif()
  message(STATUS "gpukeeper: CUDA runtime from ${GPUKEEPER_CUDA_RUNTIME_ROOT}")
  gpukeeper_use_runtime_tree("${GPUKEEPER_CUDA_RUNTIME_ROOT}")
elseif(GPUKEEPER_WITH_CUDA AND NOT GPUKEEPER_PIP_CUDA STREQUAL "OFF")
  gpukeeper_system_cuda_found(_gk_system_cuda)
  if(GPUKEEPER_PIP_CUDA STREQUAL "ON" OR NOT _gk_system_cuda)
    gpukeeper_find_pip_cuda(_gk_pip_root _gk_pip_missing)
    if(_gk_pip_root)
      message(STATUS "gpukeeper: CUDA runtime from NVIDIA's pip wheels at ${_gk_pip_root}")
      gpukeeper_use_runtime_tree("${_gk_pip_root}")
    else()
      string(REPLACE ";" "\" \"" _gk_pkgs "${GPUKEEPER_PIP_CUDA_PACKAGES}")
      string(REPLACE ";" ", " _gk_pip_missing "${_gk_pip_missing}")
      set(_gk_install "pip install \"${_gk_pkgs}\"")
      if(GPUKEEPER_PIP_CUDA STREQUAL "ON")
        message(FATAL_ERROR "gpukeeper: GPUKEEPER_PIP_CUDA=ON, but the pip runtime lacks "
          "${_gk_pip_missing}. Install it into this environment:\n  ${_gk_install}")
      endif()
      gpukeeper_driver_present(_gk_driver)
      if(_gk_driver)
        message(WARNING "gpukeeper: this machine has an NVIDIA driver but no CUDA runtime to build "
          "against: the core built now is CPU-only and will not use the GPU. Install the binary "
          "wheel, or CUDA's runtime from pip into this environment and build again:\n  "
          "${_gk_install}\n(missing now: ${_gk_pip_missing}), or install CUDA's toolkit.")
      endif()
    endif()
  endif()
endif()
