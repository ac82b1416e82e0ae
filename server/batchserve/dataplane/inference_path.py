"""What the adapters' inference handlers call: ``DataPlane`` in a single-process server,
``WorkerPlane`` in a request-handling worker (``--workers``)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import Protocol

from batchserve.core.request_memory import RequestMemory
from batchserve.core.types import InferRequest, InferResponse
from batchserve.core.validation import SchemaLookup
from batchserve.observability.tracing import RequestTracer


class InferencePath(Protocol):
    tracing: RequestTracer
    """Which requests are traced; the adapters check ``tracing.on`` first."""
    request_memory: RequestMemory
    """This process's bytes of requests in flight, which the adapters take and give."""

    def schema_lookup(self, model: str, version: str) -> SchemaLookup: ...

    def raw_request(self, body: bytes, model: str, version: str) -> InferRequest: ...

    def decode(
        self,
        decode: Callable[[], InferRequest],
        model: str,
        version: str,
        protocol: str,
        peer: str | None = None,
    ) -> InferRequest: ...

    async def infer(self, request: InferRequest) -> InferResponse: ...

    def respond(
        self, request: InferRequest, streaming: bool = True
    ) -> AsyncGenerator[InferResponse, None]: ...


class KnownModels(InferencePath, Protocol):
    """A worker's inference path: it decodes requests for the models it knows; one for a
    model it does not know yet goes to the model-owning process whole."""

    def knows(self, model: str, version: str) -> bool: ...

    async def learn(self, model: str, version: str) -> bool: ...
