"""What every layer shares: the error hierarchy, element types, the protocol-free request and
response, tensor conversions, model signatures, request validation and the server settings.

Imports nothing of batchserve but ``proto``; everything else may import it.
"""
