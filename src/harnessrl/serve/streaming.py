"""Streaming shared by the three served APIs: how a finished text is cut into stream deltas."""

from __future__ import annotations

from collections.abc import Iterator

STREAM_PIECE_CHARS = 32


def text_pieces(text: str, size: int = STREAM_PIECE_CHARS) -> Iterator[str]:
    """Yields ``text`` in pieces of ``size`` characters (nothing for empty text)."""
    for start in range(0, len(text), size):
        yield text[start : start + size]
