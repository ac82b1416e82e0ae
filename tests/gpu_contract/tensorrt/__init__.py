"""TensorRT contract tests, run once with TensorRT 10's Python API and once with 11's."""
