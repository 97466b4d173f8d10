// The product unit a call asked for (attention.h: Products), internal side of maskattn/cpu.h.
#pragma once

#include "maskattn/attention.h"

namespace maskattn::detail {

// `requested`, with MASKATTN_PRODUCTS applied when it is automatic; an Error when the variable
// is not a unit's name or names a unit this CPU cannot run. Still `automatic` when nothing forced.
Products requested_products(Products requested);

}  // namespace maskattn::detail
