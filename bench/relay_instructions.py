"""Instructions the gateway executes per relayed stream chunk, counted by valgrind's callgrind (issue 11).

    .venv/bin/python bench/relay_instructions.py [--streams 8] [--rounds 2] [--token-gap-ms 300] [--tokens 32]

Wall time and /proc CPU on a shared 2-core machine move by ±30 % from run to run; instruction counts do not. The
gateway (as bench/gateway_overhead.py starts it: SQLite store, API key, a project with a requests-per-minute quota)
runs under `valgrind --tool=callgrind` in front of bench/gateway_gaps.py's mock engine. Once it answers, its counters
are zeroed (`callgrind_control --zero`); `--streams` clients then each run `--rounds` streams of `--tokens` content
chunks `--token-gap-ms` apart (meant to be wide enough that the slowed gateway keeps up, so each engine read holds
one event: the worst case, no batching; see "Reads" below); then the counters are dumped. Printed: user-space
instructions (Ir) per content chunk relayed, the streams' setup (auth, reservation, settlement) amortised in, and
the top functions by inclusive cost in the dump (`callgrind_annotate`). Kernel time (socket syscalls) is not counted. Two runs with different
`--tokens` separate the cost per chunk (the difference over the difference in chunks) from the cost per stream.

Reads: the gateway's socket `recv` calls (callgrind's call count; engine and client sockets: a stream of n tokens
has about n + 2 engine reads and a few more for the request without batching). When the machine is loaded the slowed
gateway falls behind and one read brings several events, which costs fewer instructions per chunk: compare runs at
about the same chunks per read (use `--streams 4 --rounds 4` on a loaded machine), or runs made side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_gaps import TOKEN_MARK, stop_all  # noqa: E402
from gateway_overhead import ROOT, _free_port, _wait_http  # noqa: E402


async def _streams(port: int, key: str, streams: int, rounds: int, tokens: int) -> int:
    body = json.dumps({"model": "mock", "stream": True, "max_tokens": tokens,
                       "messages": [{"role": "user", "content": "Count, please."}]}).encode()
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
               b"authorization: Bearer " + key.encode() + b"\r\ncontent-length: " + str(len(body)).encode()
               + b"\r\n\r\n" + body)

    async def client(delay: float) -> int:
        await asyncio.sleep(delay)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        chunks = 0
        for _ in range(rounds):
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head
            tail = b""
            while not tail.endswith(b"\r\n0\r\n\r\n"):
                data = await reader.read(65536)
                if not data:
                    raise ConnectionError("the gateway closed the stream")
                chunks += data.count(TOKEN_MARK)
                tail = (tail + data)[-16:]
        writer.close()
        return chunks

    return sum(await asyncio.gather(*(client(0.05 * i) for i in range(streams))))


def _calls(dump: Path, function: str) -> int:
    """How often the C function `function` ("file.c:name ") was called in a callgrind dump: the sum of its callers'
    call counts in `callgrind_annotate --tree=caller`."""
    tree = subprocess.run(["callgrind_annotate", "--tree=caller", "--threshold=100", "--auto=no", str(dump)],
                          capture_output=True, text=True).stdout
    for block in tree.split("\n\n"):
        if any("*  " in line and function in line for line in block.splitlines()):
            return sum(int(n.replace(",", "")) for n in re.findall(r"\(([\d,]+)x\)", block))
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--token-gap-ms", type=float, default=300)
    args = parser.parse_args()
    state = tempfile.mkdtemp(prefix="llmgw-bench-ir-")
    me = [sys.executable, str(Path(__file__).with_name("gateway_overhead.py"))]
    mock_port, port = _free_port(), _free_port()
    out = Path(state, "callgrind.out")
    mock = subprocess.Popen([*me, "mock-sse", str(mock_port), str(args.token_gap_ms), str(args.tokens)])
    gateway = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "-q", *me, "gateway",
                                str(port), str(mock_port), state], cwd=ROOT, stderr=subprocess.DEVNULL)
    try:
        _wait_http(mock_port, "/health", 20)
        _wait_http(port, "/health", 600)
        key = Path(state, "key").read_text()
        asyncio.run(_streams(port, key, 1, 1, args.tokens))  # first-use costs (imports, connections) before counting
        subprocess.run(["callgrind_control", "--zero", str(gateway.pid)], check=True, capture_output=True)
        began = time.monotonic()
        chunks = asyncio.run(_streams(port, key, args.streams, args.rounds, args.tokens))
        took = time.monotonic() - began
        subprocess.run(["callgrind_control", "--dump", str(gateway.pid)], check=True, capture_output=True)
        dumps = sorted(Path(state).glob("callgrind.out*"), key=os.path.getmtime)
        annotate = subprocess.run(["callgrind_annotate", "--inclusive=yes", str(dumps[-1])], capture_output=True,
                                  text=True).stdout
        total = next(int(line.split()[0].replace(",", "")) for line in annotate.splitlines()
                     if line.strip().endswith("PROGRAM TOTALS"))
        reads = _calls(dumps[-1], "socketmodule.c:sock_recv ")
        print(f"{chunks} content chunks in {args.streams} x {args.rounds} streams ({took:.0f} s under valgrind): "
              f"{total:,} Ir, {total / chunks:,.0f} Ir per chunk; {reads:,} socket reads "
              f"({chunks / max(reads, 1):.2f} chunks per read: above about 1.0 the slowed gateway fell behind)")
        print("\n".join(annotate.splitlines()[:60]) if os.environ.get("LLMGW_BENCH_ANNOTATE") else "")
    finally:
        stop_all([gateway, mock], 20)


if __name__ == "__main__":
    main()
