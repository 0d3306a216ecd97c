"""Who may call the server, and as which session: one operator key that may name any session,
and session keys, each bound to one session, that may name no other.

`harnessrl serve --api-key` sets the operator key (any session, as before). `AgentServer`
(``external/run.py``) keeps the operator key to itself and gives each agent run a key of its
own, issued for that run's session (`Credentials.issue`) and revoked when the run ends: the
agent's requests are recorded under its session whatever path or header it sends, a request
that names another session gets a 403, and a session name, which anyone can guess
(``<task>@<run>``), is worth nothing without its key, which nobody can (128 random bits).
Keys are compared by their SHA-256 digests, so a lookup's time does not depend on how many
bytes of a guess were right.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
from collections.abc import Iterable


class Refused(Exception):
    """A request the keys do not allow: HTTP ``status`` (401 no valid key, 403 another
    session's) and a message that names no key."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


class Credentials:
    """The operator key (``api_key``; None: any key, or none, is accepted as the operator's,
    as long as no session key was issued) and the session keys in force. Thread-safe: the
    trainer issues and revokes keys from its threads while the server checks them."""

    def __init__(self, api_key: str | None = None) -> None:
        self._operator = None if api_key is None else _digest(api_key)
        self._sessions: dict[bytes, str] = {}
        self._lock = threading.Lock()

    @property
    def required(self) -> bool:
        """Whether a request must show a key."""
        return self._operator is not None or bool(self._sessions)

    def issue(self, session: str) -> str:
        """Returns a new key that may call the server as ``session`` and as nothing else."""
        key = "harnessrl-s-" + secrets.token_hex(16)
        with self._lock:
            self._sessions[_digest(key)] = session
        return key

    def revoke(self, session: str) -> None:
        """Withdraws every key issued for ``session`` (a no-op when there is none)."""
        with self._lock:
            for digest in [d for d, s in self._sessions.items() if s == session]:
                del self._sessions[digest]

    def holder(self, given: Iterable[str]) -> tuple[bool, str | None]:
        """Returns (known, session) for the first of the ``given`` keys that is valid: (True,
        None) for the operator's, (True, session) for a session key, (False, None) when none
        is. Without an operator key and with no session key issued, anything is the operator's."""
        if not self.required:
            return True, None
        digests = [_digest(key) for key in given if key]
        with self._lock:
            for digest in digests:
                if self._operator is not None and secrets.compare_digest(digest, self._operator):
                    return True, None
                if digest in self._sessions:
                    return True, self._sessions[digest]
        return False, None

    def authorize(self, given: Iterable[str], named: str | None) -> str | None:
        """Returns the session a request runs as: the one it ``named`` (path or header) for the
        operator, the key's own for a session key (the name, when given, must be that one).
        Raises `Refused` (401) when no key is valid, (403) when a session key names another
        session."""
        known, bound = self.holder(given)
        if not known:
            raise Refused(401, "invalid API key")
        if bound is None:
            return named
        if named is not None and named != bound:
            raise Refused(403, "this API key may not use another session")
        return bound
