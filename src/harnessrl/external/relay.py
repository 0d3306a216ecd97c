"""TCP-to-Unix-socket relay: how an agent inside the sandbox reaches `harnessrl serve`.

The sandbox has its own network namespace with only loopback, so the host's 127.0.0.1 is out
of reach. The host serves on a Unix socket in a folder mounted (read-only) into the sandbox;
this relay, started inside the sandbox right before the agent, listens on
``127.0.0.1:PORT`` there and copies every connection's bytes to and from that socket. The agent
then sees a plain ``http://127.0.0.1:PORT`` base URL and nothing else.

This file is a standalone program (stdlib only, Python >= 3.8, run as ``python3 -I -S relay.py
HOST PORT SOCKET``): it binds and listens, then forks into the background, so that when the
command returns the port is accepting. It imports nothing from harnessrl.
"""

import contextlib
import os
import socket
import sys
import threading

CHUNK = 1 << 16


def pump(source, sink, done):
    """Copies ``source`` to ``sink`` until EOF, then half-closes ``sink``."""
    try:
        while True:
            data = source.recv(CHUNK)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
        done.release()


def relay(client, path):
    """Connects ``client`` to the Unix socket at ``path`` both ways; closes both at the end."""
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError:
        client.close()
        upstream.close()
        return
    done = threading.Semaphore(0)
    threading.Thread(target=pump, args=(client, upstream, done), daemon=True).start()
    pump(upstream, client, done)
    done.acquire()
    done.acquire()
    client.close()
    upstream.close()


def main(argv):
    if len(argv) != 4:
        sys.stderr.write("usage: relay.py HOST PORT SOCKET\n")
        return 2
    host, port, path = argv[1], int(argv[2]), argv[3]
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(128)
    if os.fork() > 0:
        os._exit(0)  # the port is open: the caller may start the agent
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    while True:
        try:
            client, _address = listener.accept()
        except OSError:
            continue
        threading.Thread(target=relay, args=(client, path), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
