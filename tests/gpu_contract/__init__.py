"""GPU contract tests: the project's GPU code through the real GPU packages over stub libraries.

Run by ``make gpu-contract`` in their own virtualenv (onnxruntime-gpu, cuda-python,
nvidia-ml-py, TensorRT 10 and 11), never by the unit suite.
"""
