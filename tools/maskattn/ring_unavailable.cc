// attend --ring / grad --ring in a build without MPI (-DMASKATTN_WITH_MPI=OFF, or no MPI found):
// the option exists, so that the error says what is missing instead of "unknown option".
#include "commands.h"
#include "maskattn/error.h"

namespace maskattn::cli {

namespace {

[[noreturn]] void no_mpi() {
  throw Error(
      "--ring needs a maskattn built with MPI: install Open MPI (Debian: libopenmpi-dev "
      "openmpi-bin), configure with -DMASKATTN_WITH_MPI=ON, and run under mpirun -np P");
}

}  // namespace

int run_attend_ring(const AttendArgs&) {
  no_mpi();
}
int run_grad_ring(const GradArgs&) {
  no_mpi();
}

}  // namespace maskattn::cli
