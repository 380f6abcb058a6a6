"""``python -m bench.probe PORT``: the event-loop lag prober. It sends ``GET /health`` on one
kept-alive connection every 10 ms; each line on stdin names the phase the next samples belong to;
when stdin closes it prints ``{phase: [milliseconds, ...]}``.

``fleet web`` answers ``/health`` in its ASGI middleware, on the event loop, so its latency is the
loop's lag plus a loopback round trip. The prober is its own process so that the benchmark's
client (hundreds of SSE streams on its own loop) is not part of what it measures.
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
import time

INTERVAL = 0.01


def main() -> None:
    port = int(sys.argv[1])
    phase = ["idle"]
    done = threading.Event()

    def read_phases() -> None:
        for line in sys.stdin:
            phase[0] = line.strip()
        done.set()

    threading.Thread(target=read_phases, daemon=True).start()
    samples: dict[str, list[float]] = {}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    while not done.wait(INTERVAL):
        started = time.perf_counter()
        conn.request("GET", "/health")
        conn.getresponse().read()
        samples.setdefault(phase[0], []).append((time.perf_counter() - started) * 1000)
    conn.close()
    print(json.dumps(samples), flush=True)


if __name__ == "__main__":
    main()
