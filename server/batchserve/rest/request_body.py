"""Request bodies handed to the application as the parser produced them.

uvicorn's httptools protocol appends every body chunk the parser hands over to a
``bytearray`` and gives the application ``bytes()`` of it: two copies of each body byte
before the application sees one (for a 600 KB FP32 image, about 40 µs on the 2-core
reference machine). Here a chunk that arrives while nothing else waits to be read is kept
as the ``bytes`` object the parser made, which ``bytes()`` then returns as it is; a chunk
that arrives behind another, unread, is appended as uvicorn does.
"""

from __future__ import annotations

from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class UncopiedBodyProtocol(HttpToolsProtocol):
    """httptools' protocol, without the copies of a request body's first unread chunk."""

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if cycle.body or cycle.response_complete or self.parser.should_upgrade():
            super().on_body(body)  # appended, dropped or upgraded as uvicorn decides
            return
        cycle.body = body  # type: ignore[assignment]  # bytes: receive() hands it over as is
        if len(body) > HIGH_WATER_LIMIT:
            self.flow.pause_reading()
        cycle.message_event.set()
