# Finds what precis's CUDA backend needs and describes precis::cuda. Used by the build
# tree and, installed beside precisConfig.cmake, by the package config, so both make the
# same target from the consumer's own CUDA installation.
include_guard(GLOBAL)

# precis_find_cuda(<found-var> <reason-var>)
# Sets <found-var> to TRUE when the CUDA toolkit (runtime, cuBLAS, cuBLASLt) and cuDNN 9
# or newer are found; otherwise FALSE, with <reason-var> saying what is missing.
# A macro so that find_package(CUDAToolkit)'s variables reach the caller.
# cuDNN: cudnn.h and libcudnn beside the toolkit, or under CMAKE_PREFIX_PATH, or in the
# cache variables PRECIS_CUDNN_INCLUDE_DIR and PRECIS_CUDNN_LIBRARY.
macro(precis_find_cuda _precis_found _precis_reason)
  set(${_precis_found} FALSE)
  set(${_precis_reason} "")
  find_package(CUDAToolkit QUIET)
  if(NOT CUDAToolkit_FOUND)
    set(${_precis_reason} "the CUDA toolkit was not found")
  elseif(NOT TARGET CUDA::cudart OR NOT TARGET CUDA::cublas OR NOT TARGET CUDA::cublasLt)
    set(${_precis_reason}
      "the CUDA runtime, cuBLAS or cuBLASLt is missing from ${CUDAToolkit_LIBRARY_DIR}")
  else()
    find_path(PRECIS_CUDNN_INCLUDE_DIR cudnn.h
      HINTS ${CUDAToolkit_INCLUDE_DIRS}
      DOC "Directory holding cudnn.h")
    find_library(PRECIS_CUDNN_LIBRARY cudnn
      HINTS ${CUDAToolkit_LIBRARY_DIR}
      DOC "cuDNN library (libcudnn)")
    if(NOT PRECIS_CUDNN_INCLUDE_DIR OR NOT PRECIS_CUDNN_LIBRARY)
      set(${_precis_reason} "cuDNN (cudnn.h and libcudnn) was not found")
    else()
      set(_precis_cudnn_major 0)
      foreach(_precis_header cudnn_version.h cudnn.h)
        if(EXISTS ${PRECIS_CUDNN_INCLUDE_DIR}/${_precis_header})
          file(STRINGS ${PRECIS_CUDNN_INCLUDE_DIR}/${_precis_header} _precis_line
            REGEX "^#define CUDNN_MAJOR +[0-9]+")
          if(_precis_line MATCHES "CUDNN_MAJOR +([0-9]+)")
            set(_precis_cudnn_major ${CMAKE_MATCH_1})
            break()
          endif()
        endif()
      endforeach()
      if(_precis_cudnn_major LESS 9)
        set(${_precis_reason}
          "cuDNN 9 or newer is needed; ${PRECIS_CUDNN_INCLUDE_DIR} has cuDNN ${_precis_cudnn_major}")
      else()
        set(${_precis_found} TRUE)
      endif()
      unset(_precis_cudnn_major)
      unset(_precis_header)
      unset(_precis_line)
    endif()
  endif()
endmacro()

# precis_link_cuda(<target>)
# Gives the INTERFACE target <target> precis::precis, the CUDA runtime, cuBLAS, cuBLASLt
# and cuDNN, and PRECIS_CUDA=1 (CUDA interop in host code too). Call after
# precis_find_cuda() succeeded.
function(precis_link_cuda target)
  target_link_libraries(${target} INTERFACE
    precis::precis CUDA::cudart CUDA::cublas CUDA::cublasLt ${PRECIS_CUDNN_LIBRARY})
  target_compile_definitions(${target} INTERFACE PRECIS_CUDA=1)
  # SYSTEM: CUDA's headers are not held to precis's warning flags.
  target_include_directories(${target} SYSTEM INTERFACE
    ${CUDAToolkit_INCLUDE_DIRS} ${PRECIS_CUDNN_INCLUDE_DIR})
endfunction()
