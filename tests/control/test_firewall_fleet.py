"""The firewall through the whole system, in network namespaces (issue 29; tests/support/netns.py): `llmgw server`
and an `llmgw agent` on a control-plane host, an agent (root) on a node host running a real llama-server with
Gemma 3 270M behind its relay, and a client host that is neither. A settings push turns the firewall on: each agent applies the
table the control plane rendered for it, the gateway still answers the client, and the client is refused at once
(a reset) on the relay's port, the agents' port and the admin port, while the node still reaches the agents' port;
a push turning it off removes the tables, and the ports open again."""

from __future__ import annotations

import json
import sys

import pytest
import settings_seed
from support.waiting import wait_for

from .conftest import git

GATEWAY, ADMIN, AGENTS = 8080, 8081, 8082


@pytest.mark.slow
def test_a_settings_push_closes_the_node_to_a_client_and_another_opens_it(
    tmp_path, netns_lab, llama_server_binary, gemma_mirror,
) -> None:
    from llmgw.settings import init_repository
    from llmgw.store import open_store

    cp, node, client = (netns_lab.host(name) for name in ("cp", "node", "client"))
    seed = settings_seed.write_seed(tmp_path / "seed", "gemma-3-270m", settings_seed.GEMMA_YAML.format(replicas=1).replace(
        "node_selector: {engine: real}", "node_selector: {role: engines}"), poll="500ms")
    llmgw_yaml = (seed / "llmgw.yaml").read_text()
    for name, port in (("gateway", GATEWAY), ("admin", ADMIN), ("agents", AGENTS)):
        llmgw_yaml = llmgw_yaml.replace(f"  {name}: {{host: 127.0.0.1, port: 0}}",
                                        f"  {name}: {{host: {cp.address}, port: {port}}}")
    (seed / "llmgw.yaml").write_text(llmgw_yaml + f"control_planes: ['{cp.address}:{AGENTS}']\n")
    (seed / "firewall.yaml").write_text(f"enabled: false\ncontrol_planes: [{cp.address}]\n"
                                        f"gateway_sources: [{netns_lab.network}]\nrollback_after: 5s\n")
    repo = tmp_path / "settings.git"
    init_repository(repo, seed)
    state = tmp_path / "state"
    logs = {name: open(tmp_path / f"{name}.log", "wb") for name in ("server", "agent")}
    cp.popen([sys.executable, "-m", "llmgw.cli", "server", "--repo", str(repo), "--state", str(state), "--insecure"],
             stdout=logs["server"], stderr=logs["server"])
    for host, role in ((node, "engines"), (cp, "control-plane")):  # the control plane's host runs an agent too
        host.popen([sys.executable, "-m", "llmgw.cli", "agent", "--control-plane", f"{cp.address}:{AGENTS}",
                    "--node-id", host.name, "--state-dir", str(tmp_path / f"agent-{host.name}"), "--mirror",
                    str(gemma_mirror), "--address", host.address, "--label", f"role={role}", "--heartbeat-interval",
                    "200ms", "--insecure", "--engine-binary", f"llama.cpp@b11434={llama_server_binary}",
                    "--stop-shards-on-exit"],
                   stdout=logs["agent"], stderr=logs["agent"])

    def status_text() -> str:
        token = (state / "admin-token").read_text().strip()
        return cp.run(["curl", "-s", "-H", f"Authorization: Bearer {token}",
                       f"http://{cp.address}:{ADMIN}/api/v1/status"], check=False).stdout

    def status() -> dict:
        return json.loads(status_text() or "null") or {}

    def show() -> str:
        return "\n".join(f"--- {name}\n" + (tmp_path / f"{name}.log").read_text()[-3000:] for name in logs) + (
            "\n--- status\n" + status_text()[:3000])

    def relay_port() -> int:
        """The port listening on the node's address: the relay's (the engine itself listens on loopback)."""
        if not [s for s in status()["nodes"]["node"]["shards"].values() if s.get("state") == "ready"]:
            return 0
        ports = [line.split()[3].rpartition(":")[2] for line in node.run(["ss", "-ltnH"]).stdout.splitlines()
                 if line.split()[3].startswith(node.address + ":")]
        return int(ports[0]) if len(ports) == 1 else 0

    port = wait_for(relay_port, 90, "Gemma ready on the node, behind its relay", show)
    _record, key = open_store(state / "llmgw.sqlite3").create_api_key("demo")

    def ask() -> str:
        body = json.dumps({"model": "gemma-3-270m", "prompt": "The capital of France is", "max_tokens": 4,
                           "temperature": 0})
        return client.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H", f"Authorization: Bearer {key}",
                           "-H", "Content-Type: application/json", "-d", body,
                           f"http://{cp.address}:{GATEWAY}/v1/completions"], check=False).stdout

    def refused(host, address: str, port: int) -> bool:
        done = host.run(["curl", "-s", "-o", "/dev/null", "-m", "3", f"http://{address}:{port}/"], check=False)
        return done.returncode == 7  # curl: failed to connect (a reset on the SYN), not 28 (timed out)

    def table(host) -> str:
        return host.run(["nft", "list", "table", "inet", "llmgw"], check=False).stdout

    wait_for(lambda: ask() == "200", 30, "the gateway answering the client", show)
    assert not refused(client, node.address, port)

    checkout = tmp_path / "checkout"
    git("clone", "-q", str(repo), str(checkout), cwd=tmp_path)
    firewall = checkout / "firewall.yaml"
    firewall.write_text(firewall.read_text().replace("enabled: false", "enabled: true"))
    git("commit", "-qam", "firewall on", cwd=checkout)
    git("push", "-q", "origin", "HEAD:main", cwd=checkout)
    wait_for(lambda: "control planes and gateways" in table(node) and "agents" in table(cp), 30, "the tables", show)
    for host in (node, cp):
        document = json.loads(host.run(["nft", "-j", "list", "ruleset"]).stdout)
        assert [i["table"]["name"] for i in document["nftables"] if "table" in i] == ["llmgw"]
    assert refused(client, node.address, port), "the relay's port is open to a client"
    assert refused(client, cp.address, AGENTS) and refused(client, cp.address, ADMIN)
    assert not refused(node, cp.address, AGENTS)  # the agents' listener is open to the nodes
    assert ask() == "200", show()  # the gateway reaches the relay; the client reaches the gateway
    digest = wait_for(lambda: status()["nodes"]["node"]["firewall"]["digest"], 10, "the node's firewall report", show)
    shown = cp.run([sys.executable, "-m", "llmgw.cli", "nodes", "--state", str(state)]).stdout
    assert f"firewall: table inet llmgw {digest}" in shown, shown
    printed = cp.run([sys.executable, "-m", "llmgw.cli", "firewall", "show", "node", "--repo", str(repo),
                      "--state", str(state)]).stdout
    assert f"table inet llmgw, digest {digest}" in printed  # what `show` prints is what the node applied
    wait_for(lambda: status()["pass"]["converged"], 30, "the pass converged with the table applied", show)

    firewall.write_text(firewall.read_text().replace("enabled: true", "enabled: false"))
    git("commit", "-qam", "firewall off", cwd=checkout)
    git("push", "-q", "origin", "HEAD:main", cwd=checkout)
    wait_for(lambda: table(node) == table(cp) == "", 30, "the tables removed", show)
    assert not refused(client, node.address, port) and not refused(client, cp.address, AGENTS) and ask() == "200"
