"""`bench/step_anatomy.py`'s prefill workload in parts: the profiler trace as kernels per
engine step (`kernel_trace`), and the workload, its step records and figures (`prefill`)."""
