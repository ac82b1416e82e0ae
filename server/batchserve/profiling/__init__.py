"""`batchserve profile`: sweep a model's instance count, max_batch_size and queue delay with
NVIDIA's perf_analyzer against a server it starts, and write the best config.pbtxt within a
p99 latency budget (as Triton's Model Analyzer does for Triton).

It drives the server from outside, as a client: it imports ``models`` (to read and write
config.pbtxt), ``core`` and ``proto``, and never the serving path.
"""
