"""Per-conversation records of every request a server answered, and their trajectories.

A record holds a request's exact prompt ids (with run-length span labels, see
``serve/prompt.py``), the ids the policy sampled and their log-probabilities, the decoded
text, the parsed reply and the messages that were new since the conversation's previous
request. Requests are grouped into conversations by the session the client named, else by
message prefix: a request whose messages start with an earlier request's messages plus that
request's reply continues that conversation (the longest such match wins); a request that
repeats an earlier request's messages exactly (a retry) joins it too. With ``record_dir`` each
record is also appended to ``<record_dir>/<session>.jsonl`` as it happens.
"""

from __future__ import annotations

import json
import re
import threading
import time
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
class _Conversation:
    records: list[dict[str, Any]] = field(default_factory=list)
    last_request: list[str] = field(default_factory=list)  # message keys of the last request
    history: list[str] = field(default_factory=list)  # ... and of its reply


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
    def assign(self, messages: Sequence[dict[str, Any]], session: str | None) -> str:
        """Returns the conversation of a request: ``session`` when named, else the
        conversation its messages continue (by prefix), else a new ``conv-N``."""
        with self._lock:
            if session is not None:
                self._conversations.setdefault(session, _Conversation())
                return session
            keys = [message_key(m) for m in messages]
            best, best_length = None, -1
            for name, conversation in self._conversations.items():
                history = conversation.history
                if history and len(history) <= len(keys) and keys[: len(history)] == history:
                    if len(history) > best_length:
                        best, best_length = name, len(history)
                elif conversation.last_request == keys and len(keys) > best_length:
                    best, best_length = name, len(keys)
            if best is not None:
                return best
            self._unnamed += 1
            name = f"conv-{self._unnamed}"
            while name in self._conversations:
                self._unnamed += 1
                name = f"conv-{self._unnamed}"
            self._conversations[name] = _Conversation()
            return name

    # ------------------------------------------------------------ recording
    def record(
        self,
        session: str,
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
            seen = conversation.history
            known = len(seen) if seen and keys[: len(seen)] == seen else 0
            record = {
                "session": session,
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
            conversation.last_request = keys
            conversation.history = [*keys, message_key(reply)]
            if self.record_dir is not None:
                with (self.record_dir / session_file_name(session)).open("a", encoding="utf-8") as handle:
                    handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        return record

    # ------------------------------------------------------------ reading
    def sessions(self) -> list[str]:
        """Returns the names of the conversations that hold at least one record."""
        with self._lock:
            return [name for name, c in self._conversations.items() if c.records]

    def records(self, session: str) -> list[dict[str, Any]]:
        """Returns the records of ``session`` in order (a KeyError names unknown sessions)."""
        with self._lock:
            if session not in self._conversations:
                raise KeyError(f"no conversation {session!r}; known: {', '.join(self._conversations) or 'none'}")
            return list(self._conversations[session].records)

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
        task_id: str | None = None,
        config: str = "ext:serve",
        harness: str | None = None,
        passed: bool = False,
        reward: float | None = None,
        status: str = "submitted",
        metrics: dict[str, Any] | None = None,
    ) -> Trajectory:
        """Returns ``session`` as a trajectory: one turn per request, with the exact prompt
        and sampled ids; each turn's observation is the text of the messages the client sent
        next. ``reward`` defaults to 1.0 when ``passed`` else 0.0."""
        records = self.records(session)
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
            metrics={"requests": len(records), "apis": apis, "session": session, **(metrics or {})},
        )
