"""PyTorch (or Keras 3, run as a torch module) -> ONNX (-> TensorRT), each step checked
numerically against the original model.

The command (``batchserve export``) is a thin wrapper over ``export.onnx.export_onnx`` and
``export.tensorrt.export_tensorrt``. This package imports nothing heavy: the CLI imports
``export.command`` for every subcommand, and torch is only loaded when exporting.

Imports ``backends`` (to run what it exported), ``models.model_config``, ``core`` and
``proto``; never the serving path (``runtime``, the adapters, ``dataplane``, ``scheduler``,
the registry).
"""
