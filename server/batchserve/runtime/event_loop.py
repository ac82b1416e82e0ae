"""The server's event loop: uvloop, with a bound on the TLS handshake of every listener.

asyncio waits 60 s for a client's TLS handshake before the protocol even exists, and uvicorn
gives no way to change that: a TLS port held connections that never sent a byte three times
as long as the plain port's header timeout. The handshake is part of the request head here,
so it gets the same bound.
"""

from __future__ import annotations

from typing import Any

import uvloop


class BoundedHandshakeLoop(uvloop.Loop):
    """uvloop whose TLS servers drop a client that has not finished its handshake in time."""

    def __init__(self, tls_handshake_seconds: float) -> None:
        super().__init__()
        self.tls_handshake_seconds = tls_handshake_seconds

    async def create_server(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("ssl") is not None and kwargs.get("ssl_handshake_timeout") is None:
            kwargs["ssl_handshake_timeout"] = self.tls_handshake_seconds
        return await super().create_server(*args, **kwargs)
