// The maskattn command line, run as a separate process.
#include "test_util.h"

namespace maskattn {
namespace {
TEST(Cli, Placeholder) {}
}  // namespace
}  // namespace maskattn
