"""The server under abuse, through real sockets: oversized requests get a 413 without the
body being read (the server's resident memory stays flat), bodies in flight are bounded across
connections (the excess gets a 503 with Retry-After), slow headers and slow bodies are
cut off at their timeouts, the recorder stays within its memory bound over a long session,
session names map to distinct record files, a client that goes away costs one log line, and
the API key can come from the environment instead of the command line."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from harnessrl.policy.scripted import RandomPolicy
from harnessrl.serve.app import create_app
from harnessrl.serve.recorder import ConversationRecorder, session_file_name
from harnessrl.serve.runner import ServerThread
from serve_helpers import Scripted

SRC = str(Path(__file__).resolve().parents[1] / "src")
MiB = 1 << 20
GUARD_S = 60  # a hung server fails the test instead of hanging it


# ------------------------------------------------------------------ helpers
def serve_process(tmp_path: Path, *flags: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Path]:
    """Starts `harnessrl serve --policy random` on a Unix socket; returns (process, socket)."""
    socket_path = tmp_path / "serve.sock"
    environment = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   "OMP_NUM_THREADS": "1", **(env or {})}
    process = subprocess.Popen(
        [sys.executable, "-m", "harnessrl.cli", "serve", "--policy", "random", "--uds", str(socket_path), *flags],
        env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    deadline = time.monotonic() + GUARD_S
    while not socket_path.exists():
        if process.poll() is not None:
            raise AssertionError(f"serve exited: {process.communicate()[0]}")
        assert time.monotonic() < deadline, "serve did not start"
        time.sleep(0.05)
    return process, socket_path


def stop(process: subprocess.Popen) -> str:
    """Stops a serve process; returns its output."""
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=GUARD_S)
    return output


def memory_kib(pid: int) -> dict[str, int]:
    """Returns the process's resident set size now (VmRSS) and at its peak (VmHWM), in KiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0])
    return fields


