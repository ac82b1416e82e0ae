"""Echo servers: the floor of Python request handling, with no model and no batching.

Each serves one model, ``identity`` (FP32 [-1, 16]), with just enough of the v2 protocol
for perf_analyzer, prints ``READY <port>`` once listening on a free loopback port, and
counts requests in its statistics so CPU per request can be computed. None imports batchserve.
"""
