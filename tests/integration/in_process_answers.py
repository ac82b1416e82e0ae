"""What ``batchserve.Server`` answers for the requests ``test_in_process.py`` also sends over
HTTP, printed as JSON.

Run as its own process (``python -m tests.integration.in_process_answers IMAGES.npy``): the
server's protobuf modules cannot share a process with tritonclient's, which the rest of the
integration suite imports.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import batchserve
import numpy as np
from batchserve.core.errors import BatchserveError
from batchserve.core.types import TensorMetadata
from batchserve.rest.responses import message_json

from tests.integration.in_process_mistakes import DIGITS, MISTAKES
from tests.integration.server import MODEL_REPO


def _tensor(tensor: TensorMetadata) -> dict[str, Any]:
    return {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}


def answers(images: np.ndarray) -> dict[str, Any]:
    with batchserve.Server(model_repository=MODEL_REPO, model_control_mode="explicit",
                           load_model=[DIGITS, "square_int32"]) as server:  # fmt: skip
        metadata = server.model_metadata(DIGITS)
        errors = {}
        for name, (model, inputs, options) in MISTAKES.items():
            arrays = {k: np.zeros(shape, dtype) for k, (dtype, shape) in inputs.items()}
            try:
                server.infer_sync(model, arrays, **options)
            except BatchserveError as error:
                errors[name] = [type(error).__name__, error.message]
        outputs = server.infer_sync(DIGITS, {"image": images})
        return {
            "ready": server.ready(),
            "metadata": {
                "name": metadata.name,
                "versions": list(metadata.versions),
                "platform": metadata.platform,
                "inputs": [_tensor(t) for t in metadata.inputs],
                "outputs": [_tensor(t) for t in metadata.outputs],
            },
            "config": message_json(server.model_config(DIGITS)),
            "outputs": {name: array.tolist() for name, array in outputs.items()},
            "errors": errors,
        }


if __name__ == "__main__":
    json.dump(answers(np.load(Path(sys.argv[1]))), sys.stdout)
