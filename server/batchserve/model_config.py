"""config.pbtxt <-> the protobuf ModelConfig message (Triton's text format).

Parsing uses protobuf's own text format against ``inference.ModelConfig``, the
same message the gRPC ModelConfig call returns, so there is one schema.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format

from batchserve.errors import ModelConfigError
from batchserve.grpc.generated.model_config_pb2 import ModelConfig, ModelInput, ModelOutput
from batchserve.signature import DYNAMIC, ModelSignature, TensorSpec

CONFIG_FILENAME = "config.pbtxt"


def parse_pbtxt(text: str, *, source: str = CONFIG_FILENAME) -> ModelConfig:
    """Parse config.pbtxt text; errors name the file, line and field at fault."""
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise ModelConfigError(f"{source}: {exc}") from None
    return config


def load_pbtxt(path: Path) -> ModelConfig:
    """Read and parse a config.pbtxt file."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelConfigError(f"{path}: cannot read: {exc}") from None
    return parse_pbtxt(text, source=str(path))


def to_pbtxt(config: ModelConfig) -> str:
    """Render a ModelConfig as config.pbtxt text."""
    return str(text_format.MessageToString(config))


def _config_dims(spec: TensorSpec, batched: bool) -> list[int]:
    dims = spec.shape[1:] if batched else spec.shape
    return [d if d >= 0 else DYNAMIC for d in dims]


def config_from_signature(name: str, signature: ModelSignature, max_batch_size: int) -> ModelConfig:
    """A minimal ModelConfig describing a model file; dims drop the batch axis when batching."""
    batched = max_batch_size > 0
    config = ModelConfig(name=name, max_batch_size=max_batch_size)
    for spec in signature.inputs:
        config.input.append(
            ModelInput(
                name=spec.name,
                data_type=spec.datatype.config,  # type: ignore[arg-type]
                dims=_config_dims(spec, batched),
            )
        )
    for spec in signature.outputs:
        config.output.append(
            ModelOutput(
                name=spec.name,
                data_type=spec.datatype.config,  # type: ignore[arg-type]
                dims=_config_dims(spec, batched),
            )
        )
    return config
