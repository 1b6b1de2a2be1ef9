"""A small control plane for the wire tests, run as its own process: `python control_plane_script.py [--ca-dir D]`.

It prints `PORT <connect port> <join port or 0>` once listening, then one line per event ("closed <peer>",
"cancelled <peer>"). Its handler answers each agent message:
  Register                 -> Registered(node_id=<Register.node_id>, control_plane_version="cert=<cert name>")
  Heartbeat                -> ControlMessage(command_id="<sender protocol>:<heartbeat time>")
  LogLines ["bye"]         -> returns (the RPC ends with OK)
  LogLines ["fail"]        -> raises WireError("the test asked this stream to fail")
With --ca-dir, the CA there (made if absent) serves mTLS and answers Join; `--token-file F` writes a fresh join
token into F before listening. `--busy-ms N`: a task keeps the trio loop busy, N ms of synchronous work in every turn
of the scheduler (as a control plane's passes, status documents and audit do under load).
"""

from __future__ import annotations

import argparse
import sys
import time

import trio

from llmgw.errors import WireError
from llmgw.wire import CertificateAuthority, control_message, pb, serve_agents


async def handler(link, peer: str) -> None:  # type: ignore[no-untyped-def]
    try:
        while True:
            try:
                message = await link.receive()
            except trio.EndOfChannel:
                print(f"closed {peer}", flush=True)
                return
            kind = message.WhichOneof("body")
            if kind == "register":
                registered = pb.Registered(
                    node_id=message.register.node_id, control_plane_version=f"cert={link.peer_certificate_name}"
                )
                await link.send(control_message(registered=registered))
            elif kind == "heartbeat":
                await link.send(control_message(command_id=f"{message.protocol}:{message.heartbeat.time:g}"))
            elif kind == "log_lines" and list(message.log_lines.lines) == ["bye"]:
                return
            elif kind == "log_lines" and list(message.log_lines.lines) == ["fail"]:
                raise WireError("the test asked this stream to fail")
    except trio.Cancelled:
        print(f"cancelled {peer}", flush=True)
        raise


async def keep_busy(milliseconds: float) -> None:
    while True:
        time.sleep(milliseconds / 1000)  # blocks the trio thread, as a long synchronous computation does
        await trio.sleep(0)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ca-dir")
    parser.add_argument("--token-file")
    parser.add_argument("--busy-ms", type=float, default=0.0)
    args = parser.parse_args()
    tls = join = None
    if args.ca_dir:
        join = CertificateAuthority.load_or_create(args.ca_dir)
        tls = join.server_tls(["127.0.0.1", "localhost"])
        if args.token_file:
            with open(args.token_file, "w") as f:
                f.write(join.create_join_token(600))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(lambda task_status: serve_agents(
            handler, "127.0.0.1", 0, tls=tls, join=join, task_status=task_status
        ))
        print(f"PORT {int(port)} {port.join_port or 0}", flush=True)
        if args.busy_ms:
            nursery.start_soon(keep_busy, args.busy_ms)


if __name__ == "__main__":
    try:
        trio.run(main)
    except KeyboardInterrupt:
        sys.exit(0)
