// The .npy parser on arbitrary bytes: it must return an array or throw maskattn::Error, never
// crash, read out of bounds or allocate without bound; a parsed array must survive serialisation,
// parse back to the same array, and convert to float32 or throw Error.
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "maskattn/error.h"
#include "maskattn/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace maskattn;
  try {
    const NpyArray array = parse_npy(data, size, "fuzz.npy");
    const std::vector<uint8_t> bytes = serialize_npy(array);
    const NpyArray again = parse_npy(bytes.data(), bytes.size(), "again.npy");
    if (again.shape() != array.shape() || again.type() != array.type() ||
        again.bytes() != array.bytes()) {
      std::abort();  // serialize ∘ parse must be the identity on what parses
    }
    try {
      (void)array.to_float32("fuzz");
    } catch (const Error&) {
    }
  } catch (const Error&) {
  }
  return 0;
}
