"""Python client for batchserve and other KServe v2 / Triton inference servers.

from batchserve_client import Client

with Client("http://localhost:8000") as client:      # or "grpc://localhost:8001"
    result = client.infer("digits_cnn", {"image": images}, outputs=["probabilities"])
    result["probabilities"]                           # a numpy array
"""

from batchserve_client.aio import AsyncClient
from batchserve_client.client import Client
from batchserve_client.errors import (
    BatchserveClientError,
    Cancelled,
    ConnectionLost,
    DeadlineExceeded,
    Internal,
    InvalidArgument,
    InvalidResponse,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
    Unimplemented,
)
from batchserve_client.results import InferResult, ModelMetadata, ServerMetadata, TensorMetadata
from batchserve_client.retry import DEFAULT_RETRY, NO_RETRY, RetryEvent, RetryPolicy
from batchserve_client.tls import TlsConfig

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_RETRY",
    "NO_RETRY",
    "AsyncClient",
    "BatchserveClientError",
    "Cancelled",
    "Client",
    "ConnectionLost",
    "DeadlineExceeded",
    "InferResult",
    "Internal",
    "InvalidArgument",
    "InvalidResponse",
    "ModelMetadata",
    "NotFound",
    "PayloadTooLarge",
    "PermissionDenied",
    "RetryEvent",
    "RetryPolicy",
    "ServerMetadata",
    "TensorMetadata",
    "TlsConfig",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "__version__",
]
