"""Per-conversation records of every request a server answered, and their trajectories.

A record holds a request's exact prompt ids (with run-length span labels, see
``serve/prompt.py``), the ids the policy sampled and their log-probabilities, the decoded
text, the parsed reply and the messages that were new since the conversation's previous
request. Requests are grouped into conversations by the session the client named, else by
message prefix: a request whose messages start with an earlier request's messages plus that
request's reply continues that conversation (the longest such match wins); a request that
repeats an earlier request's messages exactly (a retry) joins it too.

Within a conversation, requests are grouped the same way into *threads*: an agent program
sends side requests (a title, a summary, a sub-agent) through the same session, and each of
those starts a thread of its own. Every record names its thread (``thread``, from 0), and
``to_trajectory`` takes one thread, by default the one with the most requests (the agent's
main loop).

Memory stays bounded: with ``record_dir`` each record is appended to its session's file
(``session_file_name``: ``<session>.jsonl`` for plain names, else a readable part plus a
hash, so that no two sessions share a file) as it happens and is not kept in memory; without
one, records are held as JSON lines up to ``max_memory_bytes`` in all, past which the least
recently used conversations are written to a private temporary folder (removed by
``close``) and dropped from memory. ``end`` drops a finished conversation from memory the
same way. Reading a session gives back every record either way. Grouping keeps only a
16-byte digest per message.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import sys
import tempfile
import threading
import time
import weakref
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harnessrl.harness.chat import RenderedPrompt
from harnessrl.serve.prompt import message_key
from harnessrl.trajectory import Trajectory, Turn, run_length

DEFAULT_MEMORY_BYTES = 64 << 20
_PLAIN_SESSION = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")
_ENCODED_SESSION = re.compile(r".*-[0-9a-f]{32}")


def session_file_name(session: str) -> str:
    """Returns the record file name of ``session``; distinct sessions get distinct names.

    A plain name (up to 100 of [A-Za-z0-9._-], not starting with a dot, not shaped like an
    encoded one) is kept as it is; any other name becomes its first 64 characters with the
    others replaced by ``_``, plus ``-`` and 32 hex digits of its SHA-256.
    """
    if _PLAIN_SESSION.fullmatch(session) and not _ENCODED_SESSION.fullmatch(session):
        return session + ".jsonl"
    readable = re.sub(r"[^A-Za-z0-9._-]", "_", session)[:64].lstrip(".") or "session"
    digest = hashlib.sha256(session.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{readable}-{digest}.jsonl"


def _digest(message: dict[str, Any]) -> bytes:
    """What grouping keeps of a message: a digest of its ``message_key``."""
    return hashlib.blake2b(message_key(message).encode("utf-8", "surrogatepass"), digest_size=16).digest()


@dataclass
class _Thread:
    last_request: list[bytes] = field(default_factory=list)  # message digests of the last request
    history: list[bytes] = field(default_factory=list)  # ... and of its reply
    # Every reply to the last request: a client that times out retries the same request, and
    # it goes on with whichever answer reached it.
    replies: list[bytes] = field(default_factory=list)

    def match(self, keys: list[bytes]) -> int:
        """Returns how long a prefix of ``keys`` this thread accounts for (-1: none).

        The whole history as a prefix is the usual case. Some clients rewrite an earlier
        message on every request (OpenClaw sends a per-request context message and leaves it
        out of the next one); their request still carries this thread's last reply, which
        the server itself produced, so it continues the thread up to that reply.
        A request that extends the last request but leaves its reply out continues it too.
        """
        replies = self.replies or self.history[-1:]
        for reply in replies:
            history = [*self.history[:-1], reply]
            if len(history) <= len(keys) and keys[: len(history)] == history:
                return len(history)
        request = self.last_request
        if request and len(request) <= len(keys) and keys[: len(request)] == request:
            # The request again (a retry), or the request going on without the reply: a client
            # that drops a malformed answer from its history (mini-swe-agent after a format error).
            return len(request)
        for position in range(len(keys) - 1, -1, -1):
            if keys[position] in replies:
                return position + 1
        return -1


@dataclass
class _Conversation:
    threads: list[_Thread] = field(default_factory=list)
    count: int = 0  # records so far
    lines: list[str] = field(default_factory=list)  # the newest records, as JSON lines, in memory
    memory_bytes: int = 0  # what ``lines`` take
    files: list[tuple[Path, int]] = field(default_factory=list)  # (file, offset) holding the older records
    own_file: Path | None = None  # where this recorder appends them

    def best_thread(self, keys: list[bytes]) -> tuple[int, int]:
        """Returns (thread index, match length) of the thread ``keys`` continue best."""
        best, best_length = -1, -1
        for index, thread in enumerate(self.threads):
            length = thread.match(keys)
            if length > best_length:
                best, best_length = index, length
        return best, best_length


class ConversationRecorder:
    """Records exchanges per conversation, within ``max_memory_bytes`` of memory (see the
    module docstring); thread-safe."""

    def __init__(self, record_dir: str | Path | None = None, max_memory_bytes: int = DEFAULT_MEMORY_BYTES) -> None:
        self.record_dir = Path(record_dir) if record_dir is not None else None
        if self.record_dir is not None:
            self.record_dir.mkdir(parents=True, exist_ok=True)
        self.max_memory_bytes = max_memory_bytes
        self.spill_dir: Path | None = None  # made on the first spill, without a record_dir
        self._conversations: dict[str, _Conversation] = {}
        self._in_memory: OrderedDict[str, None] = OrderedDict()  # conversations holding lines, least recent first
        self._memory_bytes = 0
        self._lock = threading.Lock()
        self._unnamed = 0

    @property
    def memory_bytes(self) -> int:
        """Returns what the records held in memory take (the JSON lines' object sizes)."""
        return self._memory_bytes

    def close(self) -> None:
        """Removes the temporary folder of records written out of memory (if any)."""
        with self._lock:
            if self.spill_dir is not None:
                shutil.rmtree(self.spill_dir, ignore_errors=True)
                self.spill_dir = None

    def end(self, session: str) -> None:
        """Marks ``session`` finished: its records leave memory (they stay readable)."""
        with self._lock:
            if session in self._conversations:
                self._write_out(session)

    # ------------------------------------------------------------ grouping
    def assign(self, messages: Sequence[dict[str, Any]], session: str | None) -> tuple[str, int]:
        """Returns the conversation and thread of a request: ``session`` when named, else the
        conversation its messages continue (by prefix), else a new ``conv-N``; within it, the
        thread it continues, else a new one."""
        keys = [_digest(m) for m in messages]
        with self._lock:
            if session is None:
                best_length = -1
                for name, conversation in self._conversations.items():
                    _, length = conversation.best_thread(keys)
                    if length > best_length:
                        session, best_length = name, length
                if session is None:
                    self._unnamed += 1
                    session = f"conv-{self._unnamed}"
                    while session in self._conversations:
                        self._unnamed += 1
                        session = f"conv-{self._unnamed}"
            conversation = self._conversations.setdefault(session, _Conversation())
            thread, length = conversation.best_thread(keys)
            if length < 0:
                conversation.threads.append(_Thread())
                thread = len(conversation.threads) - 1
            # Claim the thread now, so that a concurrent request with the same messages joins it.
            if not conversation.threads[thread].last_request:
                conversation.threads[thread].last_request = keys
            return session, thread

    # ------------------------------------------------------------ recording
    def record(
        self,
        session: str,
        thread: int = 0,
        *,
        api: str,
        messages: Sequence[dict[str, Any]],
        prompt: RenderedPrompt,
        token_ids: Sequence[int],
        logprobs: Sequence[float],
        finish_reason: str,
        text: str,
        reply: dict[str, Any],
        policy: str = "",
    ) -> dict[str, Any]:
        """Stores one exchange of ``session`` (appending it to its JSONL file with a
        ``record_dir``); returns it."""
        keys = [_digest(m) for m in messages]
        with self._lock:
            conversation = self._conversations.setdefault(session, _Conversation())
            while len(conversation.threads) <= thread:
                conversation.threads.append(_Thread())
            state = conversation.threads[thread]
            known = max(0, state.match(keys)) if state.history else 0
            retry = bool(state.history) and keys == state.last_request
            record = {
                "session": session,
                "thread": thread,
                "index": conversation.count,
                "api": api,
                "policy": policy,
                "time": time.time(),
                "new_messages": list(messages[known:]),
                "prompt_ids": list(prompt.ids),
                "prompt_spans": [list(run) for run in run_length(prompt.spans)],
                "completion_ids": list(token_ids),
                "completion_logprobs": list(logprobs),
                "finish_reason": finish_reason,
                "text": text,
                "reply": reply,
                "retry": retry,  # the same request again (the client retried): see to_trajectory
            }
            line = json.dumps(record, ensure_ascii=False)
            conversation.count += 1
            state.last_request = keys
            state.history = [*keys, _digest(reply)]
            state.replies = [*state.replies, state.history[-1]] if retry else [state.history[-1]]
            if self.record_dir is not None:
                self._append(session, [line])
            else:
                conversation.lines.append(line)
                size = sys.getsizeof(line)
                conversation.memory_bytes += size
                self._memory_bytes += size
                self._in_memory[session] = None
                self._in_memory.move_to_end(session)
                while self._memory_bytes > self.max_memory_bytes and self._in_memory:
                    self._write_out(next(iter(self._in_memory)))
        return record

    def _append(self, session: str, lines: list[str]) -> None:
        """Appends ``lines`` to the session's file (its record file, else its spill file)."""
        conversation = self._conversations[session]
        if conversation.own_file is None:
            if self.record_dir is not None:
                folder = self.record_dir
            else:
                if self.spill_dir is None:
                    self.spill_dir = Path(tempfile.mkdtemp(prefix="harnessrl-records-"))
                    # Removed at exit too, for owners that never call close().
                    weakref.finalize(self, shutil.rmtree, self.spill_dir, ignore_errors=True)
                folder = self.spill_dir
            conversation.own_file = folder / session_file_name(session)
            # A record folder may hold this session's records of an earlier server: not ours.
            offset = conversation.own_file.stat().st_size if conversation.own_file.exists() else 0
            conversation.files.append((conversation.own_file, offset))
        with conversation.own_file.open("a", encoding="utf-8") as handle:
            handle.write("".join(line + "\n" for line in lines))

    def _write_out(self, session: str) -> None:
        """Moves the records ``session`` holds in memory to its file (under the lock)."""
        conversation = self._conversations[session]
        if conversation.lines:
            self._append(session, conversation.lines)
        self._memory_bytes -= conversation.memory_bytes
        conversation.lines, conversation.memory_bytes = [], 0
        self._in_memory.pop(session, None)

    # ------------------------------------------------------------ reading
    def sessions(self) -> list[str]:
        """Returns the names of the conversations that hold at least one record."""
        with self._lock:
            return [name for name, c in self._conversations.items() if c.count]

    def records(self, session: str, thread: int | None = None) -> list[dict[str, Any]]:
        """Returns the records of ``session`` (of one ``thread`` if given) in order, read back
        from its file and memory; a KeyError names unknown sessions."""
        with self._lock:
            if session not in self._conversations:
                raise KeyError(f"no conversation {session!r}; known: {', '.join(self._conversations) or 'none'}")
            conversation = self._conversations[session]
            lines = []
            for path, offset in conversation.files:
                with path.open("rb") as handle:
                    handle.seek(offset)
                    lines += [line for line in handle.read().decode("utf-8").splitlines() if line.strip()]
            lines += conversation.lines
        records = [json.loads(line) for line in lines]
        return [r for r in records if r["session"] == session and (thread is None or r.get("thread", 0) == thread)]

    def forget(self, session: str) -> None:
        """Drops ``session`` altogether: its records in memory and its spill file (a file in
        ``record_dir`` stays). A long-lived server, e.g. the one a training run holds, keeps
        only the conversations it still needs; an unknown session is a no-op."""
        with self._lock:
            conversation = self._conversations.pop(session, None)
            if conversation is None:
                return
            self._memory_bytes -= conversation.memory_bytes
            self._in_memory.pop(session, None)
            own = conversation.own_file
            if own is not None and self.spill_dir is not None and own.parent == self.spill_dir:
                own.unlink(missing_ok=True)

    def main_thread(self, session: str) -> int:
        """Returns the thread of ``session`` with the most requests (the first on a tie)."""
        return _main_thread(self.records(session))

    @classmethod
    def load(cls, record_dir: str | Path) -> ConversationRecorder:
        """Returns a recorder holding the records of every ``*.jsonl`` file in ``record_dir``
        (without writing to it); a bad line stops with its file and line number."""
        recorder = cls()
        for path in sorted(Path(record_dir).glob("*.jsonl")):
            counts: Counter[str] = Counter()
            with path.open("r", encoding="utf-8") as handle:
                for number, line in enumerate(handle, start=1):
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                        session = record["session"]
                        if not isinstance(session, str):
                            raise TypeError("'session' is not a string")
                    except (ValueError, KeyError, TypeError) as exc:
                        raise ValueError(f"{path} line {number}: not a serve record: {exc}") from None
                    counts[session] += 1
            for session, count in counts.items():
                conversation = recorder._conversations.setdefault(session, _Conversation())
                conversation.files.append((path, 0))
                conversation.count += count
        return recorder

    def to_trajectory(
        self,
        session: str,
        *,
        thread: int | None = None,
        task_id: str | None = None,
        config: str = "ext:serve",
        harness: str | None = None,
        passed: bool = False,
        reward: float | None = None,
        status: str = "submitted",
        metrics: dict[str, Any] | None = None,
    ) -> Trajectory:
        """Returns one thread of ``session`` (default: ``main_thread``) as a trajectory: one
        turn per request, with the exact prompt and sampled ids; each turn's observation is
        the text of the messages the client sent next. A request the client sent again (a
        retry after a timeout) is one turn: the answer the conversation went on with (found
        in the next prompt, which holds its sampled ids), else the last; the others were never
        acted on and are left out (``retries_dropped``). ``reward`` defaults to 1.0 when
        ``passed`` else 0.0; ``metrics`` records the session, thread and request counts."""
        every = self.records(session)
        chosen = _main_thread(every) if thread is None else thread
        in_thread = [record for record in every if record.get("thread", 0) == chosen]
        records = _answers_acted_on(in_thread)
        total = len(every)
        turns = []
        for index, record in enumerate(records):
            following = records[index + 1]["new_messages"] if index + 1 < len(records) else []
            observation = "\n".join(
                str(m.get("content") or "") for m in following if m.get("role") in ("tool", "user", "system")
            )
            turns.append(
                Turn(
                    index=index,
                    prompt_ids=list(record["prompt_ids"]),
                    prompt_spans=[(str(span), int(count)) for span, count in record["prompt_spans"]],
                    completion_ids=list(record["completion_ids"]),
                    completion_logprobs=[float(v) for v in record["completion_logprobs"]],
                    finish_reason=record["finish_reason"],
                    text=record["text"],
                    calls=[{"name": c["name"], "arguments": c["arguments"]} for c in record["reply"].get("tool_calls") or ()],
                    observation=observation,
                )
            )
        apis = sorted({record["api"] for record in records})
        return Trajectory(
            task_id=task_id if task_id is not None else session,
            config=config,
            harness=harness if harness is not None else config,
            turns=turns,
            reward=reward if reward is not None else (1.0 if passed else 0.0),
            passed=passed,
            status=status,
            policy=records[0].get("policy", "") if records else "",
            out_of_space=True,
            metrics={
                "requests": len(records), "session_requests": total, "thread": chosen,
                "retries_dropped": len(in_thread) - len(records),
                "threads": len({r.get("thread", 0) for r in every}),
                "apis": apis, "session": session, **(metrics or {}),
            },
        )


def _contains(haystack: Sequence[int], needle: Sequence[int]) -> bool:
    size = len(needle)
    return any(haystack[start:start + size] == needle for start in range(len(haystack) - size + 1))


def _answers_acted_on(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Returns ``records`` with each run of retries (equal prompts, one after another) cut to
    the answer the next request carries (the last of the run when none or no next request)."""
    kept: list[dict[str, Any]] = []
    index = 0
    while index < len(records):
        end = index
        while end + 1 < len(records) and records[end + 1]["prompt_ids"] == records[index]["prompt_ids"]:
            end += 1
        run = records[index:end + 1]
        after = records[end + 1]["prompt_ids"] if end + 1 < len(records) else None
        seen = [r for r in run if after is not None and _contains(after, r["completion_ids"])]
        kept.append(seen[-1] if seen else run[-1])
        index = end + 1
    return kept


def _main_thread(records: Sequence[dict[str, Any]]) -> int:
    # A retried request counts once: retries do not make a side thread the main one.
    counts = Counter(record.get("thread", 0) for record in records if not record.get("retry"))
    if not counts:
        return 0
    return min(counts, key=lambda thread: (-counts[thread], thread))
