"""A stand-in service for the README's quickstart, in its two versions: version 1 on
the first port, version 2 (300 ms slower: the bad release) on the second.

    python3 deploy/examples/quickstart_service.py 9001 9002
"""

from __future__ import annotations

import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SLOWER_MS = 300


def serve(port: int, version: int, delay_ms: float) -> ThreadingHTTPServer:
    body = f"shop version {version}\n".encode()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # the standard library names it
            time.sleep(delay_ms / 1000)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *values: object) -> None:
            pass  # quiet: the sidecar measures every request

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main(argv: list[str]) -> None:
    if len(argv) != 2 or not all(arg.isdigit() for arg in argv):
        sys.exit("usage: quickstart_service.py PORT_V1 PORT_V2")
    for port, version, delay_ms in ((int(argv[0]), 1, 0), (int(argv[1]), 2, SLOWER_MS)):
        try:
            serve(port, version, delay_ms)
        except (OSError, OverflowError) as exc:  # a port in use or out of range
            sys.exit(f"quickstart_service.py: cannot listen on 127.0.0.1:{port}: "
                     f"{getattr(exc, 'strerror', None) or exc}")
    print(f"shop version 1 on 127.0.0.1:{argv[0]}, version 2 (+{SLOWER_MS} ms) on "
          f"127.0.0.1:{argv[1]}", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1:])
