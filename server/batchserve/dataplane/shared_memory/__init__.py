"""Triton's system and CUDA shared-memory extensions: clients register regions of their
own memory, then name them in inference requests instead of sending tensor bytes.

``manager`` keeps the registered regions; ``system`` and ``cuda`` access one region of each
kind; ``parameters`` reads where a tensor's bytes are (all the codecs import); ``tensors``
reads a request's inputs from the regions and writes its outputs into them; ``peers`` tells
a client on this host (the only kind that can share memory) from the others, and ``clients``
admits to the regions only the clients ``--allow-client-shm`` names.
"""
