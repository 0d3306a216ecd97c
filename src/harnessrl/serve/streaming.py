"""Streaming shared by the three served APIs: which part of a choice's text is final while the
policy still samples (``StreamedText``), what is left to send once the completion is known
(``unsent``), and how a finished text is cut into stream deltas (``text_pieces``).

A delta is sent only when it is sure to be a prefix of the content the finished completion
will carry, so that the streamed text always equals the non-streamed one: a text that ends
in a partial UTF-8 character, in whitespace (``strip`` and the tokenizer's space clean-up
may still change it), in what may begin a stop string, or, when tools are declared, from
the first ``<tool_call>`` on (calls are sent as the API's tool-call events at the end) is held
back until the next tokens or the end decide it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence

from harnessrl.harness.tools.tool_call import TOOL_CALL_OPEN

logger = logging.getLogger("harnessrl.serve")

STREAM_PIECE_CHARS = 32


def text_pieces(text: str, size: int = STREAM_PIECE_CHARS) -> Iterator[str]:
    """Yields ``text`` in pieces of ``size`` characters (nothing for empty text)."""
    for start in range(0, len(text), size):
        yield text[start : start + size]


def _without_partial_marker(text: str, marker: str) -> str:
    """Returns ``text`` less its longest tail that is a proper prefix of ``marker``."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return text[:-size]
    return text


class StreamedText:
    """The ids one choice has sampled so far and the part of its content already sent.

    ``add(ids)`` returns the text that became final with ``ids`` (often empty). ``decode``
    turns ids into text as the engine does; ``stop_token_ids`` end a message (not text);
    ``stops`` are the request's stop strings; ``tools`` says whether tools are declared
    (then tool calls are parsed out of the text and the content is stripped).
    """

    def __init__(
        self, decode: Callable[[Sequence[int]], str], stop_token_ids: Sequence[int],
        stops: Sequence[str], tools: bool, lead: str = "",
    ) -> None:
        self.decode, self.stop_token_ids, self.stops, self.tools = decode, frozenset(stop_token_ids), list(stops), tools
        self.lead = lead  # text the answer starts with that was not sampled (a forced tool call)
        self.ids: list[int] = []
        self.sent = ""

    def add(self, ids: Sequence[int]) -> str:
        self.ids.extend(ids)
        ended = bool(self.ids) and self.ids[-1] in self.stop_token_ids
        final = self._final_prefix(self.lead + self.decode(self.ids[:-1] if ended else self.ids))
        if len(final) <= len(self.sent) or not final.startswith(self.sent):
            return ""
        delta, self.sent = final[len(self.sent) :], final
        return delta

    def _final_prefix(self, text: str) -> str:
        text = text.rstrip("\ufffd")  # a multi-byte character whose last bytes are still to come
        cut = [text.find(stop) for stop in self.stops if stop and stop in text]
        if cut:
            text = text[: min(cut)]
        else:
            for stop in self.stops:
                if stop:
                    text = _without_partial_marker(text, stop)
        if self.tools:
            opening = text.find(TOOL_CALL_OPEN)
            text = text[:opening] if opening != -1 else _without_partial_marker(text, TOOL_CALL_OPEN)
            text = text.lstrip()
        return text.rstrip()


def unsent(content: str, sent: str) -> str:
    """Returns the part of a finished choice's ``content`` that its stream has not sent."""
    if content.startswith(sent):
        return content[len(sent) :]
    # Not expected (see the module docstring); send what differs rather than lose text.
    logger.warning("a streamed prefix is not a prefix of the finished content; sending the rest")
    common = next((at for at, (a, b) in enumerate(zip(content, sent, strict=False)) if a != b), min(len(content), len(sent)))
    return content[common:]
