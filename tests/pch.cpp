// The unit tests' precompiled headers are compiled as part of the targets
// precis_test_pch_<n> (precis_use_test_pch, tests/CMakeLists.txt), which build this
// otherwise empty unit.
