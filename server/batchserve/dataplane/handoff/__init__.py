"""Handing decoded requests from request-handling worker processes to the one process that
owns the models, and their outputs back (``--workers N``).

Tensor bytes travel through two shared-memory arenas per worker (``arena.py``): the worker
writes a request's inputs into its request arena, the model-owning process reads them in
place and writes the outputs into the worker's response arena. Only small descriptors
(``frames.py``) cross the socket between them; no tensor data is pickled.
"""
