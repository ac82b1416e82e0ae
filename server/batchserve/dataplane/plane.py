"""The protocol-free core both adapters call: health, metadata, statistics and inference.
Beside it, each once: repository control and settings (``control.py``), the clients'
shared-memory regions (``shared_memory/clients.py``) and Triton's statistics
(``statistics.py``). Validation, lookup and error typing live here, once.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, Callable
from functools import partial

from batchserve import __version__
from batchserve.core.datatypes import from_config
from batchserve.core.errors import (
    BatchserveError,
    InternalRefusal,
    InvalidArgument,
    NotFound,
    Unavailable,
    decoupled_refusal,
)
from batchserve.core.request_memory import UNBOUNDED, RequestMemory
from batchserve.core.settings import Settings
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
from batchserve.dataplane.control import Control
from batchserve.dataplane.raw_input import raw_request
from batchserve.dataplane.shared_memory import tensors as shm
from batchserve.dataplane.shared_memory.clients import ClientRegions
from batchserve.dataplane.shared_memory.manager import SharedMemoryManager
from batchserve.dataplane.statistics import ModelStatistics, model_statistics
from batchserve.devices.placement import Placement
from batchserve.models import admission
from batchserve.models.ensemble import EnsembleBatcher, takes_sequences
from batchserve.models.ensemble_flow import EnsembleResponder
from batchserve.models.model_names import requested_model_name
from batchserve.models.model_table import ServedVersion, unknown_model
from batchserve.models.placing import as_placed
from batchserve.models.registry import ModelRegistry
from batchserve.models.replies import counted as replies_counted
from batchserve.observability.tracing import RequestTracer
from batchserve.proto.model_config_pb2 import ModelConfig, ModelInput, ModelOutput
from batchserve.scheduler.work import WorkItem

EXTENSIONS = (  # Triton's order (core src/server.cc), less those not served
    "classification",
    "sequence",
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


def _tensor_metadata(spec: ModelInput | ModelOutput, batched: bool) -> TensorMetadata:
    shape = ((-1,) if batched else ()) + tuple(spec.dims)
    return TensorMetadata(spec.name, from_config(spec.data_type).wire, shape)


class DataPlane:
    """One instance per server; every protocol method maps to exactly one call here, or on
    its ``control`` (repository and settings) or ``regions`` (shared-memory regions)."""

    def __init__(
        self,
        settings: Settings,
        registry: ModelRegistry,
        expected: list[str],
        request_memory: RequestMemory | None = None,
    ) -> None:
        """``request_memory``: the process's bound on requests in flight (none: unbounded,
        as for the in-process server, which reads no bodies)."""
        self.settings = settings
        self.request_memory = request_memory or RequestMemory(UNBOUNDED)
        self.registry = registry
        self.expected_models = list(expected)
        self.draining = False
        self.busy_poll = BusyPoll(settings.busy_poll_us * 1000)
        self.shared_memory = SharedMemoryManager()
        self.regions = ClientRegions(settings.allow_client_shm, self.shared_memory)
        self.control = Control(settings, registry)
        self.startup_done = False
        """The models loaded at start have all been tried (set by the runtime)."""
        self.tracing = RequestTracer(self.control.trace, self.control.trace_config)

    # health -------------------------------------------------------------------------
    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        """Ready when not draining and every model is ready (``ModelTable.all_ready``), or
        without Triton's strict readiness, when not draining and the start-up loads have
        ended, as Triton's endpoints only start then."""
        if self.draining:
            return False
        if not self.settings.strict_readiness:
            return self.startup_done
        return self.registry.all_ready(self.expected_models)

    def models_ready(self) -> bool:
        """Every model tried is ready, or was unloaded on request (strict or not)."""
        return self.registry.all_ready(self.expected_models)

    def model_ready(self, name: str, version: str = "") -> bool:
        if not self.registry.knows(requested_model_name(name)):
            raise unknown_model(name)
        return self.registry.is_ready(name, version)

    # metadata -----------------------------------------------------------------------
    def server_metadata(self) -> ServerMetadata:
        return ServerMetadata(self.settings.server_id, __version__, EXTENSIONS)

    def served(self, name: str, version: str) -> ServedVersion:
        """The version a request names; raises as Triton answers (unknown, not ready)."""
        return self.registry.get(requested_model_name(name), version)

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        served = self.served(name, version)
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
        served = self.served(name, version)
        running = [
            Placement(loaded.memory.device, loaded.placement.group) for loaded in served.instances
        ]  # fmt: skip (fallen back: on the CPU)
        return as_placed(served.config, running)

    def model_statistics(self, name: str = "", version: str = "") -> list[ModelStatistics]:
        """Every served version when ``name`` is empty; else that model's (or one version).
        A model or version not being served is Triton's INVALID_ARG, in its words."""
        if not name:
            return model_statistics(self.registry.loaded())
        try:
            model = self.served(name, "")
        except (NotFound, Unavailable):
            raise InvalidArgument(
                f"requested model '{name}' is not available (batchserve: model '{name}' has "
                "no version being served)"
            ) from None
        if not version:
            return model_statistics(self.registry.versions_of(model.name))
        try:
            return model_statistics([self.served(name, version)])
        except (NotFound, Unavailable):
            raise InvalidArgument(
                f"requested model version is not available for model '{name}' (batchserve: "
                f"version {version[:40]} is not being served)"
            ) from None

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
                self.regions.check(peer)
                schema = self.served(model, version).schema
                shm.read_inputs(request, self.shared_memory, schema.input_names)
                shm.check_outputs(request, self.shared_memory)
                shm.hold_while_in_flight(request, self.shared_memory)
            return request
        except (InvalidArgument, NotFound) as exc:
            self.record_malformed(model, version, protocol, exc)
            raise

    def record_malformed(
        self, model: str, version: str, protocol: str, error: BatchserveError
    ) -> None:
        """Count a request that failed before it could be queued against its model, when
        that model is served."""
        served = self.served_or_none(model, version)
        if served is not None:  # received too: in flight is received less answered
            served.stats.received += 1
            served.stats.record_request(False, 0, 0, error, protocol)

    def schema_lookup(self, model: str, version: str) -> SchemaLookup:
        """How a decoder gets the model's request schema: it checks the request's header
        against it before decoding any data, and only when it decodes (``deferred.py``)."""
        return partial(self._schema, model, version)

    def _schema(self, model: str, version: str) -> RequestSchema:
        return self.served(model, version).schema

    def raw_request(self, body: bytes, model: str, version: str) -> InferRequest:
        """Triton's raw binary HTTP request: the body is the served model's one input."""
        return raw_request(body, self.served(model, version).config, model, version)

    def served_or_none(self, model: str, version: str) -> ServedVersion | None:
        try:
            return self.served(model, version)
        except BatchserveError:
            return None

    async def infer(self, request: InferRequest) -> InferResponse:
        # Draining only turns readiness off: requests keep being served until the listeners
        # close, so load balancers have the shutdown delay to stop sending traffic.
        served = self.served(request.model_name, request.model_version)
        if served.responder is not None:
            if not served.config.model_transaction_policy.decoupled:
                return await self._answered_once(request, served, stream=False)
            refused = decoupled_refusal(request.protocol)
            self.record_malformed(request.model_name, request.model_version, request.protocol,
                                  refused)  # fmt: skip
            raise refused
        self.busy_poll.touch()
        started = time.monotonic_ns()
        served.stats.received += 1
        types = served.output_types
        try:
            item = self._work_item(request, served, started)
            classes = requested_counts(request.outputs, types)  # names checked by _work_item
            if self.tracing.on:
                self.tracing.watch(item)  # its queue and compute spans, once answered
            served.batcher.submit(item)
            tensors = [Tensor(n, types[n], a.shape, a) for n, a in (await item.future).items()]
            if classes:
                batched = served.config.max_batch_size > 0
                tensors = await classify_outputs(tensors, classes, served.labels, batched=batched)
            response = self._response(request, served, tensors)
        except BaseException as exc:
            self.record_failure(served, started, exc, request.protocol, request.id)
            raise
        self.busy_poll.touch()
        self.record_success(served, started, item, request.protocol)
        return response

    async def respond(
        self, request: InferRequest, streaming: bool = True, every: bool = False
    ) -> AsyncGenerator[InferResponse, None]:
        """Every response to a request: one from a model that answers once, any number from
        a decoupled model (``scheduler/responders.py``), the last marked final. A decoupled
        model's bare final flag is a response without outputs, sent only when the request
        asked for one (``empty_final``). ``streaming``: whether the client reads them as they
        come. ``every``: all a built-in backend's model sends even when it is not decoupled,
        as Triton's generate endpoints, which ignore the transaction policy, relay them."""
        served = self.served(request.model_name, request.model_version)
        if served.responder is None:
            yield await self.infer(request)
        elif every or served.config.model_transaction_policy.decoupled:
            replies = self._replies(request, served, streaming, request.empty_final)
            async with contextlib.aclosing(replies):
                async for response in replies:
                    yield response
        else:
            yield await self._answered_once(request, served, stream=True)

    async def _answered_once(
        self, request: InferRequest, served: ServedVersion, stream: bool
    ) -> InferResponse:
        """A built-in backend's model that is not decoupled (Triton's QA serves repeat so):
        its replies are read to the last, as Triton's front ends answer at the final flag.
        HTTP infer and ModelInfer need exactly one; a stream sends the first and drops the
        rest (its handler keeps one response object), none being the same error."""
        first: InferResponse | None = None
        count = 0
        replies = self._replies(request, served, streaming=False, empty_final=False)
        async with contextlib.aclosing(replies):
            async for response in replies:
                count += 1
                if count == 1:
                    first = response
        if first is None or (count != 1 and not stream):
            raise InternalRefusal(f"expected a single response, got {count}")
        return first

    async def _replies(
        self, request: InferRequest, served: ServedVersion, streaming: bool, empty_final: bool
    ) -> AsyncGenerator[InferResponse, None]:
        """A responder's replies as responses, counted into the model's statistics."""
        responder = served.responder
        assert responder is not None, "only models of a built-in backend have replies"
        self.busy_poll.touch()
        started = time.monotonic_ns()
        served.stats.received += 1
        types = served.output_types
        try:
            _check_sequence(request, served)  # a decoupled model's requests too (generate)
            valid = validate_request(
                request.inputs, request.outputs, served.schema, request.layout, request.verdict
            )
            if isinstance(responder, EnsembleResponder):  # its steps take the whole request
                item = self.work_item(served, valid, request.priority, request.timeout_us,
                                      started, request.is_cancelled)  # fmt: skip
                item.sequence = request.sequence
                replies = responder.replies_to(item, streaming)
            else:
                replies = responder.replies(valid.inputs, request.is_cancelled, streaming)
        except BaseException as exc:
            self.record_failure(served, started, exc, request.protocol, request.id)
            raise
        counted = replies_counted(served, replies, started, request.protocol, request.id,
                                  empty_final)  # fmt: skip
        async with contextlib.aclosing(counted):
            async for reply in counted:
                tensors = [
                    Tensor(n, types[n], reply.outputs[n].shape, reply.outputs[n])
                    for n in valid.output_names
                    if n in reply.outputs
                ]
                response = self._response(request, served, tensors)
                response.final = reply.final
                yield response

    record_success = staticmethod(admission.record_success)
    record_failure = staticmethod(admission.record_failure)
    work_item = staticmethod(admission.work_item)

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
        if served.schema.response_parameters:
            response.parameters = dict(served.schema.response_parameters)
        placements = shm.output_placements(request.outputs)
        if placements:
            shm.write_outputs(response.outputs, placements, self.shared_memory)
        return response

    def _work_item(self, request: InferRequest, served: ServedVersion, now: int) -> WorkItem:
        _check_sequence(request, served)
        valid = validate_request(
            request.inputs, request.outputs, served.schema, request.layout, request.verdict
        )
        item = self.work_item(served, valid, request.priority, request.timeout_us, now,
                              request.is_cancelled)  # fmt: skip
        item.sequence = request.sequence
        return item


def _check_sequence(request: InferRequest, served: ServedVersion) -> None:
    """Sequence parameters only to a model that batches sequences: elsewhere they would be
    silently ignored (they were, through ``generate`` and to decoupled models)."""
    if request.sequence is not None and not takes_sequences(served.batcher):
        detail = (
            "nor does any step of the ensemble"
            if isinstance(served.batcher, EnsembleBatcher)
            else "its config has no sequence_batching"
        )
        raise InvalidArgument(
            f"request parameter 'sequence_id': model '{served.name}' does not use "
            f"sequence batching ({detail})"
        )
