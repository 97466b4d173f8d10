// Ranks of a `--ring` command fail together. Each rank reads its own rows and writes its own
// rows, so a rank can fail where the others do not (an unreadable page, a full disk); if it
// simply threw, the others would wait forever in the next collective call. Every local step is
// therefore run through on_every_rank(), which lets all ranks learn whether any failed.
#pragma once

#include <mpi.h>

#include <functional>

namespace maskattn::cli {

// Runs `step` on this rank; then, on every rank, throws the Error of the lowest-numbered rank
// whose step threw (its message unchanged), or returns when none did. Collective over `comm`.
void on_every_rank(MPI_Comm comm, const std::function<void()>& step);

}  // namespace maskattn::cli
