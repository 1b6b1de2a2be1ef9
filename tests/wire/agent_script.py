"""An agent for the wire tests, run as its own process: `python agent_script.py HOST:PORT`.

It connects, sends Register (node id "script-agent"), prints "REGISTERED" when the answer comes, and then waits
until it is killed.
"""

from __future__ import annotations

import sys

import trio

from llmgw.wire import agent_message, connect, pb


async def main(address: str) -> None:
    async with connect(address) as link:
        await link.send(agent_message(register=pb.Register(node_id="script-agent")))
        await link.receive()
        print("REGISTERED", flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    trio.run(main, sys.argv[1])
