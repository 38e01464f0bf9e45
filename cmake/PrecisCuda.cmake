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

# precis_find_cudnn_frontend(<found-var> <reason-var>)
# Sets <found-var> to TRUE when the cuDNN frontend's headers (cudnn_frontend.h, header-only;
# the PyPI package nvidia-cudnn-frontend installs them under its site-packages' include/) are
# found: in PRECIS_CUDNN_FRONTEND_INCLUDE_DIR, under CMAKE_PREFIX_PATH, or in the include/ of
# python3's site-packages (system and user). Otherwise FALSE, with <reason-var> saying so.
macro(precis_find_cudnn_frontend _precis_found _precis_reason)
  set(${_precis_found} FALSE)
  set(${_precis_reason} "")
  set(_precis_site "")
  find_program(_precis_python python3)
  if(_precis_python)
    execute_process(
      COMMAND ${_precis_python} -c
        "import site, sysconfig; print(';'.join([sysconfig.get_paths()['purelib'], site.getusersitepackages()] + site.getsitepackages()))"
      OUTPUT_VARIABLE _precis_site OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  endif()
  set(_precis_hints "")
  foreach(_precis_dir IN LISTS _precis_site)
    list(APPEND _precis_hints ${_precis_dir}/include)
  endforeach()
  find_path(PRECIS_CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h HINTS ${_precis_hints}
    DOC "Directory holding cudnn_frontend.h (pip install nvidia-cudnn-frontend)")
  if(NOT PRECIS_CUDNN_FRONTEND_INCLUDE_DIR)
    set(${_precis_reason}
      "the cuDNN frontend's headers (cudnn_frontend.h; pip install nvidia-cudnn-frontend) were not found")
  else()
    set(${_precis_found} TRUE)
  endif()
  unset(_precis_site)
  unset(_precis_hints)
  unset(_precis_dir)
endmacro()

# precis_link_cudnn_frontend(<interface-target>)
# precis::cuda + the cuDNN frontend's headers, PRECIS_HAS_CUDNN_FRONTEND=1: nn::attention runs
# fused on the device where its policies allow (kernels/cuda/fused_attention.hpp). The
# frontend is built without its JSON library (CUDNN_FRONTEND_SKIP_JSON_LIB): precis does not
# serialise graphs, and a unit that includes it compiles in half the time.
# CUDA::nvrtc: the frontend's runtime-compiled engines call NVRTC (PyTorch's CUDA wheels ship
# it too).
function(precis_link_cudnn_frontend _precis_target _precis_cuda)
  target_link_libraries(${_precis_target} INTERFACE ${_precis_cuda} CUDA::nvrtc)
  target_compile_definitions(${_precis_target} INTERFACE PRECIS_HAS_CUDNN_FRONTEND=1 CUDNN_FRONTEND_SKIP_JSON_LIB)
  target_include_directories(${_precis_target} SYSTEM INTERFACE ${PRECIS_CUDNN_FRONTEND_INCLUDE_DIR})
endfunction()
