# What the DBNet example's code needs besides precis: OpenCV's core, imgproc and imgcodecs
# (Debian: libopencv-imgproc-dev libopencv-imgcodecs-dev; Debian's OpenCV CMake package
# comes only with the whole of libopencv-dev, so the pieces are found directly) and Clipper
# (libpolyclipping-dev). Defines the interface target dbnet_deps when all are found, and
# DBNET_DEPS_MISSING otherwise.
include_guard(GLOBAL)

find_path(DBNET_OPENCV_INCLUDE_DIR opencv2/imgproc.hpp PATH_SUFFIXES opencv4)
find_library(DBNET_OPENCV_CORE opencv_core)
find_library(DBNET_OPENCV_IMGPROC opencv_imgproc)
find_library(DBNET_OPENCV_IMGCODECS opencv_imgcodecs)
find_path(DBNET_CLIPPER_INCLUDE_DIR polyclipping/clipper.hpp)
find_library(DBNET_CLIPPER_LIBRARY polyclipping)

set(DBNET_DEPS_MISSING "")
foreach(v DBNET_OPENCV_INCLUDE_DIR DBNET_OPENCV_CORE DBNET_OPENCV_IMGPROC DBNET_OPENCV_IMGCODECS
          DBNET_CLIPPER_INCLUDE_DIR DBNET_CLIPPER_LIBRARY)
  if(NOT ${v})
    list(APPEND DBNET_DEPS_MISSING ${v})
  endif()
endforeach()

if(NOT DBNET_DEPS_MISSING AND NOT TARGET dbnet_deps)
  add_library(dbnet_deps INTERFACE)
  # System headers: their warnings are not precis's.
  target_include_directories(dbnet_deps SYSTEM INTERFACE ${DBNET_OPENCV_INCLUDE_DIR} ${DBNET_CLIPPER_INCLUDE_DIR})
  target_link_libraries(dbnet_deps INTERFACE ${DBNET_OPENCV_IMGCODECS} ${DBNET_OPENCV_IMGPROC} ${DBNET_OPENCV_CORE}
                                             ${DBNET_CLIPPER_LIBRARY})
endif()
