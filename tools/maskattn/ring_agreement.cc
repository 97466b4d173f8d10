#include "ring_agreement.h"

#include <exception>
#include <string>

#include "maskattn/error.h"

namespace maskattn::cli {

void on_every_rank(MPI_Comm comm, const std::function<void()>& step) {
  int rank = 0, world = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  std::string message;
  bool failed = false;
  try {
    step();
  } catch (const std::exception& error) {
    failed = true;
    message = error.what();
  }
  int first_failed = failed ? rank : world;
  MPI_Allreduce(MPI_IN_PLACE, &first_failed, 1, MPI_INT, MPI_MIN, comm);
  if (first_failed == world) return;
  int length = static_cast<int>(message.size());
  MPI_Bcast(&length, 1, MPI_INT, first_failed, comm);
  message.resize(static_cast<size_t>(length));
  MPI_Bcast(message.data(), length, MPI_CHAR, first_failed, comm);
  throw Error(message);
}

}  // namespace maskattn::cli
