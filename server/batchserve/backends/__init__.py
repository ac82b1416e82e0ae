"""The runtimes behind one small interface (``base.Backend``): ONNX Runtime (``onnx*``),
TensorRT (``tensorrt*``) and torch.export (``torch*``), Triton's ``reshape`` around any of
them (``reshape``), the batch sizes the GPU paths plan for (``gpu_plan``), and which runtime
serves a model, from the one table of runtimes (``selection``: ``create_backend``).

Imports ``devices``, ``core`` and ``proto`` only; knows nothing of batching, requests,
protocol adapters, metrics or the model repository. A runtime's package is imported only
when a model needs it.
"""
