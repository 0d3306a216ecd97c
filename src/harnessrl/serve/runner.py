"""Running an ASGI app with uvicorn in a background thread, over TCP or a Unix socket.

``ServerThread`` is a context manager: entering starts the server and waits until it
accepts connections (raising if it could not start), leaving stops it and joins the thread.
With ``port=0`` the OS picks a free port (``.port`` says which). With ``uds=PATH`` the
server listens on a Unix-domain socket instead (for clients in a network-isolated sandbox);
``.base_url`` is then ``http://localhost`` and clients must connect through the socket file
(httpx: ``transport=httpx.HTTPTransport(uds=PATH)``; curl: ``--unix-socket PATH``). A
connection whose request headers take longer than ``header_timeout_s`` is closed.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import uvicorn
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from harnessrl.serve.limits import header_timeout_protocol

HEADER_TIMEOUT_S = 30.0


class ServerThread:
    """uvicorn serving ``app`` in a daemon thread (see the module docstring)."""

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        uds: str | os.PathLike[str] | None = None,
        log_level: str = "warning",
        startup_timeout_s: float = 30.0,
        header_timeout_s: float = HEADER_TIMEOUT_S,
    ) -> None:
        self.app = app
        self.host = host
        self.uds = str(uds) if uds is not None else None
        self.startup_timeout_s = startup_timeout_s
        config = uvicorn.Config(
            app, host=host, port=port, uds=self.uds, log_level=log_level, access_log=False,
            lifespan="on", timeout_graceful_shutdown=5,
            http=header_timeout_protocol(AutoHTTPProtocol, header_timeout_s),
        )
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None
        self.port: int = port

    @property
    def base_url(self) -> str:
        """Returns the URL clients use (``/v1`` not included)."""
        if self.uds is not None:
            return "http://localhost"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> ServerThread:
        """Starts the server and waits until it is ready; returns self."""
        if self.uds is not None and Path(self.uds).exists():
            Path(self.uds).unlink()  # a stale socket file from an earlier run
        self._thread = threading.Thread(target=self.server.run, name="harnessrl-serve", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self.startup_timeout_s
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"the server did not start on {self.uds or f'{self.host}:{self.port}'} (see the log above)")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server did not start within {self.startup_timeout_s} s")
            time.sleep(0.01)
        if self.uds is None:
            sockets = [s for server in self.server.servers for s in server.sockets]
            self.port = int(sockets[0].getsockname()[1])
        return self

    def stop(self) -> None:
        """Asks the server to exit and waits for its thread."""
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None) -> None:
        self.stop()
