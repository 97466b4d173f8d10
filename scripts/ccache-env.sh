# Sourced by scripts/test.sh and scripts/fuzz.sh: compile through ccache when it is installed, so
# that a fresh checkout on a machine that built the same sources before (CI runs on the machine
# the work was done on) does not compile them again. Results are the compiler's own: ccache
# replays a cached object and its warnings only for the same preprocessed source and flags.
# Paths under the checkout are hashed relative to the build directory (CCACHE_BASEDIR), and the
# working directory is left out of the hash of -g builds (CCACHE_NOHASHDIR), so any checkout at
# any path shares the cache; the cost is that debug info may name another checkout's paths.
# Sets ccache_launcher to the CMake arguments to configure with (empty without ccache).
ccache_launcher=()
if command -v ccache >/dev/null 2>&1; then
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
  export CCACHE_NOHASHDIR=1
  ccache_launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
