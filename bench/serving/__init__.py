"""The online serving benchmark's parts: workloads, clients, the load generator, reports.

`bench/serve.py` is the command line over them; tests drive them directly.
"""
