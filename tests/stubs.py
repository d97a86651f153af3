"""Base of the HTTP stand-ins in the tests (engines that cannot run here, fault injection):
JSON and plain-text answers with their lengths, and no request log on stderr."""

import json
from http.server import BaseHTTPRequestHandler


class StubHandler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(
        self, data: bytes, content_type: str, status: int = 200, headers: dict | None = None
    ) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _json(self, obj, status: int = 200) -> None:
        self._send(json.dumps(obj).encode(), "application/json", status)

    def _text(
        self, text: str, content_type: str = "text/plain; version=0.0.4; charset=utf-8"
    ) -> None:
        self._send(text.encode(), content_type)
