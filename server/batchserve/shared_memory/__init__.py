"""Triton's system and CUDA shared-memory extensions: clients register regions of their
own memory, then name them in inference requests instead of sending tensor bytes.

``manager`` keeps the registered regions, ``system`` and ``cuda`` access one region of each
kind, ``tensors`` reads a request's inputs from them and writes its outputs into them, and
``peers`` tells a client on this host (the only kind that can share memory) from others.
"""
