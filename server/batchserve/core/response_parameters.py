"""Parameters a backend attaches to every response, known from the model's config alone, so
that a request-handling worker (which has the config, not the backend) attaches them too.

Triton's identity backend sets four on each response to show the feature, and Triton's
L0_backend_identity reads them back over both protocols.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from batchserve.proto.model_config_pb2 import ModelConfig

IDENTITY: Final[Mapping[str, object]] = MappingProxyType(
    {"param0": "an example string parameter", "param1": 42, "param2": False, "param3": 123.123}
)
NONE: Final[Mapping[str, object]] = MappingProxyType({})


def response_parameters(config: ModelConfig) -> Mapping[str, object]:
    """The parameters every response of this model carries (none for most backends)."""
    return IDENTITY if config.backend == "identity" else NONE
