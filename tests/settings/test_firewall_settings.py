"""firewall.yaml (issue 29): the typed model, and each bad input an error at file:line:column from `llmgw validate`."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw.cli.main import cli
from llmgw.settings import load_directory
from settings_trees import copy_example

HEAD = "enabled: false\ncontrol_planes: [10.20.0.10]\n"

# case -> (firewall.yaml text, where, a fragment of the reason)
BAD = {
    "a network with host bits": (HEAD + "ssh_sources: [10.20.0.1/16]\n", "firewall.yaml:3:15",
                                 "has host bits set): write 10.20.0.0/16"),
    "an address out of range": (HEAD + "gateway_sources: [10.0.0.300/8]\n", "firewall.yaml:3:19",
                                "'10.0.0.300/8' is not a network"),
    "not a network at all": (HEAD + "admin_sources: [office]\n", "firewall.yaml:3:17", "is not a network: write"),
    "a port range the wrong way round": (
        HEAD + "rules:\n  - {name: x, ports: ['9000-8000']}\n", "firewall.yaml:4:23",
        "must run from a lower to a higher port"),
    "two rules of one name": (
        HEAD + "rules:\n  - {name: x, ports: [1]}\n  - {name: x, ports: [2]}\n", "firewall.yaml:5:12",
        "rule 'x' is defined twice"),
    "enabled with no control plane": ("enabled: true\n", "firewall.yaml:1:1",
                                      "enabled: true needs the control planes' networks"),
    "an unknown backend": (HEAD + "backend: iptables\n", "firewall.yaml:3:10", "'iptables' is not one of"),
    "the old default_policy key": (HEAD + "default_policy: drop\n", "firewall.yaml:3:1", "default_policy"),
}


def _tree(tmp_path: Path, text: str) -> Path:
    tree = copy_example(tmp_path / "settings")
    (tree / "firewall.yaml").write_text(text)
    return tree


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_firewall_settings_fail_validation_at_file_and_line(case: str, tmp_path: Path) -> None:
    text, where, reason = BAD[case]
    result = CliRunner().invoke(cli, ["validate", str(_tree(tmp_path, text))])
    assert result.exit_code == 1, result.output
    line = next((line for line in result.output.splitlines() if line.lstrip().startswith(where)), None)
    assert line is not None and reason in line, result.output


def test_networks_of_both_families_ports_and_groups_are_typed(tmp_path: Path) -> None:
    text = ("enabled: true\ncontrol_planes: [10.20.0.10, 'fd00::10/128']\ngateway_sources: [10.0.0.0/8, 'fd00::/8', "
            "10.0.0.0/8]\nssh_port: 2222\nrollback_after: 5s\nrules:\n  - name: exporter\n    ports: [9100, '20000-20999']\n"
            "    protocol: udp\n    labels: {pool: gpu}\n")
    firewall = load_directory(_tree(tmp_path, text)).firewall
    assert firewall.enabled and firewall.ssh_port == 2222 and firewall.rollback_after_seconds == 5.0
    assert firewall.control_planes == (ipaddress.ip_network("10.20.0.10/32"), ipaddress.ip_network("fd00::10/128"))
    assert firewall.gateway_sources == (ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("fd00::/8"))
    (rule,) = firewall.rules
    assert rule.ports == ((9100, 9100), (20000, 20999)) and rule.protocol == "udp"
    assert rule.applies_to({"pool": "gpu", "zone": "a"}) and not rule.applies_to({"pool": "cpu"})


def test_the_control_planes_of_llmgw_yaml_given_as_addresses_count(tmp_path: Path) -> None:
    tree = _tree(tmp_path, "enabled: true\n")
    llmgw = tree / "llmgw.yaml"
    llmgw.write_text(llmgw.read_text() + "control_planes: ['10.20.0.11:8082', '[fd00::11]:8082', 'cp3.example:8082']\n")
    firewall = load_directory(tree).firewall
    assert [str(n) for n in firewall.control_planes] == ["10.20.0.11/32", "fd00::11/128"]


def test_enabled_with_a_listener_on_any_free_port_is_an_error(tmp_path: Path) -> None:
    tree = _tree(tmp_path, "enabled: true\ncontrol_planes: [10.20.0.10]\n")
    llmgw = tree / "llmgw.yaml"
    llmgw.write_text(llmgw.read_text().replace("port: 8081", "port: 0"))
    result = CliRunner().invoke(cli, ["validate", str(tree)])
    assert result.exit_code == 1 and "firewall.yaml:1:1: enabled: enabled: true needs a fixed port for llmgw.yaml " \
        "listeners.admin" in result.output, result.output
