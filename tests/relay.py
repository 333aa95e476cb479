"""A ProxyCommand for the tests: `relay.py LOG SOURCE HOST PORT` connects from address SOURCE
to HOST:PORT, appends one line to LOG, and relays its stdin and stdout to that connection,
until either side closes. Every login made through it is thus counted, and its sshd sees it
come from SOURCE."""
from __future__ import annotations

import os
import socket
import sys
import threading


def main() -> None:
    log, source, host, port = sys.argv[1:5]
    conn = socket.create_connection((host, int(port)), timeout=10, source_address=(source, 0))
    conn.settimeout(None)
    with open(log, "a") as f:
        f.write(f"{host}:{port} from {conn.getsockname()[0]}:{conn.getsockname()[1]}\n")

    def upstream() -> None:
        while True:
            data = os.read(0, 65536)
            if not data:
                conn.shutdown(socket.SHUT_WR)
                return
            conn.sendall(data)
    threading.Thread(target=upstream, daemon=True).start()
    while True:
        data = conn.recv(65536)
        if not data:
            return
        os.write(1, data)


if __name__ == "__main__":
    main()
