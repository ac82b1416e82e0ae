"""Numbers written in decimal digits, as clients and config files write them."""

from __future__ import annotations

MAX_INT64_DIGITS = 19


def ascii_digits(text: str) -> bool:
    """Only 0-9. ``str.isdigit`` also takes '²', which ``int`` refuses (a ValueError where a
    client error was due), and the Arabic-Indic one, which ``int`` reads as 1."""
    return text.isascii() and text.isdigit()
