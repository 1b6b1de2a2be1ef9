"""Every value written into a generated file goes through one writer (llmgw.plan.conf_lines, issue 25 item 2): a
value that would change the file's meaning (a newline, `#`, `=`, whitespace in a token, a control character) is
refused naming the key and value, so the slurm.conf injection of issue 25 is refused by the writer even if an
address got past Register; a key outside the file's set is refused too, and the sets are exactly the renderer's
keys."""

from __future__ import annotations

import re
from types import MappingProxyType

import pytest

from llmgw.errors import GeneratedFileError
from llmgw.plan.conf_lines import Options, Quoted, conf_line, conf_value
from llmgw.plan.slurm_conf import SlurmHost, SlurmPaths, render_slurm, render_slurmdbd_conf
from llmgw.plan.slurm_roles import AGENT_PATHS
from llmgw.settings.slurm import SlurmNode, SlurmPartition, SlurmSettings
from llmgw.tools.conf_keys import GRES_CONF_KEYS, SLURM_CONF_KEYS, SLURMDBD_CONF_KEYS, rendered_problem

INJECTION = "10.0.0.9\nPrologSlurmctld=/x/evil.sh\nProlog=/x/evil.sh #"

HOSTILE_TOKENS = [
    INJECTION, "a\nb", "a\rb", "a\r\nb", "a\x00b", "a\x0bb", "a\x0cb", "a\x1bb", "a\x7fb", "a\x85b", "a\u2028b",
    "a\u2029b", "a b", "a\tb", "a\u00a0b", "a\u3000b", "a#b", "#", "a=b", "Prolog=/x", 'a"b', "", " a", "a ",
]
HOSTILE_QUOTED = ["a\nb", "a\rb", "a\x00b", 'a"b', 'x" Prolog="/x', "a#b", "a=b", "a\u2028b"]
HOSTILE_OPTIONS = [(("socket", "/run/a b"),), (("socket", "/run/a,ttl=1"),), (("socket", "a\nb"),),
                   (("so cket", "/run/a"),), (("socket", ""),), ()]


def slurm_settings(accounting: bool = True) -> SlurmSettings:
    return SlurmSettings(enabled=True, controller="n1", accounting=accounting,
                         nodes=MappingProxyType({"n1": SlurmNode("debug"), "n2": SlurmNode("gpu", lent=True)}),
                         partitions=MappingProxyType({"debug": SlurmPartition(default=True),
                                                      "gpu": SlurmPartition(max_time_seconds=3600.0)}))


def hosts(address: str = "10.0.0.1", hostname: str = "host-1") -> dict[str, SlurmHost]:
    return {"n1": SlurmHost("n1", address, 4, 8192, hostname=hostname),
            "n2": SlurmHost("n2", "10.0.0.2", 8, 16384, (("h100", "/dev/nvidia0"), ("h100", "/dev/nvidia1")))}


def keys_of(text: str) -> set[str]:
    return {key for line in text.splitlines() if line and not line.startswith("#")
            for key in re.findall(r'(?:^| )([A-Za-z]+)=', line)}


def test_the_reproduction_of_issue_25_is_refused_by_the_writer_naming_the_key_and_value():
    fleet = {**hosts(), "n2": SlurmHost("n2", INJECTION, 8, 16384)}  # a lendable node, not the controller
    with pytest.raises(GeneratedFileError) as caught:
        render_slurm(slurm_settings(), fleet)
    message = str(caught.value)
    assert "NodeAddr='10.0.0.9\\nPrologSlurmctld=/x/evil.sh\\nProlog=/x/evil.sh #'" in message
    assert "control character" in message


@pytest.mark.parametrize("value", HOSTILE_TOKENS, ids=[repr(v)[:30] for v in HOSTILE_TOKENS])
def test_a_hostile_token_is_refused_naming_the_key_and_value(value):
    with pytest.raises(GeneratedFileError) as caught:
        conf_line(SLURM_CONF_KEYS, ("NodeName", "n1"), ("NodeAddr", value))
    assert f"NodeAddr={value!r}" in str(caught.value)


@pytest.mark.parametrize("where", ["address", "hostname", "controller_address"])
@pytest.mark.parametrize("value", ["10.0.0.9\nProlog=/x", "h #", "h=1", "h x"])
def test_every_value_from_a_node_goes_through_the_writer(where, value):
    with pytest.raises(GeneratedFileError):
        if where == "controller_address":
            render_slurm(slurm_settings(), hosts(), controller_address=value)
        else:
            render_slurm(slurm_settings(), hosts(**{where: value}))
    with pytest.raises(GeneratedFileError):
        render_slurmdbd_conf(slurm_settings(), storage_host="127.0.0.1", storage_port=3306, storage_user="u",
                             storage_password="p", storage_database="d", dbd_host="h", dbd_address=value)


