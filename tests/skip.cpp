// Reports a test as skipped: prints the reason and exits with CTest's skip code 77.
#include <cstdio>

int main(int argc, char** argv) {
  std::printf("skipped: %s\n", argc > 1 ? argv[1] : "a prerequisite is missing");
  return 77;
}
