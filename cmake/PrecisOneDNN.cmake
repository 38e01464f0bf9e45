# Finds oneDNN for precis's hardware products on the CPU and describes precis::onednn.
# Used by the build tree and, installed beside precisConfig.cmake, by the package config.
include_guard(GLOBAL)

# precis_find_onednn(<found-var> <reason-var>)
# Sets <found-var> to TRUE when oneDNN 2.x (Debian: libdnnl-dev) is found; otherwise FALSE,
# with <reason-var> saying what is missing. A macro so that find_package's variables reach
# the caller.
macro(precis_find_onednn _precis_found _precis_reason)
  set(${_precis_found} FALSE)
  set(${_precis_reason} "")
  # Debian's oneDNN is built with the OpenCL GPU runtime and its package config calls
  # find_package(OpenCL REQUIRED), which would end a QUIET search with a hard error.
  find_package(OpenCL QUIET)
  if(NOT OpenCL_FOUND)
    set(${_precis_reason}
      "OpenCL (ocl-icd-opencl-dev), which Debian's oneDNN package config requires, was not found")
  else()
    find_package(dnnl CONFIG QUIET)
    if(NOT TARGET DNNL::dnnl)
      set(${_precis_reason} "oneDNN (libdnnl-dev) was not found")
    elseif(dnnl_VERSION VERSION_LESS 2.6 OR NOT dnnl_VERSION VERSION_LESS 3.0)
      set(${_precis_reason} "oneDNN ${dnnl_VERSION} was found; precis::onednn uses the 2.x API (2.6 or newer)")
    else()
      set(${_precis_found} TRUE)
    endif()
  endif()
endmacro()

# precis_link_onednn(<interface-target>)
# precis + oneDNN, PRECIS_HAS_ONEDNN=1. ${CMAKE_DL_LIBS}: precis looks up the OpenMP
# runtime's thread-count calls that oneDNN uses (kernels/cpu/onednn.hpp).
function(precis_link_onednn _precis_target)
  target_link_libraries(${_precis_target} INTERFACE precis::precis DNNL::dnnl ${CMAKE_DL_LIBS})
  target_compile_definitions(${_precis_target} INTERFACE PRECIS_HAS_ONEDNN=1)
endfunction()
