"""The gRPC side of the KServe v2 protocol on grpc.aio: messages translated to and from the
dataplane's types, calls bounded and counted, streams.

Imports ``dataplane``, ``observability``, ``core`` and ``proto``; never ``rest``, ``scheduler``
or ``backends``.
"""
