"""A control plane listening on a wildcard address (`llmgw server init`'s default `--listen 0.0.0.0`) names this
machine's host name and non-loopback addresses in its server certificates, so agents and admin clients dialling the
machine's address pass the hostname check without `--tls-hostname` (llmgw.control.tls_names). The cross-host case
(an agent on another host dialling a control plane set up by `server init` with its defaults) is
tests/install/test_server_add.py."""

from __future__ import annotations

import socket
import ssl

import trio
from cryptography import x509

from llmgw.control import ControlConfig, ControlPlane
from llmgw.control.tls_names import certificate_names, ipv4_local_addresses, ipv6_addresses, machine_names
from llmgw.settings.model import Listener

FIB_TRIE = """Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 127.0.0.0/8 2 0 2
        +-- 127.0.0.0/31 1 0 0
           |-- 127.0.0.0
              /8 host LOCAL
           |-- 127.0.0.1
              /32 host LOCAL
        |-- 127.255.255.255
           /32 link BROADCAST
     +-- 192.0.2.0/24 2 0 2
        +-- 192.0.2.0/30 2 0 2
           |-- 192.0.2.0
              /24 link UNICAST
           |-- 192.0.2.2
              /32 host LOCAL
        |-- 192.0.2.255
           /32 link BROADCAST
Local:
  +-- 0.0.0.0/0 3 0 5
           |-- 192.0.2.2
              /32 host LOCAL
           |-- 10.1.2.3
              /32 host LOCAL
"""
"""/proc/net/fib_trie of this machine (192.0.2.2 on eth0), with a second address added to its Local table."""

IF_INET6 = """fe8000000000000000fc00fffe000001 04 40 20 80     eth0
fd000000000000000000000000000002 04 40 00 82     eth0
00000000000000000000000000000001 01 80 10 80       lo
"""


def test_the_proc_files_give_the_non_loopback_addresses_once_in_order() -> None:
    assert ipv4_local_addresses(FIB_TRIE) == ["192.0.2.2", "10.1.2.3"]
    assert ipv6_addresses(IF_INET6) == ["fd00::2"]  # link-local and loopback left out
    assert ipv4_local_addresses("") == [] and ipv6_addresses("garbage\n") == []


def test_a_wildcard_listener_names_the_machine_and_one_address_names_itself() -> None:
    machine = ("cp1", ["192.0.2.2", "fd00::2"])
    assert certificate_names("0.0.0.0", machine) == ("cp1", "192.0.2.2", "fd00::2", "localhost", "127.0.0.1")
    assert certificate_names("::", machine) == certificate_names("", machine) == certificate_names("0.0.0.0", machine)
    assert certificate_names("10.0.0.7", machine) == ("10.0.0.7", "localhost", "127.0.0.1")
    assert certificate_names("[fd00::9]", machine) == ("fd00::9", "localhost", "127.0.0.1")
    assert certificate_names("127.0.0.1", machine) == ("127.0.0.1", "localhost")


def _sans(pem: bytes) -> set[str]:
    extension = x509.load_pem_x509_certificate(pem).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    return {str(name) for name in extension.value.get_values_for_type(x509.IPAddress)} | set(
        extension.value.get_values_for_type(x509.DNSName))


async def test_a_real_control_plane_on_0_0_0_0_passes_the_hostname_check_at_the_machines_address(
        tmp_path, settings_repo) -> None:
    hostname, addresses = machine_names()
    assert addresses, "this machine has no non-loopback address to dial"
    state = tmp_path / "state"
    plane = ControlPlane(ControlConfig(
        repo=str(settings_repo), state_dir=state, gateway=False, tls=True, admin_tls=True,
        agents_listener=Listener(host="0.0.0.0", port=0), admin_listener=Listener(host="0.0.0.0", port=0)))
    async with trio.open_nursery() as nursery:
        await nursery.start(plane.run)
        admin_pem = (state / "admin-tls" / "cert.pem").read_bytes()
        assert {hostname, *addresses, "localhost", "127.0.0.1"} <= _sans(admin_pem)
        assert "0.0.0.0" not in _sans(admin_pem)

        def handshake() -> dict:
            context = ssl.create_default_context(cafile=str(state / "ca" / "ca.crt"))
            context.set_alpn_protocols(["h2"])
            with socket.create_connection((addresses[0], plane.endpoints.agents_port), timeout=10) as raw, \
                    context.wrap_socket(raw, server_hostname=addresses[0]) as tls:
                return tls.getpeercert()  # raises SSLCertVerificationError when the address is not named

        peer = await trio.to_thread.run_sync(handshake)
        assert ("IP Address", addresses[0]) in peer["subjectAltName"]
        nursery.cancel_scope.cancel()
