"""The GRPCInferenceService: each method decodes, calls the dataplane once, encodes.

Errors are mapped in one place, ``ErrorInterceptor``, for every method.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from functools import partial
from typing import Any, TypeAlias, cast

import grpc

from batchserve.core.errors import NotFound, Unavailable, public_message
from batchserve.core.intake import Intake
from batchserve.core.request_memory import Ticket
from batchserve.core.types import InferRequest
from batchserve.dataplane.inference_path import InferencePath
from batchserve.dataplane.plane import DataPlane
from batchserve.grpc import codec, messages
from batchserve.grpc.call_limit import CallLimit
from batchserve.grpc.failures import report_failure
from batchserve.grpc.head import METHODS, Request, read, wire_bytes
from batchserve.grpc.layout_cache import MessageLayouts
from batchserve.grpc.message_limits import Refusal, bounded
from batchserve.grpc.streams import SHUTTING_DOWN, InferStreams
from batchserve.observability import request_trace
from batchserve.proto import grpc_service_pb2 as pb
from batchserve.proto import grpc_service_pb2_grpc as pb_grpc

Context = grpc.aio.ServicerContext[Any, Any]
DoneCallback: TypeAlias = "grpc.aio.DoneCallback[Any, Any]"  # a class in the stubs alone
FINAL_RESPONSE = "triton_final_response"
"""Set on every response of a stream: false on all but a request's last (perf_analyzer
and Triton's clients read the end of a decoupled model's responses from it)."""


def _authorization(context: Context) -> str | None:
    """The call's ``authorization`` metadata, as sent: the dataplane reads its token."""
    for key, value in context.invocation_metadata() or ():
        if key == "authorization" and isinstance(value, str):
            return value
    return None


