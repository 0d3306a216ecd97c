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
main loop). With ``record_dir`` each record is also appended to
``<record_dir>/<session>.jsonl`` as it happens.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harnessrl.harness.chat import RenderedPrompt
from harnessrl.serve.prompt import message_key
from harnessrl.trajectory import Trajectory, Turn, run_length


def session_file_name(session: str) -> str:
    """Returns a file name for ``session`` (characters outside [A-Za-z0-9._-] become ``_``)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", session)[:120] + ".jsonl"


@dataclass
class _Thread:
    last_request: list[str] = field(default_factory=list)  # message keys of the last request
    history: list[str] = field(default_factory=list)  # ... and of its reply

    def match(self, keys: list[str]) -> int:
        """Returns how long a prefix of ``keys`` this thread accounts for (-1: none).

        The whole history as a prefix is the usual case. Some clients rewrite an earlier
        message on every request (OpenClaw sends a per-request context message and leaves it
        out of the next one); their request still carries this thread's last reply, which
        the server itself produced, so it continues the thread up to that reply.
        """
        history = self.history
        if history and len(history) <= len(keys) and keys[: len(history)] == history:
            return len(history)
        if self.last_request and self.last_request == keys:
            return len(keys)
        if history:
            reply = history[-1]
            for position in range(len(keys) - 1, -1, -1):
                if keys[position] == reply:
                    return position + 1
        return -1


@dataclass
class _Conversation:
    records: list[dict[str, Any]] = field(default_factory=list)
    threads: list[_Thread] = field(default_factory=list)

    def best_thread(self, keys: list[str]) -> tuple[int, int]:
        """Returns (thread index, match length) of the thread ``keys`` continue best."""
        best, best_length = -1, -1
        for index, thread in enumerate(self.threads):
            length = thread.match(keys)
            if length > best_length:
                best, best_length = index, length
        return best, best_length


class ConversationRecorder:
    """Records exchanges per conversation; thread-safe."""

    def __init__(self, record_dir: str | Path | None = None) -> None:
        self.record_dir = Path(record_dir) if record_dir is not None else None
        if self.record_dir is not None:
            self.record_dir.mkdir(parents=True, exist_ok=True)
        self._conversations: dict[str, _Conversation] = {}
        self._lock = threading.Lock()
        self._unnamed = 0

    # ------------------------------------------------------------ grouping
    def assign(self, messages: Sequence[dict[str, Any]], session: str | None) -> tuple[str, int]:
        """Returns the conversation and thread of a request: ``session`` when named, else the
        conversation its messages continue (by prefix), else a new ``conv-N``; within it, the
        thread it continues, else a new one."""
        keys = [message_key(m) for m in messages]
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
        """Stores one exchange of ``session`` (and appends it to its JSONL file); returns it."""
        keys = [message_key(m) for m in messages]
        with self._lock:
            conversation = self._conversations.setdefault(session, _Conversation())
            while len(conversation.threads) <= thread:
                conversation.threads.append(_Thread())
            state = conversation.threads[thread]
            known = max(0, state.match(keys)) if state.history else 0
            record = {
                "session": session,
                "thread": thread,
                "index": len(conversation.records),
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
            }
            conversation.records.append(record)
            state.last_request = keys
            state.history = [*keys, message_key(reply)]
            if self.record_dir is not None:
                with (self.record_dir / session_file_name(session)).open("a", encoding="utf-8") as handle:
                    handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        return record

    # ------------------------------------------------------------ reading
    def sessions(self) -> list[str]:
        """Returns the names of the conversations that hold at least one record."""
        with self._lock:
            return [name for name, c in self._conversations.items() if c.records]

    def records(self, session: str, thread: int | None = None) -> list[dict[str, Any]]:
        """Returns the records of ``session`` (of one ``thread`` if given) in order; a KeyError
        names unknown sessions."""
        with self._lock:
            if session not in self._conversations:
                raise KeyError(f"no conversation {session!r}; known: {', '.join(self._conversations) or 'none'}")
            records = self._conversations[session].records
            return [r for r in records if thread is None or r.get("thread", 0) == thread]

    def main_thread(self, session: str) -> int:
        """Returns the thread of ``session`` with the most requests (the first on a tie)."""
        counts = Counter(record.get("thread", 0) for record in self.records(session))
        if not counts:
            return 0
        return min(counts, key=lambda thread: (-counts[thread], thread))

    @classmethod
    def load(cls, record_dir: str | Path) -> ConversationRecorder:
        """Returns a recorder holding the records of every ``*.jsonl`` file in ``record_dir``
        (without writing to it); a bad line stops with its file and line number."""
        recorder = cls()
        for path in sorted(Path(record_dir).glob("*.jsonl")):
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                    session = str(record["session"])
                except (ValueError, KeyError, TypeError) as exc:
                    raise ValueError(f"{path} line {number}: not a serve record: {exc}") from None
                conversation = recorder._conversations.setdefault(session, _Conversation())
                conversation.records.append(record)
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
        the text of the messages the client sent next. ``reward`` defaults to 1.0 when
        ``passed`` else 0.0; ``metrics`` records the session, thread and request counts."""
        chosen = self.main_thread(session) if thread is None else thread
        records = self.records(session, chosen)
        total = len(self.records(session))
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
                "threads": len({r.get("thread", 0) for r in self.records(session)}),
                "apis": apis, "session": session, **(metrics or {}),
            },
        )
