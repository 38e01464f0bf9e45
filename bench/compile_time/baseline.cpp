// Baseline for policy_map_64.cpp: the same headers, nothing resolved.
#include <precis/policy/policy.hpp>

int main() { return 0; }
