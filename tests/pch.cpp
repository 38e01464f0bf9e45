// The unit tests' precompiled header is compiled as part of this target
// (precis_test_pch, tests/CMakeLists.txt); this unit has nothing of its own.
