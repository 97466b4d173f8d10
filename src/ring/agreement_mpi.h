// How the ranks of a ring agree on errors, so that bad input on one rank fails every rank with
// the same Error instead of leaving the others waiting for its messages.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace maskattn::dist::detail {

// The rank and size of `comm`; throws Error (locally: no agreement is possible) when MPI is not
// initialised or already finalised, or comm is MPI_COMM_NULL.
std::pair<int, int> rank_and_world(MPI_Comm comm, const char* who);

// Runs `check`, returning the message of what it threw ("" when it returned).
std::string error_of(const std::function<void()>& check);

// Collective. When any rank passes a non-empty message, every rank throws the same Error:
// "<who>: rank R of P: <message of the lowest failing rank R>".
void agree_or_throw(MPI_Comm comm, const char* who, const std::string& error);

// Collective. Rank 0's values of the named parameters are broadcast; returns a message naming the
// first parameter this rank holds differently ("" when all equal).
std::string compare_with_rank0(MPI_Comm comm,
                               const std::vector<std::pair<const char*, int64_t>>& parameters);

}  // namespace maskattn::dist::detail
