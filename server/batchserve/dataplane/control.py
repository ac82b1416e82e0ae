"""Repository control and the settings Triton lets clients read and change: every change
needs the control token, which both adapters hand over as the raw ``authorization`` value.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Mapping

from batchserve.core.errors import (
    BatchserveError,
    ControlDisabled,
    InvalidArgument,
    ModelFileError,
    NotFound,
    Unauthenticated,
)
from batchserve.core.settings import ModelControlMode, Settings
from batchserve.core.trace_config import parse_trace_config
from batchserve.models.load_override import parse_load_parameters, parse_unload_parameters
from batchserve.models.model_names import validate_model_name
from batchserve.models.model_table import IndexEntry as IndexEntry  # the adapters render it
from batchserve.models.registry import ModelRegistry
from batchserve.observability import log_settings
from batchserve.observability.log_settings import Answer as LogAnswer
from batchserve.observability.trace_settings import Answer as TraceAnswer
from batchserve.observability.trace_settings import TraceSettings
from batchserve.observability.trace_settings import Update as TraceUpdate

logger = logging.getLogger(__name__)

# Triton's words for a load that failed before any runtime ran (model_repository_manager.cc).
POLL_FAILED = "failed to poll from model repository"


def _refused(name: str, error: BatchserveError) -> BatchserveError:
    """A load request's refusal, logged with its reason as Triton logs it (an operator
    reads why a load API call failed in the server's log, not only in the answer)."""
    logger.warning("model load refused", extra={"model": name, "reason": error.message})
    return error


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``authorization: Bearer <token>`` value (HTTP header or gRPC
    metadata); None for any other scheme or none."""
    if authorization and authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    return None


class Control:
    """Load, unload and list models; read and update trace and log settings."""

    def __init__(self, settings: Settings, registry: ModelRegistry) -> None:
        self.settings = settings
        self.registry = registry
        self.trace_config = parse_trace_config(settings.trace_config)
        self.trace = TraceSettings(self.trace_config)

    def check_token(self, authorization: str | None) -> None:
        """The control token, when the server has one, must be the bearer token sent.

        Compared as bytes: ``compare_digest`` refuses str with non-ASCII characters, which a
        header (decoded as latin-1) or gRPC metadata may carry."""
        expected = self.settings.control_token
        if expected is not None and not hmac.compare_digest(
            (bearer_token(authorization) or "").encode("utf-8", "surrogatepass"),
            expected.encode("utf-8", "surrogatepass"),
        ):
            raise Unauthenticated("model control and settings updates need a valid token")

    def check_control(self, authorization: str | None) -> None:
        """Model control is on and the token good: checked before a load's body is read."""
        if self.settings.model_control_mode is not ModelControlMode.EXPLICIT:
            # Triton's status and words (model_repository_manager.cc), then ours.
            raise ControlDisabled(
                "explicit model load / unload is not allowed if polling is enabled "
                "(batchserve: model control is disabled; start the server with "
                "--model-control-mode explicit)"
            )
        self.check_token(authorization)

    def repository_index(
        self, authorization: str | None, ready_only: bool = False
    ) -> list[IndexEntry]:
        """Answered in every control mode, as Triton does; the token still guards it."""
        self.check_token(authorization)
        return self.registry.index(ready_only)

    async def repository_load(
        self,
        name: str,
        authorization: str | None,
        parameters: Mapping[str, object] | None = None,
        *,
        files_in_base64: bool = False,
    ) -> None:
        """Load with Triton's parameters (``load_override``); errors open with Triton's words:
        "failed to load '<name>', failed to poll from model repository" when the repository,
        the request or the config alone is at fault (Triton's own examples look for "failed
        to load"), "load failed for model '<name>'" when the model's files, their runtime or
        its instances are (Triton's lifecycle tests look for that): Triton reads the config
        when it polls the repository and the files when it loads the model."""
        self.check_control(authorization)
        validate_model_name(name)
        try:
            override = parse_load_parameters(
                parameters or {},
                files_in_base64=files_in_base64,
                max_total_bytes=self.settings.max_binary_body_bytes,
            )
        except BatchserveError as exc:
            raise _refused(
                name, _reworded(exc, f"failed to load '{name}', {POLL_FAILED}")
            ) from None
        try:
            await self.registry.load(name, override)
        except BatchserveError as exc:
            polled = isinstance(exc, ModelFileError) or not isinstance(
                exc, (InvalidArgument, NotFound)
            )
            polled_text = f"load failed for model '{name}'"
            raise _refused(
                name,
                _reworded(
                    exc, polled_text if polled else f"failed to load '{name}', {POLL_FAILED}"
                ),
            ) from None

    async def repository_unload(
        self,
        name: str,
        authorization: str | None,
        parameters: Mapping[str, object] | None = None,
    ) -> None:
        """``unload_dependents`` also unloads the composing models an ensemble alone kept
        loaded."""
        self.check_control(authorization)
        dependents = parse_unload_parameters(parameters or {})
        await self.registry.unload(validate_model_name(name), dependents)
        self.trace.forget(name)

    def trace_settings(
        self, model: str, authorization: str | None, updates: TraceUpdate | None = None
    ) -> TraceAnswer:
        """A model's settings exist while it is ready (Triton's check and words)."""
        if model and not self.registry.is_ready(validate_model_name(model)):
            raise InvalidArgument(f"Request for unknown model : {model}")
        if updates is None:
            return self.trace.get(model)
        self.check_token(authorization)
        return self.trace.update(updates, model)

    def log_settings(
        self, authorization: str | None, updates: Mapping[str, object] | None = None
    ) -> LogAnswer:
        if updates is None:
            return log_settings.get()
        self.check_token(authorization)
        return log_settings.update(updates)


def _reworded(error: BatchserveError, prefix: str) -> BatchserveError:
    """The same error with Triton's opening, which clients look for (once: the repository's
    own "not in the repository" already opens with it)."""
    if error.message.startswith(prefix):
        return error
    error.message = f"{prefix}: {error.message}"
    error.args = (error.message,)
    return error
