// A data-parallel run in which rank 1 dies (exits without MPI_Finalize) after three steps
// while rank 0 keeps averaging gradients. The run must end with an error, not hang:
// expect_failure.cmake runs it under mpirun with a time limit and requires a nonzero exit
// before the limit.
#include <precis/distributed/mpi.hpp>
#include <precis/precis.hpp>

#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  using namespace precis;
  mpi_reducer<> r;
  std::vector<float> g(1000, 1.0F);
  for (int step = 0; step < 100000; ++step) {
    if (r.rank() == 1 && step == 3) {
      std::fprintf(stderr, "rank 1: exiting at step 3\n");
      std::_Exit(3);
    }
    try {
      r.average(g);
    } catch (const error& e) {  // MPI reported the failure: the run ends with an error
      std::fprintf(stderr, "rank %d: %s\n", r.rank(), e.what());
      return 2;
    }
  }
  std::fprintf(stderr, "rank %d: all steps done although rank 1 died\n", r.rank());
  MPI_Finalize();
  return 0;
}
