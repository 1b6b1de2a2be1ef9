"""A tiny engine stand-in for supervisor tests: `python engine_standin.py --port N`.

Answers GET /health (503 for STANDIN_READY_AFTER seconds, then 200) and GET /v1/models; prints a line per
request and one at start. STANDIN_EXIT_AFTER=<s> makes it exit with status 3 after that long;
STANDIN_IGNORE_TERM=1 makes it ignore SIGTERM (to test the SIGKILL after the grace period).
"""

import http.server
import json
import os
import signal
import sys
import threading
import time

port = int(sys.argv[sys.argv.index("--port") + 1])
ready_at = time.monotonic() + float(os.environ.get("STANDIN_READY_AFTER", "0"))
if os.environ.get("STANDIN_IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.environ.get("STANDIN_EXIT_AFTER"):
    def _exit_later():
        time.sleep(float(os.environ["STANDIN_EXIT_AFTER"]))
        print("standin: giving up now", flush=True)
        os._exit(3)
    threading.Thread(target=_exit_later, daemon=True).start()


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/health":
            code = 200 if time.monotonic() >= ready_at else 503
            body = json.dumps({"status": "ok" if code == 200 else "loading model"}).encode()
        else:
            code, body = 200, json.dumps({"data": [{"id": "standin"}], "threads": os.environ.get("OMP_NUM_THREADS")}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args):
        print("standin request:", fmt % args, flush=True)


print(f"standin: listening on {port} pid {os.getpid()}", flush=True)
http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
