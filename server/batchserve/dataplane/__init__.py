"""The protocol-free service both adapters call once per request: health, metadata,
statistics, inference (with classification, raw inputs and shared memory) and the runtime
settings Triton exposes.

Imports ``models`` and everything below it; never ``rest``, ``grpc`` or ``runtime``.
"""
