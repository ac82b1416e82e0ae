"""The machine's devices: which a model instance runs on (``placement``), the CUDA runtime
calls the GPU paths make (``cuda``), and GPU readings through NVML (``nvml``).

Imports ``core`` and ``proto`` only; knows nothing of models, requests or metrics.
"""
