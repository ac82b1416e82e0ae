"""The wire schema: the KServe v2 / Triton ``.proto`` files and the modules generated from them
(``scripts/gen_protos.py``). ``model_config_pb2`` is also the schema of ``config.pbtxt``.

Imports nothing of batchserve; every layer may import it.
"""