@pytest.mark.parametrize("text", HOSTILE_QUOTED, ids=[repr(v)[:30] for v in HOSTILE_QUOTED])
def test_a_hostile_quoted_value_is_refused(text):
    with pytest.raises(GeneratedFileError, match="Reason="):
        conf_line(SLURM_CONF_KEYS, ("Reason", Quoted(text)))


@pytest.mark.parametrize("pairs", HOSTILE_OPTIONS, ids=[repr(v)[:30] for v in HOSTILE_OPTIONS])
def test_hostile_options_are_refused(pairs):
    with pytest.raises(GeneratedFileError, match="AuthInfo="):
        conf_line(SLURM_CONF_KEYS, ("AuthInfo", Options(pairs)))


@pytest.mark.parametrize("key", ["Prolog", "PrologSlurmctld", "Epilog", "Include", "nodeaddr", "Node Addr", "A=B"])
def test_a_key_outside_the_files_set_is_refused(key):
    with pytest.raises(GeneratedFileError, match="not a key this file may hold"):
        conf_line(SLURM_CONF_KEYS, (key, "/x/evil.sh"))


@pytest.mark.parametrize("value", [True, 1.5, None, b"x", ["a"]])
def test_values_of_other_types_are_refused(value):
    with pytest.raises(GeneratedFileError):
        conf_value("CPUs", value)


@pytest.mark.parametrize("address", ["10.0.0.9", "::1", "fd00::12:34", "2001:db8::8a2e:370:7334", "gpu-node-01",
                                     "gpu-01.cluster.example.org", "localhost"])
def test_ip_addresses_and_host_names_are_written_as_they_are(address):
    rendered = render_slurm(slurm_settings(), hosts(address=address), controller_address=address)
    assert f"NodeName=n1 NodeAddr={address} NodeHostname=host-1 CPUs=4 " in rendered.slurm_conf
    assert f"SlurmctldHost=host-1({address})" in rendered.slurm_conf
    assert rendered_problem("slurm.conf", rendered.slurm_conf, SLURM_CONF_KEYS) is None


def test_the_writer_writes_pairs_as_before():
    assert conf_line(SLURM_CONF_KEYS, ("NodeName", "n1"), ("CPUs", 4), ("State", "DRAIN"),
                     ("Reason", Quoted("llmgw: not lent"))) == 'NodeName=n1 CPUs=4 State=DRAIN Reason="llmgw: not lent"'
    assert conf_line(SLURM_CONF_KEYS, ("AuthInfo", Options((("socket", "/run/m.socket"),)))) == \
        "AuthInfo=socket=/run/m.socket"


@pytest.mark.parametrize("paths", [SlurmPaths(), AGENT_PATHS], ids=["debian", "agent"])
def test_the_key_sets_are_exactly_the_renderers_keys(paths):
    """Every key the renderers write is in its file's set (the writer refuses others), and every key of a set is
    written by some rendering: the sets are the renderers' own keys, no more."""
    seen_conf, seen_gres = set(), set()
    for accounting in (True, False):
        rendered = render_slurm(slurm_settings(accounting), hosts(), paths)
        seen_conf |= keys_of(rendered.slurm_conf)
        seen_gres |= keys_of(rendered.gres_conf)
        assert rendered_problem("slurm.conf", rendered.slurm_conf, SLURM_CONF_KEYS) is None
        assert rendered_problem("gres.conf", rendered.gres_conf, GRES_CONF_KEYS) is None
    dbd = render_slurmdbd_conf(slurm_settings(), storage_host="127.0.0.1", storage_port=3306, storage_user="u",
                               storage_password="0123abcd", storage_database="d", dbd_host="h",
                               dbd_address="10.0.0.1", paths=paths)
    assert rendered_problem("slurmdbd.conf", dbd, SLURMDBD_CONF_KEYS) is None
    with_socket = paths.munge_socket != ""
    assert seen_conf == SLURM_CONF_KEYS - (set() if with_socket else {"AuthInfo", "AccountingStoragePass"})
    assert seen_gres == GRES_CONF_KEYS
    assert keys_of(dbd) == SLURMDBD_CONF_KEYS - (set() if with_socket else {"AuthInfo"})
