"""Chat rendering at the token level: messages -> prompt token ids with a span label per token.

Every message is rendered on its own and the pieces are concatenated, so the label of every
token is known exactly, and policy messages reuse the ids the policy sampled (token-in,
token-out: policy text is never re-tokenized). The layout is ChatML
(``<|im_start|>role\\ncontent<|im_end|>\\n``), which the embedded default model
(SmolLM2-135M-Instruct) and the Qwen family speak.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

from harnessrl.harness.base import SPAN_FORMAT, SPAN_POLICY, Message, encodable

IM_START, IM_END, END_OF_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"


@dataclass
class RenderedPrompt:
    """Prompt token ids with one span label per token."""

    ids: list[int] = field(default_factory=list)
    spans: list[str] = field(default_factory=list)

    def extend(self, ids: Sequence[int], span: str) -> None:
        self.ids.extend(ids)
        self.spans.extend([span] * len(ids))

    def __len__(self) -> int:
        return len(self.ids)


class ChatTokenizer(ABC):
    """A tokenizer that renders ChatML conversations token by token.

    Subclasses provide ``encode`` (plain text, no special tokens), ``decode`` and the ids of
    the ChatML special tokens.
    """

    im_start_id: int
    im_end_id: int
    eos_token_id: int
    pad_token_id: int

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Returns the ids of plain text (special-token strings are not interpreted)."""

    @abstractmethod
    def decode(self, ids: Sequence[int]) -> str:
        """Returns the text of ``ids`` (special tokens included as their strings)."""

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Returns the ids that end a policy message."""
        return (self.im_end_id, self.eos_token_id)

    def count_tokens(self, text: str) -> int:
        return len(self._encode_cached(text))

    def max_token_bytes(self) -> int | None:
        """Returns an upper bound on the UTF-8 bytes of text one token of ``encode`` stands
        for, so that text of C characters is at least C / bound tokens; None when unknown."""
        return None

    def header(self, role: str) -> list[int]:
        return [self.im_start_id, *self.encode(f"{role}\n")]

    def footer(self) -> list[int]:
        return [self.im_end_id, *self.encode("\n")]

    def render_message(self, message: Message, out: RenderedPrompt) -> None:
        """Appends one message: header and footer as format spans, content with its own span."""
        out.extend(self.header(message.role), SPAN_FORMAT)
        if message.token_ids is not None:
            ids = list(message.token_ids)
            # The sampled ids usually end with the stop token; keep them exactly as sampled.
            ended = bool(ids) and ids[-1] in self.stop_token_ids
            out.extend(ids, SPAN_POLICY if message.span == SPAN_POLICY else message.span)
            out.extend(self.footer()[1:] if ended and ids[-1] == self.im_end_id else self.footer(), SPAN_FORMAT)
            return
        out.extend(self._encode_cached(encodable(message.content)), message.span)
        out.extend(self.footer(), SPAN_FORMAT)

    def _encode_cached(self, text: str) -> list[int]:
        # Every turn re-renders the whole history; encoding each message once keeps the
        # harness's cost per turn flat instead of growing with the episode.
        cache: dict[str, tuple[int, ...]] | None = getattr(self, "_encode_memo", None)
        if cache is None:
            cache = self._encode_memo = {}
        ids = cache.get(text)
        if ids is None:
            if len(cache) > 4096:
                cache.clear()
            ids = cache[text] = tuple(self.encode(text))
        return list(ids)

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> RenderedPrompt:
        """Returns the prompt for ``messages``, ending with the assistant header when asked."""
        out = RenderedPrompt()
        for message in messages:
            self.render_message(message, out)
        if add_generation_prompt:
            out.extend(self.header("assistant"), SPAN_FORMAT)
        return out

    def completion_ids(self, text: str) -> list[int]:
        """Returns the ids a policy would sample for ``text``, ending with the stop token."""
        return [*self.encode(text), self.im_end_id]


class ByteTokenizer(ChatTokenizer):
    """A dependency-free byte-level ChatML tokenizer: ids 0-255 are bytes, then the specials.

    Used by scripted policies and tests; decoding is lossless for any text.
    """

    vocab_size = 259

    def __init__(self) -> None:
        self.im_start_id, self.im_end_id, self.eos_token_id = 256, 257, 258
        self.pad_token_id = self.eos_token_id
        self._special = {256: IM_START, 257: IM_END, 258: END_OF_TEXT}

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def max_token_bytes(self) -> int | None:
        return 1

    def decode(self, ids: Sequence[int]) -> str:
        out, buffer = [], bytearray()
        for i in ids:
            if i in self._special:
                out.append(buffer.decode("utf-8", errors="replace"))
                buffer = bytearray()
                out.append(self._special[i])
            elif 0 <= i < 256:
                buffer.append(i)
        out.append(buffer.decode("utf-8", errors="replace"))
        return "".join(out)


class HFChatTokenizer(ChatTokenizer):
    """Wraps a Hugging Face tokenizer of a ChatML model (SmolLM2, Qwen)."""

    def __init__(self, tokenizer: object) -> None:
        self.tokenizer = tokenizer
        convert = tokenizer.convert_tokens_to_ids  # type: ignore[attr-defined]
        self.im_start_id = int(convert(IM_START))
        self.im_end_id = int(convert(IM_END))
        unk = getattr(tokenizer, "unk_token_id", None)
        if self.im_start_id in (None, unk) or self.im_end_id in (None, unk):
            raise ValueError("tokenizer has no ChatML special tokens <|im_start|>/<|im_end|>")
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_token_id = int(eos) if eos is not None else self.im_end_id
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id = int(pad) if pad is not None else self.eos_token_id
        self.vocab_size = len(tokenizer)  # type: ignore[arg-type]

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))  # type: ignore[attr-defined]

    def max_token_bytes(self) -> int | None:
        """The longest token's text in UTF-8 bytes (a byte-level token's symbols take 1-2
        bytes each for 1 byte of text: an over-estimate, so the bound holds); None for a
        tokenizer whose normalizer may do more than compose characters (NFC, NFKC)."""
        if not hasattr(self, "_max_token_bytes"):
            backend = getattr(self.tokenizer, "backend_tokenizer", None)
            normalizer = getattr(backend, "normalizer", "unknown")
            bound = None
            if backend is not None and (normalizer is None or type(normalizer).__name__ in ("NFC", "NFKC")):
                tokens = self.tokenizer.convert_ids_to_tokens(list(range(self.vocab_size)))  # type: ignore[attr-defined]
                bound = max((len(str(t).encode("utf-8", "surrogatepass")) for t in tokens if t is not None), default=None)
            self._max_token_bytes = bound
        return self._max_token_bytes

    def decode(self, ids: Sequence[int]) -> str:
        return str(
            self.tokenizer.decode(  # type: ignore[attr-defined]
                list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
        )