def _choices(parameters: Mapping[str, Any], oneof: str) -> dict[str, object]:
    """Each parameter's oneof value; None where none is set (Triton's client sends that
    for "clear" or "leave as is")."""
    values: dict[str, object] = {}
    for key, parameter in parameters.items():
        choice = parameter.WhichOneof(oneof)
        values[key] = getattr(parameter, choice) if choice else None
    return values


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    """Translation only: no validation, lookup or error handling here."""

    def __init__(self, dataplane: DataPlane, intake: Intake | None = None) -> None:
        """``intake``: the server's, which its stop closes; none, one that stays open."""
        self.dataplane = dataplane
        self.inference: InferencePath = dataplane
        self.control = dataplane.control
        self.regions = dataplane.regions
        self.layouts = MessageLayouts()
        self.intake = intake or Intake()
        self.streams = InferStreams(self.intake)

    def peer(self, context: Context) -> str:
        """The client's address, for the calls only local clients may make."""
        return context.peer()

    async def ServerLive(
        self, request: pb.ServerLiveRequest, context: Context
    ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.dataplane.live())

    async def ServerReady(
        self, request: pb.ServerReadyRequest, context: Context
    ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.dataplane.ready())

    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: Context
    ) -> pb.ModelReadyResponse:
        """A model this server has never heard of is not ready, and no error: Triton's
        answer, which its clients and KServe's read as ``False`` (HTTP answers 404)."""
        try:
            ready = self.dataplane.model_ready(request.name, request.version)
        except NotFound:
            ready = False
        return pb.ModelReadyResponse(ready=ready)

    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: Context
    ) -> pb.ServerMetadataResponse:
        return messages.server_metadata(self.dataplane.server_metadata())

    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: Context
    ) -> pb.ModelMetadataResponse:
        return messages.model_metadata(self.dataplane.model_metadata(request.name, request.version))

    async def ModelConfig(
        self, request: pb.ModelConfigRequest, context: Context
    ) -> pb.ModelConfigResponse:
        return pb.ModelConfigResponse(
            config=self.dataplane.model_config(request.name, request.version)
        )

    async def ModelStatistics(
        self, request: pb.ModelStatisticsRequest, context: Context
    ) -> pb.ModelStatisticsResponse:
        return messages.statistics(self.dataplane.model_statistics(request.name, request.version))

    async def ModelInfer(self, request: Request, context: Context) -> pb.ModelInferResponse:
        """Served, ``request`` is a head (``head.py``): its typed contents not yet parsed;
        refused once the stop has begun, as Triton's infer handler refuses it."""
        if not self.intake.open:
            raise Unavailable(SHUTTING_DOWN)
        ticket = self.inference.request_memory.ticket()
        ticket.take(wire_bytes(request))  # grpc read the message before this: refused, it goes
        try:
            if self.inference.tracing.on:
                answer = await self._traced(request, context, ticket)
            else:
                answer = await self._infer(request, self.peer(context), ticket)
        except BaseException:
            ticket.close()
            raise
        # Counted until the call ends: an answer its client does not read stays in grpc core.
        context.add_done_callback(cast("DoneCallback", lambda _: ticket.close()))
        return answer

    async def _traced(
        self, request: Request, context: Context, ticket: Ticket
    ) -> pb.ModelInferResponse:
        """``_infer`` under a trace, when the trace settings sample this request; its
        caller's trace context comes as W3C ``traceparent`` metadata."""
        metadata = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
        trace = self.inference.tracing.begin("grpc", request.model_name, metadata.get)
        if trace is None:
            return await self._infer(request, self.peer(context), ticket)
        try:
            answer = await self._infer(request, self.peer(context), ticket)
        except BaseException as exc:
            trace.failed(exc)
            trace.finish()  # no answer to send: written now, whatever the mode
            raise
        if trace.sent_at_call_end:  # a trace file's: it has the answer's send
            trace.leave()
            context.add_done_callback(cast("DoneCallback", lambda _: trace.finish()))
        else:
            trace.finish()
        return answer

    def _decoded(self, request: Request, peer: str | None) -> InferRequest:
        model, version = request.model_name, request.model_version
        schema = self.inference.schema_lookup(model, version)
        decode = partial(self.layouts.decode, request, schema)
        return self.inference.decode(decode, model, version, "grpc", peer)

    async def _infer(
        self, request: Request, peer: str | None, ticket: Ticket
    ) -> pb.ModelInferResponse:
        """The answer to a unary call; ``ticket`` holds its bytes from here on (read off the
        outputs: protobuf's ``ByteSize`` serializes the message to count it, 55 ms for a
        16 MiB answer here)."""
        if self.inference.tracing.on and (trace := request_trace.current()) is not None:
            return await self._infer_traced(request, peer, trace, ticket)
        response = await self.inference.infer(self._decoded(request, peer))
        ticket.hold(codec.answer_bytes(response))
        encoded: pb.ModelInferResponse = codec.encode_infer_response(response)
        return encoded

    async def _infer_traced(
        self, request: Request, peer: str | None, trace: request_trace.RequestTrace, ticket: Ticket
    ) -> pb.ModelInferResponse:
        decoded = self._decoded(request, peer)
        trace.mark("decode")
        trace.decoded(decoded)
        response = await self.inference.infer(decoded)
        trace.mark("infer")
        trace.answered(response)
        ticket.hold(codec.answer_bytes(response))
        encoded: pb.ModelInferResponse = codec.encode_infer_response(response)
        trace.mark("encode")
        return encoded

    async def _responses(
        self, request: Request, peer: str | None, trace: request_trace.RequestTrace | None
    ) -> AsyncGenerator[pb.ModelInferResponse, None]:
        """A stream request's responses, each flagged final or not, as Triton flags them;
        ``trace`` marks its phases, its last response ending them."""
        decoded = self._decoded(request, peer)
        if trace is not None:
            trace.mark("decode")
            trace.decoded(decoded)
        async for response in self.inference.respond(decoded):
            if trace is not None and response.final:
                trace.mark("infer")
                trace.answered(response)
            encoded: pb.ModelInferResponse = codec.encode_infer_response(response)
            encoded.parameters[FINAL_RESPONSE].bool_param = response.final
            if trace is not None and response.final:
                trace.mark("encode")
            yield encoded

    async def _counted_responses(
        self, request: Request, peer: str | None, metadata: dict[str, str]
    ) -> AsyncGenerator[pb.ModelInferResponse, None]:
        """``_responses``, with the request counted in ``request_memory`` until its last,
        and traced where the trace settings sample it (its caller's trace context comes as
        the stream's metadata). A traced request ends when its last response is queued for
        the stream."""
        memory, nbytes = self.inference.request_memory, wire_bytes(request)
        memory.take(nbytes)
        tracing = self.inference.tracing
        trace = tracing.begin("grpc", request.model_name, metadata.get) if tracing.on else None
        try:
            async for response in self._responses(request, peer, trace):
                yield response
        except BaseException as exc:
            if trace is not None:
                trace.failed(exc)
            raise
        finally:
            memory.give(nbytes)
            if trace is not None:
                trace.finish()

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[Request], context: Context
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Requests of one stream run concurrently; each answer carries its request's id."""
        metadata = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
        infer = partial(self._counted_responses, peer=self.peer(context), metadata=metadata)
        serving = self.streams.serve(request_iterator, infer, context)
        async with contextlib.aclosing(serving) as answers:  # its reader ends with the call
            async for answer in answers:
                yield answer

    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: Context
    ) -> pb.RepositoryIndexResponse:
        rows = self.control.repository_index(_authorization(context), request.ready)
        return messages.repository_index(rows)

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Context
    ) -> pb.RepositoryModelLoadResponse:
        parameters = _choices(request.parameters, "parameter_choice")
        await self.control.repository_load(request.model_name, _authorization(context), parameters)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Context
    ) -> pb.RepositoryModelUnloadResponse:
        parameters = _choices(request.parameters, "parameter_choice")
        await self.control.repository_unload(
            request.model_name, _authorization(context), parameters
        )
        return pb.RepositoryModelUnloadResponse()

    async def SystemSharedMemoryStatus(
        self, request: pb.SystemSharedMemoryStatusRequest, context: Context
    ) -> pb.SystemSharedMemoryStatusResponse:
        rows = self.regions.status("system", request.name, self.peer(context))
        return messages.system_shared_memory_status(rows)

    async def SystemSharedMemoryRegister(
        self, request: pb.SystemSharedMemoryRegisterRequest, context: Context
    ) -> pb.SystemSharedMemoryRegisterResponse:
        self.regions.register_system(
            request.name, request.key, request.offset, request.byte_size, self.peer(context)
        )
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest, context: Context
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        self.regions.unregister("system", request.name, self.peer(context))
        return pb.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(
        self, request: pb.CudaSharedMemoryStatusRequest, context: Context
    ) -> pb.CudaSharedMemoryStatusResponse:
        rows = self.regions.status("cuda", request.name, self.peer(context))
        return messages.cuda_shared_memory_status(rows)

    async def CudaSharedMemoryRegister(
        self, request: pb.CudaSharedMemoryRegisterRequest, context: Context
    ) -> pb.CudaSharedMemoryRegisterResponse:
        peer = self.peer(context)
        self.regions.register_cuda(
            request.name, request.raw_handle, request.device_id, request.byte_size, peer
        )
        return pb.CudaSharedMemoryRegisterResponse()

    async def CudaSharedMemoryUnregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest, context: Context
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        self.regions.unregister("cuda", request.name, self.peer(context))
        return pb.CudaSharedMemoryUnregisterResponse()

    async def TraceSetting(
        self, request: pb.TraceSettingRequest, context: Context
    ) -> pb.TraceSettingResponse:
        # An empty value list is how Triton's client asks to clear a setting.
        updates = {key: list(v.value) or None for key, v in request.settings.items()}
        answer = self.control.trace_settings(
            request.model_name, _authorization(context), updates or None
        )
        response = pb.TraceSettingResponse()
        for key, value in answer.items():
            response.settings[key].value.extend(value if isinstance(value, list) else [value])
        return response

    async def LogSettings(
        self, request: pb.LogSettingsRequest, context: Context
    ) -> pb.LogSettingsResponse:
        updates = _choices(request.settings, "parameter_choice")
        answer = self.control.log_settings(_authorization(context), updates or None)
        response = pb.LogSettingsResponse()
        for key, value in answer.items():
            if isinstance(value, bool):
                response.settings[key].bool_param = value
            elif isinstance(value, int):
                response.settings[key].uint32_param = value
            else:
                response.settings[key].string_param = value
        return response


