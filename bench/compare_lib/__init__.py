"""bench/compare's parts: measure.py runs the cases and the machine's peaks, amx_cases.py the AMX
acceptance cases, render.py turns the results into docs/benchmarks.md's tables and README's
figures. bench/compare (the script) strings them together."""
