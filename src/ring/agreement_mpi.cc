#include "ring/agreement_mpi.h"

#include <exception>

#include "maskattn/error.h"

namespace maskattn::dist::detail {

std::pair<int, int> rank_and_world(MPI_Comm comm, const char* who) {
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  if (!initialised || finalised) {
    throw Error(std::string(who) + ": MPI is " +
                (finalised ? "already finalised" : "not initialised") +
                "; call MPI_Init_thread (MPI_THREAD_FUNNELED) before and MPI_Finalize after");
  }
  if (comm == MPI_COMM_NULL) throw Error(std::string(who) + ": comm is MPI_COMM_NULL");
  int rank = 0, world = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  return {rank, world};
}

std::string error_of(const std::function<void()>& check) {
  try {
    check();
  } catch (const std::exception& e) {
    const std::string message = e.what();
    return message.empty() ? std::string("unnamed error") : message;
  } catch (...) {
    return "an exception that is not a std::exception";
  }
  return "";
}

void agree_or_throw(MPI_Comm comm, const char* who, const std::string& error) {
  int rank = 0, world = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  const int mine = error.empty() ? world : rank;
  int failing = world;
  MPI_Allreduce(&mine, &failing, 1, MPI_INT, MPI_MIN, comm);
  if (failing == world) return;
  // The lowest failing rank's message, to everyone: its length, then its bytes.
  int length = rank == failing ? static_cast<int>(error.size()) : 0;
  MPI_Bcast(&length, 1, MPI_INT, failing, comm);
  std::string message = rank == failing ? error : std::string(static_cast<size_t>(length), ' ');
  MPI_Bcast(message.data(), length, MPI_CHAR, failing, comm);
  throw Error(std::string(who) + ": rank " + std::to_string(failing) + " of " +
              std::to_string(world) + ": " + message);
}

std::string compare_with_rank0(MPI_Comm comm,
                               const std::vector<std::pair<const char*, int64_t>>& parameters) {
  std::vector<int64_t> values, reference;
  for (const auto& p : parameters) values.push_back(p.second);
  reference = values;
  MPI_Bcast(reference.data(), static_cast<int>(reference.size()), MPI_INT64_T, 0, comm);
  for (size_t n = 0; n < values.size(); ++n) {
    if (values[n] != reference[n]) {
      return std::string(parameters[n].first) + " = " + std::to_string(values[n]) +
             " differs from rank 0's " + std::to_string(reference[n]) +
             "; every rank must describe the same global problem";
    }
  }
  return "";
}

}  // namespace maskattn::dist::detail