Behavior = Callable[[Any, Context], Awaitable[Any]]
Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"  # generic only to type checkers


def _guarded(behavior: Behavior, calls: CallLimit) -> Behavior:
    async def call(request: Any, context: Context) -> Any:
        if not calls.enter():
            del request
            await context.abort(*calls.refusal)
        try:
            if type(request) is Refusal:
                await context.abort(request.status, request.message)
            try:
                return await behavior(request, context)
            except grpc.aio.AbortError:
                raise
            except Exception as exc:
                status, message = report_failure(exc), public_message(exc)
            # Abort outside the handler, the request dropped first: the exception's traceback
            # holds the frames that held the request, and the collector (tuned to run rarely)
            # would keep a failed 60 MB request alive for good.
            del request
            await context.abort(status, message)
        finally:
            calls.leave()

    return call


def _limited(behavior: Callable[..., Any], calls: CallLimit) -> Callable[..., Any]:
    """A streaming behavior under the call limit: an async generator (ModelStreamInfer,
    reflection) or a coroutine that writes its answers (health's Watch)."""
    if inspect.isasyncgenfunction(behavior):

        async def streaming(request: Any, context: Context) -> AsyncIterator[Any]:
            if not calls.enter():
                await context.abort(*calls.refusal)
            try:
                if type(request) is Refusal:  # a unary request's (health's Watch)
                    await context.abort(request.status, request.message)
                async with contextlib.aclosing(behavior(request, context)) as answers:
                    async for answer in answers:
                        yield answer
            finally:
                calls.leave()

        return streaming

    async def writing(request: Any, context: Context) -> Any:
        if not calls.enter():
            await context.abort(*calls.refusal)
        try:
            if type(request) is Refusal:
                await context.abort(request.status, request.message)
            return await behavior(request, context)
        finally:
            calls.leave()

    return writing


class ErrorInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Maps every exception of every unary method to its status code, once, and holds every
    method to the limit on calls in flight."""

    def __init__(self, calls: CallLimit) -> None:
        self._calls = calls
        self._cache: dict[str, Handler] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler:
        method = handler_call_details.method
        cached = self._cache.get(method)
        if cached is not None:
            return cached
        handler = await continuation(handler_call_details)
        if handler is not None:
            handler = self._wrap(method, handler)
            self._cache[method] = handler
        return handler

    def _wrap(self, method: str, handler: Handler) -> Handler:
        """The handler guarded; inference requests are read as heads (``head.py``), the
        others' messages measured before protobuf reads them (``message_limits.py``)."""
        reader = handler.request_deserializer
        if method in METHODS:
            reader = read
        elif not handler.request_streaming:  # reflection's stream: no repeated fields
            reader = bounded(method, reader)
        codecs: dict[str, Any] = {
            "request_deserializer": reader,
            "response_serializer": handler.response_serializer,
        }
        calls = self._calls
        if handler.unary_unary is not None:
            behavior = _guarded(handler.unary_unary, calls)  # type: ignore[arg-type]
            return grpc.unary_unary_rpc_method_handler(behavior, **codecs)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _limited(handler.unary_stream, calls), **codecs
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                _limited(handler.stream_unary, calls), **codecs
            )
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                _limited(handler.stream_stream, calls), **codecs
            )
        return handler