def unix_socket(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(GUARD_S)
    sock.connect(str(path))
    return sock


def tcp_socket(server: ServerThread) -> socket.socket:
    sock = socket.create_connection((server.host, server.port), timeout=GUARD_S)
    return sock


def read_response(sock: socket.socket) -> tuple[int, dict, bytes]:
    """Reads until the server closes; returns (status, headers, body)."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    if not lines[0]:
        return 0, {}, b""
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if headers.get("transfer-encoding") == "chunked":
        decoded, rest = b"", body
        while rest:
            size_text, _, rest = rest.partition(b"\r\n")
            size = int(size_text, 16)
            if size == 0:
                break
            decoded, rest = decoded + rest[:size], rest[size + 2 :]
        body = decoded
    return status, headers, body


def request_head(path: str, length: int | None, session: str | None = None) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: localhost", "Content-Type: application/json"]
    lines.append(f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked")
    if session is not None:
        lines.append(f"X-Harnessrl-Session: {session}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


CHAT = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}).encode()


# ------------------------------------------------------------------ request size
def test_an_oversized_request_gets_413_before_its_body_is_read_and_memory_stays_flat(tmp_path):
    process, socket_path = serve_process(tmp_path, "--max-request-bytes", str(MiB))
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(socket_path)), base_url="http://localhost") as client:
            assert client.post("/v1/chat/completions", content=CHAT).status_code == 200  # warm
        before = memory_kib(process.pid)

        # Declared too large: refused from Content-Length, the 50 MB are never sent.
        with unix_socket(socket_path) as sock:
            sock.sendall(request_head("/v1/chat/completions", 50_000_000))
            status, headers, body = read_response(sock)
        assert status == 413 and headers.get("connection") == "close"
        error = json.loads(body)["error"]
        assert set(error) == {"message", "type", "param", "code"} and str(MiB) in error["message"]

        # Chunked, no length given: cut off as soon as the limit is passed, in the API's shape.
        with unix_socket(socket_path) as sock:
            sock.sendall(request_head("/v1/messages", None))
            piece = b"x" * MiB
            chunk = b"%x\r\n" % len(piece) + piece + b"\r\n"
            sent = 0
            try:
                for _ in range(50):
                    sock.sendall(chunk)
                    sent += len(piece)
            except (BrokenPipeError, ConnectionResetError):
                pass
            status, _, body = read_response(sock)
        assert status == 413 and sent < 50 * MiB
        assert json.loads(body)["type"] == "error" and json.loads(body)["error"]["type"] == "request_too_large"

        after = memory_kib(process.pid)
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(socket_path)), base_url="http://localhost") as client:
            assert client.post("/v1/chat/completions", content=CHAT).status_code == 200  # still serving
    finally:
        output = stop(process)
    # The peak resident memory grew by far less than one 50 MB body (and less than 16 MiB).
    assert after["VmHWM"] - before["VmHWM"] < 16 * 1024, (before, after, output)
    assert after["VmRSS"] - before["VmRSS"] < 16 * 1024, (before, after, output)
    assert "Traceback" not in output, output


def test_a_request_within_the_limit_is_answered():
    app = create_app(RandomPolicy(seed=1), max_request_bytes=4096)
    with ServerThread(app) as server:
        small = httpx.post(server.base_url + "/v1/chat/completions", content=CHAT)
        large = httpx.post(server.base_url + "/v1/chat/completions", content=b" " * 5000 + CHAT)
    assert small.status_code == 200
    assert large.status_code == 413


def test_bodies_in_flight_are_bounded_across_connections_and_the_excess_gets_503_with_retry_after(tmp_path):
    """Issue 30 item 3: before the bound, 8 concurrent bodies just under the size limit were
    all read and held at once (+2.1 GB at 15 MiB each); now the bodies in flight hold at most
    ``--max-inflight-bytes`` together, the next one is refused unread, and memory stays flat."""
    process, socket_path = serve_process(tmp_path, "--max-request-bytes", str(MiB),
                                         "--max-inflight-bytes", str(2 * MiB), "--body-timeout", "30")
    holders: list[socket.socket] = []
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(socket_path)), base_url="http://localhost") as client:
            assert client.post("/v1/chat/completions", content=CHAT).status_code == 200  # warm
            before = memory_kib(process.pid)
            for _ in range(2):  # two clients declare a full body each and send half of it
                sock = unix_socket(socket_path)
                sock.sendall(request_head("/v1/chat/completions", MiB) + b" " * (MiB // 2))
                holders.append(sock)
            deadline = time.monotonic() + GUARD_S
            while client.get("/health").json()["inflight_bytes"] < 2 * MiB:
                assert time.monotonic() < deadline, "the holders' bodies never counted"
                time.sleep(0.05)
            refused = []
            for _ in range(8):  # eight more large bodies at once: none is read
                with unix_socket(socket_path) as sock:
                    sock.sendall(request_head("/v1/chat/completions", MiB // 2))
                    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                        sock.sendall(b" " * (MiB // 2))
                    refused.append(read_response(sock))
            assert [status for status, _, _ in refused] == [503] * 8
            _, headers, body = refused[0]
            assert headers.get("retry-after") == "1" and headers.get("connection") == "close"
            assert "retry" in json.loads(body)["error"]["message"]
            small = client.post("/v1/chat/completions", content=CHAT)
            assert small.status_code == 503 and small.headers["retry-after"] == "1"  # the bound is for all
            health = client.get("/health").json()
            assert health["refused"]["busy"] == 9 and health["inflight_bytes"] == 2 * MiB
            for sock in holders:  # the holders go away: their bytes are released
                sock.close()
            holders.clear()
            deadline = time.monotonic() + GUARD_S
            while client.get("/health").json()["inflight_bytes"] != 0:
                assert time.monotonic() < deadline, "the holders' bytes were never released"
                time.sleep(0.05)
            assert client.post("/v1/chat/completions", content=CHAT).status_code == 200
            after = memory_kib(process.pid)
    finally:
        for sock in holders:
            sock.close()
        output = stop(process)
    # what the server held: the two half bodies, not ten bodies' worth
    assert after["VmHWM"] - before["VmHWM"] < 16 * 1024, (before, after, output)
    assert "Traceback" not in output, output


# ------------------------------------------------------------------ slow clients
def test_a_slow_body_is_cut_off_at_the_timeout():
    app = create_app(RandomPolicy(seed=1), body_timeout_s=1.0)
    with ServerThread(app) as server:
        # Half a body, then silence.
        with tcp_socket(server) as sock:
            sock.sendall(request_head("/v1/chat/completions", len(CHAT)) + CHAT[:10])
            status, headers, body = read_response(sock)
        assert status == 408 and headers.get("connection") == "close"
        assert set(json.loads(body)["error"]) == {"message", "type", "param", "code"}

        # A body dripped a byte at a time never completes: the timeout is for the whole body.
        with tcp_socket(server) as sock:
            sock.sendall(request_head("/v1/messages", len(CHAT)))
            closed = threading.Event()
            dripped = []

            def drip() -> None:
                for byte in CHAT:
                    if closed.is_set():
                        return
                    try:
                        sock.sendall(bytes([byte]))
                    except OSError:
                        return
                    dripped.append(byte)
                    time.sleep(0.2)

            sender = threading.Thread(target=drip)
            sender.start()
            status, _, body = read_response(sock)
            closed.set()
            sender.join()
        assert status == 408 and json.loads(body)["type"] == "error"
        assert len(dripped) < len(CHAT)  # cut off before the body was complete
        assert httpx.post(server.base_url + "/v1/chat/completions", content=CHAT).status_code == 200


def test_slow_headers_are_cut_off_at_the_timeout():
    app = create_app(RandomPolicy(seed=1))
    with ServerThread(app, header_timeout_s=1.0) as server, tcp_socket(server) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n")
        lines_sent = 0
        sock.settimeout(0.2)
        closed = False
        for index in range(GUARD_S * 5):  # one header line every 0.2 s: slowloris
            try:
                if sock.recv(1024) == b"":
                    closed = True
                    break
            except TimeoutError:
                pass
            except ConnectionResetError:
                closed = True
                break
            try:
                sock.sendall(f"X-Slow-{index}: 1\r\n".encode())
            except OSError:
                closed = True
                break
            lines_sent += 1
        assert closed, "the server kept a connection whose headers never ended"
        assert lines_sent < GUARD_S * 5


# ------------------------------------------------------------------ the recorder's memory
def test_the_recorder_stays_within_its_memory_bound_over_a_long_session():
    bound = 64 * 1024
    recorder = ConversationRecorder(max_memory_bytes=bound)
    app = create_app(Scripted(), recorder=recorder)
    messages = [{"role": "system", "content": "You are a long-running agent. " * 20}]
    peaks = []
    with ServerThread(app) as server, httpx.Client(base_url=server.base_url, timeout=GUARD_S) as client:
        for turn in range(60):
            messages.append({"role": "user", "content": f"step {turn}: " + "details " * 40})
            response = client.post("/s/long/v1/chat/completions", json={"messages": messages, "max_tokens": 50})
            assert response.status_code == 200, response.text
            messages.append({"role": "assistant", "content": response.json()["choices"][0]["message"]["content"]})
            peaks.append(recorder.memory_bytes)
        other = client.post("/s/other/v1/chat/completions", json={"messages": messages[:2], "max_tokens": 5})
        assert other.status_code == 200
    assert max(peaks) <= bound
    records = recorder.records("long")
    assert [r["index"] for r in records] == list(range(60))  # nothing lost
    assert sum(len(r["prompt_ids"]) for r in records) > 10 * bound // 8  # far more than the bound holds
    lengths = [len(r["prompt_ids"]) for r in records]
    assert lengths == sorted(lengths)
    trajectory = recorder.to_trajectory("long")
    assert len(trajectory.turns) == 60 and trajectory.turns[-1].prompt_ids == records[-1]["prompt_ids"]
    assert recorder.sessions() == ["long", "other"]
    recorder.end("long")  # a finished conversation leaves memory; its records stay readable
    recorder.end("other")
    assert recorder.memory_bytes == 0
    assert [r["index"] for r in recorder.records("long")] == list(range(60))
    assert len(recorder.records("other")) == 1
    spill = recorder.spill_dir
    assert spill is not None and spill.is_dir()
    recorder.close()
    assert not spill.exists()


def test_a_recorder_with_a_record_dir_keeps_records_on_disk_not_in_memory(tmp_path):
    recorder = ConversationRecorder(tmp_path / "records", max_memory_bytes=4096)
    with ServerThread(create_app(Scripted(), recorder=recorder)) as server:
        for turn in range(5):
            body = {"messages": [{"role": "user", "content": f"question {turn} " + "x" * 3000}], "max_tokens": 5}
            assert httpx.post(server.base_url + "/s/disk/v1/chat/completions", json=body).status_code == 200
            assert recorder.memory_bytes <= 4096
    lines = (tmp_path / "records" / "disk.jsonl").read_text().splitlines()
    assert len(lines) == 5 and [r["index"] for r in recorder.records("disk")] == list(range(5))


# ------------------------------------------------------------------ session names
def test_session_names_never_share_a_record_file(tmp_path):
    long_a, long_b = "x" * 120 + "a", "x" * 120 + "b"
    names = ["a/b", "a_b", "a%00b", "a\x00b", "a b", long_a, long_b, "..", ".", "conv-1", "A_B"]
    names.append(session_file_name("a/b").removesuffix(".jsonl"))  # a name shaped like an encoded one
    files = [session_file_name(name) for name in names]
    assert len(set(files)) == len(names), files
    assert all(re.fullmatch(r"[A-Za-z0-9._-]{1,200}\.jsonl", f) and not f.startswith(".") for f in files)
    assert session_file_name("task-3") == "task-3.jsonl"  # plain names stay readable

    recorder = ConversationRecorder(tmp_path / "records")
    sent = ["a/b", "a_b", "a%00b", long_a, long_b]
    with ServerThread(create_app(Scripted(), recorder=recorder)) as server:
        for name in sent:
            response = httpx.post(server.base_url + "/v1/chat/completions", content=CHAT,
                                  headers={"X-Harnessrl-Session": name, "Content-Type": "application/json"})
            assert response.status_code == 200
    files = sorted((tmp_path / "records").glob("*.jsonl"))
    assert len(files) == len(sent)
    assert sorted(json.loads(f.read_text().splitlines()[0])["session"] for f in files) == sorted(sent)
    assert all(len(f.read_text().splitlines()) == 1 for f in files)
    assert sorted(ConversationRecorder.load(tmp_path / "records").sessions()) == sorted(sent)


# ------------------------------------------------------------------ disconnects and the key
def test_a_client_that_goes_away_costs_one_log_line_and_the_key_comes_from_the_environment(tmp_path):
    process, socket_path = serve_process(tmp_path, env={"HARNESSRL_API_KEY": "secret-from-env"})
    try:
        assert "secret-from-env" not in Path(f"/proc/{process.pid}/cmdline").read_bytes().decode()
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(socket_path)), base_url="http://localhost") as client:
            refused = client.post("/v1/chat/completions", content=CHAT)
            allowed = client.post("/v1/chat/completions", content=CHAT, headers={"Authorization": "Bearer secret-from-env"})
        with unix_socket(socket_path) as sock:  # half a body, then the client is gone
            head = request_head("/v1/chat/completions", len(CHAT)).replace(
                b"\r\n\r\n", b"\r\nx-api-key: secret-from-env\r\n\r\n")
            sock.sendall(head + CHAT[:10])
            time.sleep(0.5)
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(socket_path)), base_url="http://localhost") as client:
            after = client.post("/v1/chat/completions", content=CHAT, headers={"x-api-key": "secret-from-env"})
    finally:
        output = stop(process)
    assert refused.status_code == 401 and allowed.status_code == 200 and after.status_code == 200
    assert "Traceback" not in output, output
    assert len([line for line in output.splitlines() if "disconnected" in line]) == 1, output


def test_serve_help_names_the_api_key_variable():
    result = subprocess.run([sys.executable, "-m", "harnessrl.cli", "serve", "--help"], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": SRC}, timeout=GUARD_S)
    assert "HARNESSRL_API_KEY" in result.stdout


@pytest.mark.parametrize("flag", ["--max-request-bytes", "--max-inflight-bytes", "--body-timeout", "--header-timeout"])
def test_serve_refuses_non_positive_limits(flag, capsys):
    from harnessrl.cli import main

    assert main(["serve", "--policy", "random", flag, "0"]) == 2
    assert flag in capsys.readouterr().err


def test_the_command_line_defaults_are_the_servers():
    from harnessrl.cli import serve as serve_cli
    from harnessrl.serve import app, runner

    assert serve_cli.MAX_REQUEST_BYTES == app.MAX_REQUEST_BYTES
    assert serve_cli.BODY_TIMEOUT_S == app.BODY_TIMEOUT_S
    assert serve_cli.HEADER_TIMEOUT_S == runner.HEADER_TIMEOUT_S
