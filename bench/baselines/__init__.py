"""Earlier versions of kernels, kept for side-by-side benchmarks only (not in the package)."""
