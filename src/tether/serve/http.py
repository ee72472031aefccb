"""A uvicorn server on its own thread, bound before it starts (so port 0 gives a known free port).

    server = HTTPThread(app, "127.0.0.1", 0, name="tether-tinker")   # started; server.port is bound
    server.close()
"""

from __future__ import annotations

import socket
import threading
import time


class HTTPThread:
    """`app` served by uvicorn on `host:port` in a daemon thread; `close()` stops it."""

    def __init__(self, app, host: str, port: int, name: str, start_timeout_s: float = 30.0) -> None:
        import uvicorn

        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        self.host, self.port = host, sock.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True, name=name)
        self._thread.start()
        deadline = time.monotonic() + start_timeout_s
        while not self._server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self._server.started:
            self.close()
            raise RuntimeError(f"the HTTP server {name} did not start on {host}:{self.port}")

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(10.0)
