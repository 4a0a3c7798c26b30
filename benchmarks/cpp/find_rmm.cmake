# RMM for rmm_pair_bench (gpukeeper's pool against RMM's in one run).
#
# Looked for only when named, so that a build that names nothing is the same as without
# this file (CI has no RMM):
#   -DGPUKEEPER_RMM_ROOT=<dir>   an RMM install: the librmm/ folder of the unpacked (or
#                                pip-installed) librmm-cu13 wheel, or a prefix with
#                                lib/cmake/rmm or lib64/cmake/rmm
#   -Drmm_DIR=<dir>              the folder of rmm-config.cmake
#   -DGPUKEEPER_RAPIDS_LOGGER_ROOT=<dir>  the rapids_logger/ folder of its wheel; by default
#                                the rapids_logger/ beside GPUKEEPER_RMM_ROOT (site-packages)
#   -DGPUKEEPER_RMM_BY_HAND=ON   skip RMM's config and import the wheel layout by hand
#                                (what an older CMake gets; to test that path)
#
# Sets GPUKEEPER_RMM_FOUND and GPUKEEPER_RMM_TARGET (the target to link).
#
# RMM's CMake config asks for CMake 4.0; under an older CMake, and when the config is
# missing, the wheel's layout is imported by hand (gpukeeper_rmm_wheel below). Either way
# RMM's own CCCL (the wheel's include/rapids, 3.5 for RMM 26.10) must come before the
# toolkit's: CUDA 13.0 ships CCCL 3.0, which lacks the resource types RMM 26.10 uses.

set(GPUKEEPER_RMM_ROOT "" CACHE PATH "RMM install (e.g. the librmm wheel's librmm/ folder); builds rmm_pair_bench")
set(GPUKEEPER_RAPIDS_LOGGER_ROOT "" CACHE PATH "rapids_logger install (default: beside GPUKEEPER_RMM_ROOT)")
set(GPUKEEPER_RMM_FOUND OFF)
set(GPUKEEPER_RMM_TARGET "")

if(NOT GPUKEEPER_RMM_ROOT AND NOT rmm_DIR)
  return()
endif()
if(NOT GPUKEEPER_CUDA)
  message(WARNING "gpukeeper: RMM named but this is not a CUDA build: rmm_pair_bench not built")
  return()
endif()

set(_rmm_root "${GPUKEEPER_RMM_ROOT}")
set(_logger_root "${GPUKEEPER_RAPIDS_LOGGER_ROOT}")
if(NOT _logger_root AND _rmm_root)
  get_filename_component(_logger_root "${_rmm_root}/../rapids_logger" ABSOLUTE)
endif()

# Debian-style CMake does not look under lib64/, where the wheels keep their configs:
# point at them directly unless the caller already did.
if(_rmm_root AND NOT rmm_DIR)
  foreach(_lib lib64 lib)
    if(EXISTS "${_rmm_root}/${_lib}/cmake/rmm/rmm-config.cmake")
      set(rmm_DIR "${_rmm_root}/${_lib}/cmake/rmm")
      if(NOT nvtx3_DIR AND EXISTS "${_rmm_root}/${_lib}/cmake/nvtx3/nvtx3-config.cmake")
        set(nvtx3_DIR "${_rmm_root}/${_lib}/cmake/nvtx3")
      endif()
      break()
    endif()
  endforeach()
endif()
if(_logger_root AND NOT rapids_logger_DIR)
  foreach(_lib lib64 lib)
    if(EXISTS "${_logger_root}/${_lib}/cmake/rapids_logger/rapids_logger-config.cmake")
      set(rapids_logger_DIR "${_logger_root}/${_lib}/cmake/rapids_logger")
      break()
    endif()
  endforeach()
endif()

if(rmm_DIR AND CMAKE_VERSION VERSION_GREATER_EQUAL 4.0 AND NOT GPUKEEPER_RMM_BY_HAND)
  find_package(rmm CONFIG QUIET)
  if(rmm_FOUND AND TARGET rmm::rmm)
    set(GPUKEEPER_RMM_FOUND ON)
    set(GPUKEEPER_RMM_TARGET rmm::rmm)
    message(STATUS "gpukeeper: RMM ${rmm_VERSION} (CMake config in ${rmm_DIR}): rmm_pair_bench")
    return()
  endif()
  message(STATUS "gpukeeper: RMM's CMake config in ${rmm_DIR} did not load; trying the wheel layout")
endif()

# By hand: headers, librmm.so and librapids_logger.so from the wheels' layout.
if(NOT _rmm_root)
  message(WARNING "gpukeeper: RMM not usable from rmm_DIR=${rmm_DIR} with CMake ${CMAKE_VERSION}; "
                  "name GPUKEEPER_RMM_ROOT for the wheel layout: rmm_pair_bench not built")
  return()
endif()
find_library(_gk_librmm NAMES rmm PATHS "${_rmm_root}/lib64" "${_rmm_root}/lib" NO_DEFAULT_PATH)
find_library(_gk_liblogger NAMES rapids_logger PATHS "${_logger_root}/lib64" "${_logger_root}/lib"
             NO_DEFAULT_PATH)
if(NOT EXISTS "${_rmm_root}/include/rmm/mr/pool_memory_resource.hpp" OR NOT _gk_librmm
   OR NOT _gk_liblogger OR NOT EXISTS "${_logger_root}/include/rapids_logger/logger.hpp")
  message(WARNING "gpukeeper: no usable RMM under ${_rmm_root} (headers, librmm) and "
                  "${_logger_root} (rapids_logger): rmm_pair_bench not built")
  unset(_gk_librmm CACHE)
  unset(_gk_liblogger CACHE)
  return()
endif()
add_library(gpukeeper_rmm_wheel INTERFACE)
# include/rapids holds RMM's CCCL: a plain -I, searched before the toolkit's -isystem.
target_include_directories(gpukeeper_rmm_wheel INTERFACE "${_rmm_root}/include/rapids")
target_include_directories(gpukeeper_rmm_wheel SYSTEM INTERFACE "${_rmm_root}/include"
                                                                "${_logger_root}/include")
# What RMM's config puts on its CCCL target.
target_compile_definitions(gpukeeper_rmm_wheel INTERFACE
  CUB_DISABLE_NAMESPACE_MAGIC CUB_IGNORE_NAMESPACE_MAGIC_ERROR THRUST_DISABLE_ABI_NAMESPACE
  THRUST_IGNORE_ABI_NAMESPACE_ERROR CCCL_DISABLE_PDL)
target_link_libraries(gpukeeper_rmm_wheel INTERFACE "${_gk_librmm}" "${_gk_liblogger}"
                      CUDA::cudart_static ${CMAKE_DL_LIBS})
set(GPUKEEPER_RMM_FOUND ON)
set(GPUKEEPER_RMM_TARGET gpukeeper_rmm_wheel)
message(STATUS "gpukeeper: RMM from the wheel layout in ${_rmm_root}: rmm_pair_bench")
