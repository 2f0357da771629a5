"""An ssh ProxyCommand that adds latency: bytes between ssh (stdin/stdout) and HOST:PORT are each held DELAY_S
seconds one way, so a round trip gains 2 × DELAY_S (bandwidth is not limited; order is kept).

Usage (in an ssh_config): ProxyCommand python3 bench/delay_proxy.py 127.0.0.1 2222 0.025
"""

from __future__ import annotations

import os
import queue
import socket
import sys
import threading
import time


def pump(read: object, write: object, delay_s: float) -> None:
    """Copy chunks from `read()` to `write(chunk)`, each sent `delay_s` after it arrived; b"" ends it."""
    held: queue.Queue[tuple[float, bytes]] = queue.Queue()

    def sender() -> None:
        while True:
            due, chunk = held.get()
            time.sleep(max(due - time.monotonic(), 0.0))
            write(chunk)  # type: ignore[operator]
            if not chunk:
                return

    thread = threading.Thread(target=sender, daemon=True)
    thread.start()
    while True:
        chunk = read()  # type: ignore[operator]
        held.put((time.monotonic() + delay_s, chunk))
        if not chunk:
            thread.join()
            return


def main() -> None:
    host, port, delay_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    conn = socket.create_connection((host, port))
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def to_stdout(chunk: bytes) -> None:
        if chunk:
            os.write(1, chunk)
        else:
            os.close(1)

    def to_socket(chunk: bytes) -> None:
        if chunk:
            conn.sendall(chunk)
        else:
            conn.shutdown(socket.SHUT_WR)

    upstream = threading.Thread(target=pump, args=(lambda: os.read(0, 65536), to_socket, delay_s), daemon=True)
    upstream.start()
    pump(lambda: conn.recv(65536), to_stdout, delay_s)


if __name__ == "__main__":
    main()
