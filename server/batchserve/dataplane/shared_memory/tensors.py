"""Inputs read from, and outputs written to, the regions their parameters name.

The codecs only carry a tensor's shared-memory parameters (``parameters``; an input's data
is a placeholder until ``read_inputs`` fills it); the words of the errors are Triton's
(``src/grpc/grpc_utils.h`` ``ParseSharedMemoryParams``, ``src/http_server.cc``).
"""

from __future__ import annotations

import weakref
from collections.abc import Collection, Sequence

from batchserve.core.errors import InvalidArgument
from batchserve.core.tensors import (
    MAX_BYTES,
    InputDataError,
    array_from_bytes,
    array_to_bytes,
    check_byte_size,
)
from batchserve.core.types import InferRequest, RequestedOutput, Tensor
from batchserve.dataplane.shared_memory.manager import SharedMemoryManager
from batchserve.dataplane.shared_memory.parameters import REGION, Placement, placement


def uses_shared_memory(request: InferRequest) -> bool:
    """True when an input or a requested output names a region (cheap: parameters are
    usually empty)."""
    return any(REGION in t.parameters for t in request.inputs) or any(
        REGION in o.parameters for o in request.outputs or ()
    )


def read_inputs(
    request: InferRequest, manager: SharedMemoryManager, input_names: Collection[str]
) -> None:
    """Replace each shared-memory input's placeholder by a copy of its region's bytes.

    Everything a client controls is checked before a byte is read: the input must be one of
    the model's, a fixed-size input's byte size must be what its shape takes, and the
    request's regions together may hold at most MAX_BYTES. A size that does not match its
    shape is named with the model, in Triton's words.
    """
    try:
        _read_inputs(request, manager, input_names)
    except InputDataError as mismatch:
        raise mismatch.for_model(request.model_name) from None


def _read_inputs(
    request: InferRequest, manager: SharedMemoryManager, input_names: Collection[str]
) -> None:
    placed = [
        (t, placement(t.parameters, t.name)) for t in request.inputs if REGION in t.parameters
    ]
    total = 0
    for tensor, where in placed:
        assert where is not None
        if tensor.name not in input_names:
            raise InvalidArgument(
                f"unexpected inference input '{tensor.name}' for model '{request.model_name}'"
            )
        if tensor.datatype.wire != "BYTES":
            check_byte_size(where.byte_size, tensor.datatype, tensor.shape, tensor=tensor.name)
        total += where.byte_size
        if total > MAX_BYTES:
            raise InvalidArgument(
                f"the request's shared-memory inputs hold over {MAX_BYTES} bytes together"
            )
    for tensor, where in placed:
        assert where is not None
        region = manager.region(where.region, where.offset, where.byte_size)
        data = region.read(where.offset, where.byte_size, tensor.name)
        tensor.data = array_from_bytes(data, tensor.datatype, tensor.shape, tensor=tensor.name)


def hold_while_in_flight(request: InferRequest, manager: SharedMemoryManager) -> None:
    """Hold the regions the request names until the request object is gone, whichever way
    it ends (answered, failed, cancelled, its client gone), so that unregistering one
    meanwhile waits for it, as in Triton. Call once its regions were checked."""
    names = [t.parameters[REGION] for t in request.inputs if REGION in t.parameters]
    names += [o.parameters[REGION] for o in request.outputs or () if REGION in o.parameters]
    manager.hold(names)
    weakref.finalize(request, manager.release, names)


def output_placements(outputs: Sequence[RequestedOutput] | None) -> dict[str, Placement]:
    """The requested outputs to be written into shared memory, by name."""
    found: dict[str, Placement] = {}
    for output in outputs or ():
        where = placement(output.parameters, output.name)
        if where is not None:
            found[output.name] = where
    return found


def check_outputs(request: InferRequest, manager: SharedMemoryManager) -> None:
    """Refuse, before the model runs, outputs whose region is unknown or too short."""
    for where in output_placements(request.outputs).values():
        manager.region(where.region, where.offset, where.byte_size)


def write_outputs(
    outputs: list[Tensor], placements: dict[str, Placement], manager: SharedMemoryManager
) -> None:
    """Copy each output placed in shared memory there and mark it so the codecs send no data."""
    for tensor in outputs:
        where = placements.get(tensor.name)
        if where is None:
            continue
        raw = array_to_bytes(tensor.data, tensor.datatype, tensor=tensor.name)
        size = memoryview(raw).nbytes
        if size > where.byte_size:
            raise InvalidArgument(
                f"shared memory size specified with the request for output '{tensor.name}' "
                f"({where.byte_size} bytes) should be at least {size} bytes to hold the results"
            )
        region = manager.region(where.region, where.offset, where.byte_size)
        region.write(where.offset, raw, tensor.name)
        tensor.in_shared_memory = True
