"""The running process: the composition root (``app``), the ``serve`` and ``repo`` commands,
the metrics collector, and the process-wide tuning (event loop, garbage collector, allocator,
signals).

The top layer: may import every other part; nothing imports it but ``cli``.
"""
