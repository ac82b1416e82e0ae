"""The HTTP/REST side of the KServe v2 protocol: codec, raw-ASGI infer route, FastAPI app."""
