"""The blocking client."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

import numpy.typing as npt

from batchserve_client._call import Call
from batchserve_client._connect import Settings, open_sync
from batchserve_client._infer import ParameterValue, build_request
from batchserve_client.results import InferResult, ModelMetadata, ServerMetadata
from batchserve_client.retry import DEFAULT_RETRY, Attempts, RetryPolicy, run
from batchserve_client.tls import TlsConfig

T = TypeVar("T")
C = TypeVar("C", bound="Client")


class Client:
    """A client of a batchserve (or any KServe v2 / Triton) server, over HTTP or gRPC as
    the URL's scheme says.

    A client keeps one pool of kept-alive connections (HTTP) or one channel (gRPC):
    make one, share it between threads, and close it when done (or use ``with``).

    Args:
        url: ``http://host:port``, ``https://...``, ``grpc://host:port``, ``grpcs://...``.
        timeout: seconds each call may take, its retries and their waits included
            (None: no limit); a call's own ``timeout`` argument overrides it.
        connect_timeout: seconds opening a connection may take.
        retry: when and how patiently to retry calls the server could not take.
        token: sent as ``Authorization: Bearer <token>`` (the model-control token).
        headers: extra HTTP headers, or gRPC metadata, sent with every call.
        binary_data: HTTP only: send and receive tensors as binary data (the default)
            rather than JSON.
        tls: for ``https://`` and ``grpcs://`` URLs: the CA that signed the server's
            certificate and, for a server that requires one, the client's certificate.
    """

    def __init__(
        self,
        url: str = "http://localhost:8000",
        *,
        timeout: float | None = 60.0,
        connect_timeout: float = 5.0,
        retry: RetryPolicy = DEFAULT_RETRY,
        token: str | None = None,
        headers: Mapping[str, str] | None = None,
        binary_data: bool = True,
        tls: TlsConfig | None = None,
    ) -> None:
        settings = Settings(
            url, tls, connect_timeout, retry.max_backoff, token, dict(headers or {}), binary_data
        )
        self.url, self._timeout, self._retry = url, timeout, retry
        self._api, self._runner = open_sync(settings)

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    def __enter__(self: C) -> C:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections; the client cannot be used afterwards."""
        self._runner.close()

    def _run(self, call: Call[Any, Any, T], timeout: float | None) -> T:
        attempts = Attempts(self._retry, call.retry, self._timeout if timeout is None else timeout)
        return run(lambda seconds: call.read(self._runner.send(call.request, seconds)), attempts)

    def is_live(self, *, timeout: float | None = None) -> bool:
        """Whether the server answers at all; raises Unavailable when it cannot be reached."""
        return self._run(self._api.is_live(), timeout)

    def is_ready(self, *, timeout: float | None = None) -> bool:
        """Whether the server is ready for inference (every model it serves is ready)."""
        return self._run(self._api.is_ready(), timeout)

    def is_model_ready(
        self, model: str, *, version: str = "", timeout: float | None = None
    ) -> bool:
        """Whether the model (the version its policy picks, or ``version``) is ready."""
        return self._run(self._api.is_model_ready(model, version), timeout)

    def server_metadata(self, *, timeout: float | None = None) -> ServerMetadata:
        return self._run(self._api.server_metadata(), timeout)

    def model_metadata(
        self, model: str, *, version: str = "", timeout: float | None = None
    ) -> ModelMetadata:
        """The model's versions, platform, and its inputs and outputs."""
        return self._run(self._api.model_metadata(model, version), timeout)

    def model_config(
        self, model: str, *, version: str = "", timeout: float | None = None
    ) -> dict[str, Any]:
        """The model's resolved ``config.pbtxt``, as JSON with proto field names."""
        return self._run(self._api.model_config(model, version), timeout)

    def model_statistics(
        self, model: str = "", *, version: str = "", timeout: float | None = None
    ) -> list[dict[str, Any]]:
        """Statistics of one model (of every model when ``model`` is empty)."""
        return self._run(self._api.model_statistics(model, version), timeout)

    def repository_index(
        self, *, ready: bool = False, timeout: float | None = None
    ) -> list[dict[str, Any]]:
        """Every model of the repository and its state (needs model control and a token)."""
        return self._run(self._api.repository_index(ready), timeout)

    def load_model(self, model: str, *, timeout: float | None = None) -> None:
        """Load or reload a model (needs model control and a token)."""
        self._run(self._api.load_model(model), timeout)

    def unload_model(self, model: str, *, timeout: float | None = None) -> None:
        """Unload a model (needs model control and a token)."""
        self._run(self._api.unload_model(model), timeout)

    def infer(
        self,
        model: str,
        inputs: Mapping[str, npt.ArrayLike],
        *,
        outputs: Sequence[str] | None = None,
        version: str = "",
        request_id: str = "",
        priority: int = 0,
        queue_timeout: float | None = None,
        parameters: Mapping[str, ParameterValue] | None = None,
        datatypes: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> InferResult:
        """Run the model on the inputs and return its outputs as numpy arrays.

        Args:
            model: the model's name.
            inputs: input name to array; the datatype comes from the dtype (bytes, str
                and object arrays are BYTES) unless ``datatypes`` names one.
            outputs: the outputs wanted (default: every output).
            version: the model version (default: the one its version policy picks).
            request_id: echoed back in ``InferResult.id``.
            priority: the request's priority level (1 is the highest; 0: the model's default).
            queue_timeout: seconds the request may wait in the server's queue before the
                server gives up on it (DeadlineExceeded); default: the model's setting.
            parameters: other request parameters, passed through.
            datatypes: input name to wire datatype, e.g. ``{"x": "BF16"}``.
            timeout: seconds this call may take, retries included.
        """
        request = build_request(
            model,
            inputs,
            outputs=outputs,
            version=version,
            request_id=request_id,
            priority=priority,
            queue_timeout=queue_timeout,
            parameters=parameters,
            datatypes=datatypes,
        )
        return self._run(self._api.infer(request), timeout)
