// The installed precis::mpi: a gradient average over the processes of a singleton MPI run
// (one process: the mean is the value itself) through the installed headers and the MPI
// the package config found.
#include <precis/distributed/mpi.hpp>

#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  bool ok = false;
  {
    precis::mpi_reducer<> r;
    std::vector<float> g{1.5f, -2.0f};
    r.average(g);
    ok = r.size() == 1 && g == std::vector<float>{1.5f, -2.0f} && !r.any(false) && r.any(true);
  }
  MPI_Finalize();
  std::printf("precis::mpi average: %s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
