"""`bench/step_anatomy.py`'s prefill workload in parts: the profiler trace as kernels per
engine step (`kernel_trace`), the workload, its step records and figures (`prefill`), and
the host phase timer both `step_anatomy` and `prefill` use (`timer`)."""
