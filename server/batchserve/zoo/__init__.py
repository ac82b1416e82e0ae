"""Example models, trained here on data that ships with a package, exported through the CLI.

`make models` runs ``python -m batchserve.zoo``; needs the ``export`` extra (torch).
It drives the ``batchserve export`` command (``cli``) and never imports the serving path.
"""

MAX_QUEUE_DELAY_US = 25_000
"""The shipped models' ``max_queue_delay_microseconds``: long enough for 32 closed-loop gRPC
clients to fill one batch on the reference machine, where a gRPC call costs the event loop
0.5-1.4 ms. The batcher does not wait when no company is expected, so a lone client is not
delayed, and a batch goes as soon as every client answered is back (bench/NOTES.md)."""

ONE_THREAD = 'parameters {\n  key: "intra_op_thread_count"\n  value { string_value: "1" }\n}\n'
"""Appended to the configs of ``ONE_THREAD_MODELS``. A batch of digits_cnn is a handful of
small operators: a second ONNX Runtime thread only adds a wake-up per operator (measured at
c=1: server-side compute 210-263 µs with ORT's default two threads, 144 µs with one)."""

ONE_THREAD_MODELS = frozenset({"digits_cnn", "digits_cnn_uint8"})
"""char_lstm keeps ORT's default threads: its batches of 32 run long enough for a second
thread to pay (c=32: +12-16 % over HTTP, +34 % over gRPC; c=1 p50 +0.15 ms)."""
