# Included by the precis-config.cmake that Conan's CMakeDeps writes, after it has made
# precis::precis, so that the Conan package gives what the installed precisConfig.cmake
# gives.
target_compile_features(precis::precis INTERFACE cxx_std_20)

# A requirement that the profile lists under [platform_requires] gets neither a config
# file nor a link from CMakeDeps: take it from the system, as precisConfig.cmake does.
if(NOT TARGET Boost::headers)
  find_package(Boost 1.74 REQUIRED)
  target_link_libraries(precis::precis INTERFACE Boost::headers)
endif()
if(NOT TARGET xtensor)
  find_package(xtensor REQUIRED)
  target_link_libraries(precis::precis INTERFACE xtensor)
endif()
