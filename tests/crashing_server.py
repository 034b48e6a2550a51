#!/usr/bin/env python3
"""A stand-in llama-server that crashes on purpose: it answers --help, --version, /health and
/props like the real one, then kills itself with a signal at its Nth completion request.

Only for fault tests (how the tuner names a server's death and how fast it stops); nothing is
measured against it. Environment: CRASH_SIGNAL (default ILL), CRASH_AT (default 1: the first
/completion request).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HELP = "usage: llama-server [options]\n  --spec-draft-max-slots N  no new drafts above N slots\n"


def main(argv: list[str]) -> None:
    if "--help" in argv:
        print(HELP)
        return
    if "--version" in argv:
        print("version: 0 (crashing stand-in)\nbuilt with python")
        return
    if "--list-devices" in argv:
        print("Available devices:")
        return
    host = argv[argv.index("--host") + 1]
    port = int(argv[argv.index("--port") + 1])
    slots = int(argv[argv.index("--parallel") + 1]) if "--parallel" in argv else 1
    crash = getattr(signal, f"SIG{os.environ.get('CRASH_SIGNAL', 'ILL')}")
    crash_at = int(os.environ.get("CRASH_AT", "1"))
    signal.signal(crash, signal.SIG_DFL)  # the default action: die by it, as a crash does
    completions = 0

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            print("request:", self.command, self.path, flush=True)

        def _json(self, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._json({"status": "ok"})
            elif self.path == "/props":
                self._json({"total_slots": slots, "model_path": "stand-in"})
            else:
                self._json({})

        def do_POST(self) -> None:
            nonlocal completions
            completions += 1
            if completions >= crash_at:
                print(f"crashing with {crash.name} at completion {completions}", flush=True)
                os.kill(os.getpid(), crash)
                # The signal kills the process a moment later; this thread must not answer
                # the request meanwhile (it did, now and then: the request then passed).
                time.sleep(60)
            self._json({"tokens": [1, 2, 3]} if self.path == "/tokenize" else {})

    print("system_info: stand-in", flush=True)
    ThreadingHTTPServer((host, port), Handler).serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
