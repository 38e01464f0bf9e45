# Build options and helpers for the targets built in this tree (tests, benchmarks,
# examples). Nothing here is installed or reaches the consumers of precis::precis.
include_guard(GLOBAL)
include(CheckCXXCompilerFlag)

option(PRECIS_WERROR "Treat warnings as errors in precis's own targets" OFF)
option(PRECIS_SANITIZE "Build precis's own C++ targets with ASan and UBSan" OFF)
option(PRECIS_NATIVE "Build the benchmarks for this machine's processor (-march=native)" ON)
# The benchmarks' C++ compiled for errors and warnings only (-fsyntax-only: every template
# they use instantiated, no code generated, nothing linked), for a build that runs none of
# them (CI's test stage). Their targets are then object libraries that produce no object.
option(PRECIS_BENCH_CHECK_ONLY "Check the benchmarks' code with -fsyntax-only instead of building them" OFF)
option(PRECIS_CUDA_CHECK_ONLY
  "Check the device tests', benchmarks' and training examples' code instead of building them (machines without a GPU)" OFF)

# Optimisation flags for the targets CI builds only to run once: PRECIS_TEST_OPTIMIZATION for
# the unit tests (precis_add_test's executables and the MPI test), PRECIS_EXAMPLE_OPTIMIZATION
# for the examples that ctest runs. Each is placed after the build type's flags so that it
# wins. CI's test stage builds the unit tests at -Og and the examples at -O1, while the bits
# probe keeps the build type's -O2 (see run.sh's configure_gcc). Empty (the default): the
# build type's flags.
foreach(kind TEST EXAMPLE)
  string(TOLOWER "${kind}" what)
  set(PRECIS_${kind}_OPTIMIZATION "" CACHE STRING
    "An -O flag for the ${what}s that overrides the build type's (empty: the build type's)")
  if(NOT PRECIS_${kind}_OPTIMIZATION MATCHES "^(|-O[0-3sg]?)$")
    message(FATAL_ERROR "precis: PRECIS_${kind}_OPTIMIZATION must be empty or one -O flag "
                        "(-O0, -O1, -O2, -O3, -Os, -Og), not '${PRECIS_${kind}_OPTIMIZATION}'")
  endif()
endforeach()

# precis_set_optimization(<target> TEST|EXAMPLE)
# PRECIS_TEST_OPTIMIZATION or PRECIS_EXAMPLE_OPTIMIZATION for the C++ sources of <target>,
# where it is set.
function(precis_set_optimization target kind)
  if(NOT kind MATCHES "^(TEST|EXAMPLE)$")
    message(FATAL_ERROR "precis_set_optimization: TEST or EXAMPLE, not '${kind}'")
  endif()
  if(PRECIS_${kind}_OPTIMIZATION)
    target_compile_options(${target} PRIVATE
      "$<$<COMPILE_LANG_AND_ID:CXX,GNU,Clang,AppleClang>:${PRECIS_${kind}_OPTIMIZATION}>")
  endif()
endfunction()

# precis_tristate(<option> <out-var>)
# The value of the AUTO/ON/OFF cache option <option> as AUTO, ON or OFF in <out-var>
# (CMake's spellings of true and false accepted); any other value is a configure error.
function(precis_tristate option out)
  string(TOUPPER "${${option}}" mode)
  if(mode MATCHES "^(ON|TRUE|YES|Y|1)$")
    set(mode ON)
  elseif(mode MATCHES "^(OFF|FALSE|NO|N|0|)$")
    set(mode OFF)
  elseif(NOT mode STREQUAL "AUTO")
    message(FATAL_ERROR "precis: ${option} must be AUTO, ON or OFF, not '${${option}}'")
  endif()
  set(${out} ${mode} PARENT_SCOPE)
endfunction()

# precis_set_warnings(<target>)
# The warning set the library headers are held to, for C++ sources only. CUDA sources
# get none: nvcc's host pass would report them for CUDA's own headers as well.
function(precis_set_warnings target)
  set(gnu_warnings -Wall -Wextra -Wpedantic -Wconversion -Wsign-conversion -Wshadow)
  if(PRECIS_WERROR)
    list(APPEND gnu_warnings -Werror)
  endif()
  set(msvc_warnings /W4 /permissive-)
  if(PRECIS_WERROR)
    list(APPEND msvc_warnings /WX)
  endif()
  target_compile_options(${target} PRIVATE
    "$<$<COMPILE_LANG_AND_ID:CXX,GNU,Clang,AppleClang>:${gnu_warnings}>"
    "$<$<COMPILE_LANG_AND_ID:CXX,MSVC>:${msvc_warnings}>")
endfunction()

# precis_set_native(<target>)
# -march=native for the C++ sources of <target> when PRECIS_NATIVE is ON and the compiler
# takes it. For benchmarks, which measure this machine; tests stay portable.
function(precis_set_native target)
  if(NOT PRECIS_NATIVE)
    return()
  endif()
  check_cxx_compiler_flag(-march=native PRECIS_CXX_HAS_MARCH_NATIVE)
  if(PRECIS_CXX_HAS_MARCH_NATIVE)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-march=native>)
  endif()
endfunction()

# precis_add_cuda_program(<name> <source> [<library>...])
# A device test, benchmark or training example: an executable linked with the libraries given. Under
# PRECIS_CUDA_CHECK_ONLY (CI, which has no GPU to run them on), nvcc compiles its device code in
# full (-cuda: cicc and ptxas, every device error) into an object library <name>_device and
# writes the host half it would hand to the host compiler, which a custom target <name> then
# checks with -fsyntax-only (every host error, no code generated): 20 to 40 s less per program
# than building it. Returns in <name>_CHECK_ONLY whether it was only checked. Either way
# precis_device_targets (the CUDA stage's build) depends on <name>.
function(precis_add_cuda_program name source)
  if(PRECIS_CUDA_CHECK_ONLY)
    add_library(${name}_device OBJECT ${source})
    target_link_libraries(${name}_device PRIVATE ${ARGN})
    target_compile_options(${name}_device PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-cuda>)
    if(CMAKE_CUDA_HOST_COMPILER)
      set(host_cxx ${CMAKE_CUDA_HOST_COMPILER})
    else()
      set(host_cxx ${CMAKE_CXX_COMPILER})
    endif()
    add_custom_target(${name} ALL
      COMMAND ${host_cxx} -std=c++20 -fsyntax-only -x c++ $<TARGET_OBJECTS:${name}_device>
      DEPENDS ${name}_device
      COMMENT "Checking the host half of ${name} (-fsyntax-only)"
      COMMAND_EXPAND_LISTS VERBATIM)
    set(${name}_CHECK_ONLY TRUE PARENT_SCOPE)
  else()
    add_executable(${name} ${source})
    target_link_libraries(${name} PRIVATE ${ARGN})
    set(${name}_CHECK_ONLY FALSE PARENT_SCOPE)
  endif()
  if(TARGET precis_device_targets)
    add_dependencies(precis_device_targets ${name})
  endif()
endfunction()
