"""Hand-run benchmarks (not part of the test suite or CI); see bench/README.md."""
