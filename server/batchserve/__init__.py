"""batchserve: an inference server for CNN and RNN models speaking the KServe v2 protocol."""

__version__ = "0.1.0"
