# The CUDA toolkit NVIDIA publishes as pip wheels, for machines that have a driver and
# pip's PyTorch but no system toolkit. The wheels nvidia-cuda-runtime (headers and
# libcudart_static), nvidia-cuda-crt, nvidia-cuda-cccl, nvidia-cuda-nvcc and nvidia-nvvm
# unpack into one tree, <site-packages>/nvidia/cu13, laid out as a toolkit (bin/nvcc, include, lib,
# nvvm), which FindCUDAToolkit accepts as CUDAToolkit_ROOT.
#
# GPUKEEPER_PIP_CUDA: AUTO (default) uses that tree only where no toolkit is found
# otherwise (nvcc on PATH, /usr/local/cuda, CUDA_PATH or CUDAToolkit_ROOT); ON prefers it;
# OFF never looks.
set(GPUKEEPER_PIP_CUDA AUTO CACHE STRING "Use the CUDA toolkit of NVIDIA's pip wheels (AUTO, ON, OFF)")
set_property(CACHE GPUKEEPER_PIP_CUDA PROPERTY STRINGS AUTO ON OFF)

# The pip packages that make the tree, pinned to CUDA 13.0 so that the code they build
# runs on every CUDA 13 driver (PTX from a newer nvcc is refused by an older driver).
set(GPUKEEPER_PIP_CUDA_PACKAGES
  "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-crt==13.0.*" "nvidia-cuda-cccl==13.0.*"
  "nvidia-cuda-nvcc==13.0.*" "nvidia-nvvm==13.0.*")

# Sets <out> to the pip toolkit's root when one is installed for this build's Python,
# else to "" with <missing> naming the absent pieces.
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
  set(absent "")
  if(NOT rc EQUAL 0 OR NOT EXISTS "${root}/include/cuda_runtime.h" OR NOT EXISTS "${root}/lib/libcudart_static.a")
    list(APPEND absent "nvidia-cuda-runtime")
  endif()
  if(NOT EXISTS "${root}/include/crt/host_config.h")
    list(APPEND absent "nvidia-cuda-crt")
  endif()
  if(NOT EXISTS "${root}/include/cccl")  # FindCUDAToolkit names it for CUDA 13
    list(APPEND absent "nvidia-cuda-cccl")
  endif()
  if(NOT EXISTS "${root}/bin/nvcc")
    list(APPEND absent "nvidia-cuda-nvcc")
  endif()
  if(NOT EXISTS "${root}/nvvm/bin/cicc")
    list(APPEND absent "nvidia-nvvm")
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

if(GPUKEEPER_WITH_CUDA AND NOT GPUKEEPER_PIP_CUDA STREQUAL "OFF")
  gpukeeper_system_cuda_found(_gk_system_cuda)
  if(GPUKEEPER_PIP_CUDA STREQUAL "ON" OR NOT _gk_system_cuda)
    gpukeeper_find_pip_cuda(_gk_pip_root _gk_pip_missing)
    if(_gk_pip_root)
      message(STATUS "gpukeeper: CUDA toolkit from NVIDIA's pip wheels at ${_gk_pip_root}")
      set(CUDAToolkit_ROOT "${_gk_pip_root}")
      set(CMAKE_CUDA_COMPILER "${_gk_pip_root}/bin/nvcc")
      # The wheel ships libcudart.so.13 without the unversioned name FindCUDAToolkit looks
      # for; the core links the static runtime, and the shared one is only named here.
      set(CUDA_CUDART "${_gk_pip_root}/lib/libcudart.so.13" CACHE FILEPATH "")
      # nvcc.profile of the 13.0 wheels names lib64, which the wheels do not have.
      string(APPEND CMAKE_CUDA_FLAGS " -L${_gk_pip_root}/lib")
    else()
      string(REPLACE ";" "\" \"" _gk_pkgs "${GPUKEEPER_PIP_CUDA_PACKAGES}")
      string(REPLACE ";" ", " _gk_pip_missing "${_gk_pip_missing}")
      set(_gk_install "pip install \"${_gk_pkgs}\"")
      if(GPUKEEPER_PIP_CUDA STREQUAL "ON")
        message(FATAL_ERROR "gpukeeper: GPUKEEPER_PIP_CUDA=ON, but the pip toolkit lacks "
          "${_gk_pip_missing}. Install it into this environment:\n  ${_gk_install}")
      endif()
      gpukeeper_driver_present(_gk_driver)
      if(_gk_driver)
        message(WARNING "gpukeeper: this machine has an NVIDIA driver but no CUDA toolkit: the core "
          "built now is CPU-only and will not use the GPU. Install the binary wheel, or the "
          "toolkit from pip into this environment and build again:\n  ${_gk_install}\n"
          "(missing now: ${_gk_pip_missing}), or install CUDA 13's toolkit.")
      endif()
    endif()
  endif()
endif()
