"""The HTTP/REST side of the KServe v2 protocol: codec, raw-ASGI infer route, FastAPI app,
and the connection's own limits and timeouts.

Imports ``dataplane``, ``observability``, ``core`` and ``proto``; never ``grpc``,
``scheduler`` or ``backends``.
"""
