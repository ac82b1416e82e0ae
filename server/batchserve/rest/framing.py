"""Requests that frame their body twice: ``Transfer-Encoding: chunked`` and a
``Content-Length``.

RFC 9112 (section 6.1) lets a server refuse such a request or read it by its
Transfer-Encoding alone, and either way close the connection after answering it: a proxy in
front that went by the Content-Length would take part of the body for the next request
(request smuggling), and no later request on that connection is then trusted. llhttp refuses
them; Triton reads them chunked (its L0_http ``test_content_encoding_chunked_manually``), and
Python's ``requests`` sends both headers whenever a caller sets ``Transfer-Encoding`` on a
body of bytes. This server reads them as Triton does, drops the Content-Length before anything
else sees the headers (the body's length is the chunks'), and closes the connection after the
answer.

The leniency that lets llhttp read them also makes it read a request whose last transfer
coding is not chunked (``Transfer-Encoding: gzip``) until the connection closes, where it
refused it before; such a request, whose body's end cannot be known, is refused here instead
(400, as before).
"""

from __future__ import annotations

from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def request_parser(callbacks: object) -> httptools.HttpRequestParser:
    """A parser with this server's leniencies: uvicorn's (an answer may still be written once
    the client has closed its side), and chunked framing taking precedence over a length."""
    parser = httptools.HttpRequestParser(callbacks)
    parser.set_dangerous_leniencies(lenient_data_after_close=True, lenient_chunked_length=True)
    return parser


class UnframedBody(Exception):
    """A request body's last transfer coding is not chunked; raised inside httptools'
    callbacks, it stops the parser, whose error the protocol answers with 400."""


def _is_chunked(codings: list[bytes]) -> bool:
    """Whether the last of the request's transfer codings, over all its Transfer-Encoding
    headers, is chunked (RFC 9112, section 6.3): only then does the body's framing end."""
    last = b",".join(codings).rsplit(b",", 1)[-1]
    return last.strip(b" \t").lower() == b"chunked"


class DoubleFramingProtocol(HttpToolsProtocol):
    """Reads a chunked body that also declares a length by its chunks, and closes the
    connection after its answer. Must come before every part that reads the headers."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parser = request_parser(self)

    def on_headers_complete(self) -> None:
        headers = self.headers
        codings = [value for name, value in headers if name == b"transfer-encoding"]
        if codings and not _is_chunked(codings):
            raise UnframedBody("the request's last transfer coding is not chunked")
        framed_twice = bool(codings) and any(name == b"content-length" for name, _ in headers)
        if framed_twice:
            headers[:] = [pair for pair in headers if pair[0] != b"content-length"]
        super().on_headers_complete()
        if framed_twice and self.cycle is not None:
            self.cycle.keep_alive = False
