"""A model's life: the repository on disk, ``config.pbtxt`` parsed, completed and validated,
the model file's signature, the memory probe and warm-up at load, and the registry that holds
the loaded versions and their schedulers.

Imports ``scheduler``, ``backends``, ``observability``, ``devices``, ``core`` and ``proto``;
never a protocol adapter or the dataplane.
"""
