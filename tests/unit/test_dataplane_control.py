"""The control token, read once from the raw ``authorization`` value both adapters pass."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

import pytest
from batchserve.core.errors import ControlDisabled, InvalidArgument, Unauthenticated
from batchserve.core.settings import ModelControlMode, Settings
from batchserve.dataplane.control import Control, bearer_token
from batchserve.models.registry import ModelRegistry

NO_REGISTRY = cast(ModelRegistry, None)
"""The token checks never reach the registry."""


@pytest.mark.parametrize(
    ("authorization", "token"),
    [
        ("Bearer t0ken", "t0ken"),
        ("bearer t0ken", "t0ken"),
        ("BEARER  t0ken \t", "t0ken"),
        ("Bearer ", ""),
        ("Bearer", None),
        ("Basic dXNlcjpwYXNz", None),
        ("t0ken", None),
        ("", None),
        (None, None),
    ],
)
def test_bearer_token(authorization: str | None, token: str | None) -> None:
    assert bearer_token(authorization) == token


def _control(tmp_path: Path, token: str | None, mode: ModelControlMode) -> Control:
    settings = Settings(model_repository=tmp_path, control_token=token, model_control_mode=mode)
    return Control(settings, NO_REGISTRY)


def test_the_token_must_be_the_bearer_token_sent(tmp_path: Path) -> None:
    control = _control(tmp_path, "t0ken", ModelControlMode.EXPLICIT)
    control.check_token("Bearer t0ken")
    control.check_control("bearer t0ken ")
    for sent in (None, "Bearer wrong", "t0ken", "Basic t0ken", "Bearer t0ken2"):
        with pytest.raises(Unauthenticated, match=r"^model control and settings updates need a"):
            control.check_token(sent)
        with pytest.raises(Unauthenticated):
            control.check_control(sent)


def test_a_token_with_non_ascii_characters_is_refused_not_a_crash(tmp_path: Path) -> None:
    """An HTTP header arrives decoded as latin-1; hmac refuses such str outright."""
    control = _control(tmp_path, "t0ken", ModelControlMode.EXPLICIT)
    with pytest.raises(Unauthenticated):
        control.check_token("Bearer t\u00f6ken")
    _control(tmp_path, "t\u00f6ken", ModelControlMode.EXPLICIT).check_token("Bearer t\u00f6ken")


def test_without_a_token_anyone_may_control(tmp_path: Path) -> None:
    control = _control(tmp_path, None, ModelControlMode.EXPLICIT)
    control.check_token(None)
    control.check_control("Basic anything")


def test_control_is_refused_before_the_token_when_it_is_off(tmp_path: Path) -> None:
    control = _control(tmp_path, "t0ken", ModelControlMode.NONE)
    with pytest.raises(ControlDisabled, match=r"^explicit model load / unload is not allowed"):
        control.check_control("Bearer wrong")
    control.check_token("Bearer t0ken")  # settings updates need only the token


def test_a_refused_load_is_logged_with_its_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Triton's L0_grpc reads "Invalid config override" in the server's log."""
    control = _control(tmp_path, None, ModelControlMode.EXPLICIT)
    with pytest.raises(InvalidArgument, match="Invalid config override"):
        asyncio.run(control.repository_load("m", None, {"config": "{] not json"}))
    [record] = [r for r in caplog.records if r.getMessage() == "model load refused"]
    assert record.levelname == "WARNING"
    reason = record.__dict__["reason"]
    assert "failed to load 'm', failed to poll from model repository: Invalid config " in reason
