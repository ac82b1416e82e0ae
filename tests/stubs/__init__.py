"""Stub GPU libraries for tests on machines without a GPU: the NVML stub the unit tests compile
on the spot, and the generator of the CUDA/cuDNN/TensorRT stubs the GPU contract tests use."""
