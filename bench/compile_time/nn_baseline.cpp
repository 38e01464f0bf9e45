// Baseline for vit_b_blueprint.cpp: the same headers, no model built.
#include <precis/precis.hpp>

int main() { return 0; }
