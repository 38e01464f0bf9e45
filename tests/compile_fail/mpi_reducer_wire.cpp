// Gradients travel as float or bfloat16 only: float16 on the wire is refused.
#include <precis/distributed/mpi.hpp>

int main() {
  precis::mpi_reducer<precis::float16> r;
  return r.size();
}
