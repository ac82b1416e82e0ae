"""The protocol-free core both adapters call: health, metadata, statistics, inference and
repository control. Validation, lookup, error typing and statistics live here, once.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial

from batchserve import __version__
from batchserve.core.datatypes import from_config
from batchserve.core.errors import (
    BatchserveError,
    ControlDisabled,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unauthenticated,
)
from batchserve.core.settings import ClientShm, ModelControlMode, Settings
from batchserve.core.types import (
    InferRequest,
    InferResponse,
    ModelMetadata,
    ServerMetadata,
    Tensor,
    TensorMetadata,
)
from batchserve.core.validation import RequestSchema, SchemaLookup, validate_request
from batchserve.dataplane.busy_poll import BusyPoll
from batchserve.dataplane.classification import classify_outputs, requested_counts
from batchserve.dataplane.raw_input import raw_request
from batchserve.dataplane.shared_memory import tensors as shm
from batchserve.dataplane.shared_memory.manager import Kind, RegionStatus, SharedMemoryManager
from batchserve.dataplane.shared_memory.peers import is_local
from batchserve.models.load_override import parse_load_parameters, parse_unload_parameters
from batchserve.models.model_names import requested_model_name, validate_model_name
from batchserve.models.model_table import IndexEntry, InstanceMemory, ServedVersion, unknown_model
from batchserve.models.registry import ModelRegistry
from batchserve.observability import log_settings
from batchserve.observability.log_settings import Answer as LogAnswer
from batchserve.observability.logs import bind_request
from batchserve.observability.stats import ModelStats
from batchserve.observability.trace_settings import Answer as TraceAnswer
from batchserve.observability.trace_settings import TraceSettings
from batchserve.observability.trace_settings import Update as TraceUpdate
from batchserve.proto.model_config_pb2 import ModelConfig, ModelInput, ModelOutput
from batchserve.scheduler.work import WorkItem

SERVER_NAME = "triton"
"""Triton's own name: NVIDIA's health/metadata examples fail on any other (the version says
which server this is)."""
EXTENSIONS = (  # Triton's order (core src/server.cc), less those not served
    "classification",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "cuda_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
)


@dataclass(frozen=True, slots=True)
class VersionStats:
    """Statistics of one served version, for the statistics endpoints."""

    name: str
    version: str
    stats: ModelStats
    batch_cap: int
    memory: tuple[InstanceMemory, ...]


def _tensor_metadata(spec: ModelInput | ModelOutput, batched: bool) -> TensorMetadata:
    shape = ((-1,) if batched else ()) + tuple(spec.dims)
    return TensorMetadata(spec.name, from_config(spec.data_type).wire, shape)


class DataPlane:
    """One instance per server; every protocol method maps to exactly one call here."""

    def __init__(self, settings: Settings, registry: ModelRegistry, expected: list[str]) -> None:
        self.settings = settings
        self.registry = registry
        self.expected_models = list(expected)
        self.draining = False
        self.busy_poll = BusyPoll(settings.busy_poll_us * 1000)
        self.trace = TraceSettings()
        self.shared_memory = SharedMemoryManager()

    # health -------------------------------------------------------------------------
    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        """Ready when not draining and every model the server was told to serve is ready."""
        return not self.draining and all(self.registry.is_ready(m) for m in self.expected_models)

    def model_ready(self, name: str, version: str = "") -> bool:
        if not self.registry.knows(requested_model_name(name)):
            raise unknown_model(name)
        return self.registry.is_ready(name, version)

    # metadata -----------------------------------------------------------------------
    def server_metadata(self) -> ServerMetadata:
        return ServerMetadata(SERVER_NAME, __version__, EXTENSIONS)

    def _served(self, name: str, version: str) -> ServedVersion:
        return self.registry.get(requested_model_name(name), version)

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        served = self._served(name, version)
        config = served.config
        batched = config.max_batch_size > 0
        return ModelMetadata(
            name=served.name,
            versions=tuple(str(v.version) for v in self.registry.versions_of(served.name)),
            platform=config.platform,
            inputs=tuple(_tensor_metadata(spec, batched) for spec in config.input),
            outputs=tuple(_tensor_metadata(spec, batched) for spec in config.output),
        )

    def model_config(self, name: str, version: str = "") -> ModelConfig:
        return self._served(name, version).config

    def model_statistics(self, name: str = "", version: str = "") -> list[VersionStats]:
        """Every served version when ``name`` is empty; else that model's (or one version)."""
        if name:
            served = (
                [self._served(name, version)]
                if version
                else self.registry.versions_of(self._served(name, "").name)
            )
        else:
            served = self.registry.loaded()
        return [
            VersionStats(s.name, str(s.version), s.stats, s.batcher.cap, s.memory) for s in served
        ]

    # inference ----------------------------------------------------------------------
    def decode(
        self,
        decode: Callable[[], InferRequest],
        model: str,
        version: str,
        protocol: str,
        peer: str | None = None,
    ) -> InferRequest:
        """Run a wire decoder, then read the inputs held in shared memory, counting a malformed
        request (or one naming an unknown region) against its model when served. ``peer`` is
        the client's address: naming a region is allowed to those that may register one."""
        try:
            request = decode()
            if shm.uses_shared_memory(request):
                self._check_client_shm(peer)
                schema = self._served(model, version).schema
                shm.read_inputs(request, self.shared_memory, schema.input_names)
                shm.check_outputs(request, self.shared_memory)
            return request
        except (InvalidArgument, NotFound) as exc:
            served = self._served_or_none(model, version)
            if served is not None:  # received too: in flight is received less answered
                served.stats.received += 1
                served.stats.record_request(False, 0, 0, exc, protocol)
            raise

    def schema_lookup(self, model: str, version: str) -> SchemaLookup:
        """How a decoder gets the model's request schema: it checks the request's header
        against it before decoding any data, and only when it decodes (``deferred.py``)."""
        return partial(self._schema, model, version)

    def _schema(self, model: str, version: str) -> RequestSchema:
        return self._served(model, version).schema

    def raw_request(self, body: bytes, model: str, version: str) -> InferRequest:
        """Triton's raw binary HTTP request: the body is the served model's one input."""
        return raw_request(body, self._served(model, version).config, model, version)

    def _served_or_none(self, model: str, version: str) -> ServedVersion | None:
        try:
            return self._served(model, version)
        except BatchserveError:
            return None

    async def infer(self, request: InferRequest) -> InferResponse:
        # Draining only turns readiness off: requests keep being served until the listeners
        # close, so load balancers have the shutdown delay to stop sending traffic.
        served = self._served(request.model_name, request.model_version)
        self.busy_poll.touch()
        started = time.monotonic_ns()
        served.stats.received += 1
        types = served.output_types
        try:
            item = self._work_item(request, served, started)
            classes = requested_counts(request.outputs, types)  # names checked by _work_item
            served.batcher.submit(item)
            tensors = [Tensor(n, types[n], a.shape, a) for n, a in (await item.future).items()]
            if classes:
                batched = served.config.max_batch_size > 0
                tensors = await classify_outputs(tensors, classes, served.labels, batched=batched)
            response = self._response(request, served, tensors)
        except BaseException as exc:
            elapsed = time.monotonic_ns() - started
            served.stats.record_request(False, elapsed, 0, exc, request.protocol)
            bind_request(served.name, request.id)
            raise
        self.busy_poll.touch()
        finished = time.monotonic_ns()
        served.stats.record_request(
            True, finished - started, item.dispatched_ns - started, protocol=request.protocol
        )
        return response

    def _response(
        self, request: InferRequest, served: ServedVersion, tensors: list[Tensor]
    ) -> InferResponse:
        """The response; outputs the client placed in shared memory are written there."""
        response = InferResponse(
            model_name=served.name,
            model_version=str(served.version),
            id=request.id,
            outputs=tensors,
        )
        placements = shm.output_placements(request.outputs)
        if placements:
            shm.write_outputs(response.outputs, placements, self.shared_memory)
        return response

    def _work_item(self, request: InferRequest, served: ServedVersion, now: int) -> WorkItem:
        valid = validate_request(
            request.inputs, request.outputs, served.schema, request.layout, request.verdict
        )
        policy = served.batcher.policy
        if policy.max_batch_size and valid.batch_size > policy.max_batch_size:
            raise InvalidArgument(
                f"batch of {valid.batch_size} samples exceeds the batch cap of model "
                f"'{served.name}' ({policy.max_batch_size}, derived from its memory budget); "
                "send smaller batches"
            )
        priority = request.priority or policy.default_priority
        if not 1 <= priority <= policy.priority_levels:
            raise InvalidArgument(
                f"parameter 'priority': {request.priority} is outside 1..{policy.priority_levels}"
            )
        timeout_ns = policy.default_timeout_ns
        if request.timeout_us and (policy.allow_timeout_override or not timeout_ns):
            requested = request.timeout_us * 1000
            timeout_ns = min(timeout_ns, requested) if timeout_ns else requested
        return WorkItem(
            inputs=valid.inputs,
            batch_size=valid.batch_size,
            output_names=valid.output_names,
            priority=priority,
            enqueued_ns=now,
            deadline_ns=now + timeout_ns if timeout_ns else None,
            future=asyncio.get_running_loop().create_future(),
            is_cancelled=request.is_cancelled,
        )

    # shared memory ------------------------------------------------------------------
    def _check_client_shm(self, peer: str | None) -> None:
        """Registering names the server's host or GPU memory: allowed to the clients
        ``--allow-client-shm`` admits (by default those on this host)."""
        mode = self.settings.allow_client_shm
        if mode is ClientShm.TRUE or (mode is ClientShm.LOCAL and is_local(peer)):
            return
        why = (
            f"; batchserve admits only clients on this host (--allow-client-shm=local), "
            f"and this one is {peer or 'unknown'}"
            if mode is ClientShm.LOCAL
            else ""
        )
        raise PermissionDenied(
            "Client shared memory is disabled. Start the server with "
            f"'--allow-client-shm=true' to enable.{why}"
        )

    def register_system_shared_memory(
        self, name: str, key: str, offset: int, byte_size: int, peer: str | None
    ) -> None:
        self._check_client_shm(peer)
        self.shared_memory.register_system(name, key, offset, byte_size)

    def register_cuda_shared_memory(
        self, name: str, raw_handle: bytes, device_id: int, byte_size: int, peer: str | None
    ) -> None:
        self._check_client_shm(peer)
        self.shared_memory.register_cuda(name, raw_handle, device_id, byte_size)

    def unregister_shared_memory(self, kind: Kind, name: str, peer: str | None) -> None:
        """One region, or every region of ``kind`` when ``name`` is empty."""
        self._check_client_shm(peer)
        self.shared_memory.unregister(kind, name)

    def shared_memory_status(
        self, kind: Kind, name: str = "", peer: str | None = None
    ) -> list[RegionStatus]:
        """The regions, to the clients that may register them; to others none (as Triton
        answers when client shared memory is off)."""
        try:
            self._check_client_shm(peer)
        except PermissionDenied:
            return []
        return self.shared_memory.status(kind, name)

    # repository ---------------------------------------------------------------------
    def check_token(self, token: str | None) -> None:
        expected = self.settings.control_token
        if expected is not None and not hmac.compare_digest(token or "", expected):
            raise Unauthenticated("model control and settings updates need a valid token")

    def check_control(self, token: str | None) -> None:
        """Model control is on and the token good: checked before a load's body is read."""
        if self.settings.model_control_mode is not ModelControlMode.EXPLICIT:
            # Triton's status and words (model_repository_manager.cc), then ours.
            raise ControlDisabled(
                "explicit model load / unload is not allowed if polling is enabled "
                "(batchserve: model control is disabled; start the server with "
                "--model-control-mode explicit)"
            )
        self.check_token(token)

    def repository_index(self, token: str | None, ready_only: bool = False) -> list[IndexEntry]:
        """Answered in every control mode, as Triton does; the token still guards it."""
        self.check_token(token)
        return self.registry.index(ready_only)

    async def repository_load(
        self,
        name: str,
        token: str | None,
        parameters: Mapping[str, object] | None = None,
        *,
        files_in_base64: bool = False,
    ) -> None:
        """Load with Triton's parameters (``load_override``); errors open with Triton's
        "failed to load '<name>'", which Triton's own examples look for."""
        self.check_control(token)
        validate_model_name(name)
        try:
            override = parse_load_parameters(
                parameters or {},
                files_in_base64=files_in_base64,
                max_total_bytes=self.settings.max_binary_body_bytes,
            )
        except BatchserveError as exc:
            raise _reworded(exc, f"failed to load '{name}', {POLL_FAILED}") from None
        try:
            await self.registry.load(name, override)
        except BatchserveError as exc:
            polled = not isinstance(exc, (InvalidArgument, NotFound))
            raise _reworded(
                exc, f"failed to load '{name}'" + ("" if polled else f", {POLL_FAILED}")
            ) from None

    async def repository_unload(
        self, name: str, token: str | None, parameters: Mapping[str, object] | None = None
    ) -> None:
        """``unload_dependents`` is checked and accepted; batchserve has no dependents."""
        self.check_control(token)
        parse_unload_parameters(parameters or {})
        await self.registry.unload(validate_model_name(name))
        self.trace.forget(name)

    # trace and log settings ------------------------------------------------------------
    def trace_settings(
        self, model: str, token: str | None, updates: TraceUpdate | None = None
    ) -> TraceAnswer:
        """A model's settings exist while it is ready (Triton's check and words)."""
        if model and not self.registry.is_ready(validate_model_name(model)):
            raise InvalidArgument(f"Request for unknown model : {model}")
        if updates is None:
            return self.trace.get(model)
        self.check_token(token)
        return self.trace.update(updates, model)

    def log_settings(
        self, token: str | None, updates: Mapping[str, object] | None = None
    ) -> LogAnswer:
        if updates is None:
            return log_settings.get()
        self.check_token(token)
        return log_settings.update(updates)


# Triton's words for a load that failed before any runtime ran (model_repository_manager.cc).
POLL_FAILED = "failed to poll from model repository"


def _reworded(error: BatchserveError, prefix: str) -> BatchserveError:
    """The same error with Triton's opening ("failed to load 'm'"), which clients look for."""
    error.message = f"{prefix}: {error.message}"
    error.args = (error.message,)
    return error
