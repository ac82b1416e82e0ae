"""Peers measured beside batchserve on the same machine, through the same perf_analyzer.

``pytriton_serve`` runs inside a separate environment holding nvidia-pytriton (its numpy and
protobuf pins conflict with the project's); ``launch`` finds that environment and measures it.
"""
