"""Why a profile could not run: a tool it needs, or the server it started, failed it."""

from __future__ import annotations

from batchserve.core.errors import Unavailable


class ProfileError(Unavailable):
    """perf_analyzer is missing or failed, or the server did not start; the message says
    which and quotes the tool's own last words."""


class ServerRefused(ProfileError):
    """The server answered a call with an error: for a load, the setting is refused (a
    config it rejects, a memory budget the setting does not fit) and the sweep goes on."""
