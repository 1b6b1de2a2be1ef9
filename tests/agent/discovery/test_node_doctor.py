"""`llmgw node doctor`: checks on this CPU machine through the real command, and on the H200 through its captures."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time

import pynvml
from cryptography import x509

from captures import capture
from fake_nvml import FakeNvml, load_readings
from llmgw.agent.discovery import ToolOutput
from llmgw.agent.doctor import run_doctor
from support.llmgw_processes import LlmgwProcesses
from support.waiting import wait_for

NOW = datetime.datetime(2026, 11, 30, tzinfo=datetime.timezone.utc).timestamp()


def no_tools(argv):
    return None


def statuses(report, name):
    return [c.status for c in report.checks if c.name == name]


def test_the_command_on_this_machine_reports_a_cpu_node_and_its_memory_bandwidth_and_exits_0(tmp_path):
    done = subprocess.run([sys.executable, "-m", "llmgw.cli", "node", "doctor", "--json", "--bandwidth",
                           "--weights-dir", str(tmp_path), "--state-dir", str(tmp_path / "state")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    bandwidth = report["memory_bandwidth"]  # the probe: bounded, gigabytes per second on any machine of today
    assert bandwidth["seconds"] < 5 and bandwidth["one_core_bytes_per_second"] > 0.5e9
    assert bandwidth["threads"] >= 1 and 1 < bandwidth["gigabyte_model_tokens_per_second"] < 200
    assert report["ok"] and report["node"]["cpu_node"] is True
    assert report["node"]["cpu"]["cores"] >= 1 and report["node"]["memory_total_bytes"] > 0
    assert {c["name"] for c in report["checks"]} >= {"nvml", "cpu", "memory", "weights", "engines", "clock"}
    assert "a CPU node" in report["checks"][0]["detail"]


def test_h200_through_nvml_is_ready_and_a_foreign_process_is_named(tmp_path):
    report = run_doctor(tmp_path, state_dir=tmp_path, nvml=FakeNvml.h200(), run=no_tools, now=NOW)
    assert report.ok and statuses(report, "nvml") == ["ok"] and statuses(report, "gpu") == ["ok"]
    assert "h200-141g" in report.render()
    busy = run_doctor(tmp_path, state_dir=tmp_path, nvml=FakeNvml.h200(processes=load_readings()["processes"]),
                      run=no_tools, now=NOW)
    assert busy.ok and statuses(busy, "gpu") == ["warn"] and "pid 522" in busy.render()


def test_nvidia_smi_fallback_is_a_warning_to_fix_nvml(tmp_path):
    def run(argv):
        name = {("nvidia-smi", "-q", "-x"): "nvidia-smi-q-x.xml", ("nvidia-smi", "-L"): "nvidia-smi-L.txt",
                ("nvidia-smi", "topo", "-m"): "nvidia-smi-topo-m.txt"}.get(tuple(argv))
        return ToolOutput(tuple(argv), 0, capture(name)) if name else None

    report = run_doctor(tmp_path, state_dir=tmp_path, run=run, now=NOW,
                        nvml=FakeNvml([], init_error=pynvml.NVMLError_LibraryNotFound()))
    assert statuses(report, "nvml") == ["warn"] and statuses(report, "gpu") == ["ok"] and report.ok


def test_a_clock_before_the_release_fails(tmp_path):
    report = run_doctor(tmp_path, state_dir=tmp_path, nvml=None, run=no_tools, now=0.0)
    assert not report.ok and statuses(report, "clock") == ["fail"]


def test_certificates_are_checked_for_dates(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "node-1")])
    start = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                   .serial_number(1).not_valid_before(start).not_valid_after(start + datetime.timedelta(days=340))
                   .sign(key, hashes.SHA256()))
    path = tmp_path / "node.crt"
    path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))

    def check(now, cert=path):
        report = run_doctor(tmp_path, state_dir=tmp_path, nvml=None, run=no_tools, now=now, cert_path=cert)
        (found,) = [c for c in report.checks if c.name == "certificate"]
        return found

    assert check(datetime.datetime(2026, 6, 1, tzinfo=datetime.timezone.utc).timestamp()).status == "ok"
    assert check(NOW).status == "warn"                                       # expires 2026-12-07
    assert check(datetime.datetime(2027, 1, 1, tzinfo=datetime.timezone.utc).timestamp()).status == "fail"
    assert "llmgw node join" in check(NOW, tmp_path / "missing.crt").detail
    (tmp_path / "junk.crt").write_text("not a certificate")
    assert check(NOW, tmp_path / "junk.crt").status == "fail"

    (tmp_path / "ca.crt").write_bytes(path.read_bytes())  # the CA beside the node certificate: warned 180 days ahead

    def ca_check(now):
        report = run_doctor(tmp_path, state_dir=tmp_path, nvml=None, run=no_tools, now=now, cert_path=path)
        (found,) = [c for c in report.checks if c.name == "CA"]
        return found

    assert ca_check(datetime.datetime(2026, 6, 1, tzinfo=datetime.timezone.utc).timestamp()).status == "ok"
    late = ca_check(datetime.datetime(2026, 7, 1, tzinfo=datetime.timezone.utc).timestamp())
    assert late.status == "warn" and "in 159 days" in late.detail and "join again" in late.detail
    assert "llmgw ca rotate" in late.detail


def test_during_a_ca_rotation_doctor_checks_the_ca_that_signed_the_node_certificate(tmp_path):
    from llmgw.wire import CertificateAuthority
    from llmgw.wire.tls import make_key_and_csr

    ca = CertificateAuthority.load_or_create(tmp_path / "ca")
    old = ca.certificate_pem
    ca.rotate()  # ca.crt on the node: both CAs, the old one first
    (tmp_path / "ca.crt").write_bytes(ca.certificate_pem)
    path = tmp_path / "node.crt"

    def ca_detail() -> str:
        report = run_doctor(tmp_path, state_dir=tmp_path, nvml=None, run=no_tools, now=time.time(),
                            cert_path=path)
        (found,) = [c for c in report.checks if c.name == "CA"]
        assert found.status == "ok"
        return found.detail

    for signer in (old, ca.signing_certificate_pem):
        if signer is old:
            (tmp_path / "old").mkdir()
            (tmp_path / "old" / "ca.key").write_bytes((tmp_path / "ca" / "ca.key").read_bytes())
            (tmp_path / "old" / "ca.crt").write_bytes(old)
            path.write_bytes(CertificateAuthority.load_or_create(tmp_path / "old").sign_csr(
                make_key_and_csr("n1")[1], "n1"))
        else:
            path.write_bytes(ca.sign_csr(make_key_and_csr("n1")[1], "n1", replace=True))
        name = x509.load_pem_x509_certificate(signer).subject.rfc4514_string()
        assert name in ca_detail() and "among 2 (a CA rotation)" in ca_detail()


def test_h200_health_findings_are_checks_and_an_xid_79_fails_the_card(tmp_path):
    xid = ("2026-11-24T12:00:09+00:00 h200 kernel: NVRM: Xid (PCI:0000:00:06): 79, pid='<unknown>', "
           "name=<unknown>, GPU has fallen off the bus.")

    def run(argv):
        if argv[:3] == ["nvidia-smi", "-q", "-x"]:
            return ToolOutput(tuple(argv), 0, capture("nvidia-smi-q-x.xml"))
        if argv[0] == "journalctl":
            return ToolOutput(tuple(argv), 0, xid + "\n-- cursor: s=1")
        return None

    healthy = run_doctor(tmp_path, state_dir=tmp_path, nvml=FakeNvml.h200(), run=lambda argv: (
        ToolOutput(tuple(argv), 0, capture("nvidia-smi-q-x.xml")) if argv[0] == "nvidia-smi" else None),
        now=NOW, sys_root=tmp_path, etc_root=tmp_path)
    assert statuses(healthy, "health") == ["ok", "info"]  # the card, then "kernel log not read"
    assert "no multi-node NVLink domain" in healthy.render()
    report = run_doctor(tmp_path, state_dir=tmp_path, nvml=FakeNvml.h200(), run=run, now=NOW,
                        sys_root=tmp_path, etc_root=tmp_path)
    assert not report.ok and statuses(report, "health") == ["fail"]
    assert "GPU 0 (00000000:00:06.0): Xid 79" in report.render() and "out of placement" in report.render()
    doc = report.to_json()["health"]
    assert doc["cards"][0]["placeable"] is False and doc["level"] == "fail"


def test_without_a_state_dir_the_doctor_checks_llmgw_ups_agent_directory_and_says_so(tmp_path):
    # after `make up` in a checkout, `llmgw node doctor` there looks at what `llmgw up` made: ./.state/agent
    (tmp_path / ".state" / "agent" / "weights").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k != "LLMGW_STATE"}
    done = subprocess.run([sys.executable, "-m", "llmgw.cli", "node", "doctor"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"agent state {tmp_path / '.state' / 'agent'}\n" in done.stdout
    assert f"weights     {tmp_path / '.state' / 'agent' / 'weights'}\n" in done.stdout


def test_the_engine_the_agent_was_started_with_is_reported_and_a_vanished_one_warned_about(tmp_path):
    # `llmgw up` gives its agent the cached llama-server (as `llmgw agent --engine-binary` does), outside the
    # agent's engines directory: the doctor said "no engine installed" right after `make up`
    binary = tmp_path / "cache" / "engines" / "llama.cpp" / "b11434" / "bin" / "llama-server"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\necho 'version: 11434'\n")
    binary.chmod(0o755)
    state = tmp_path / "state"
    procs = LlmgwProcesses(tmp_path)
    try:  # no control plane answers on port 1: the agent keeps trying, which is all this test needs
        procs.spawn("agent", "agent", "--control-plane", "127.0.0.1:1", "--node-id", "n1", "--state-dir",
                    str(state), "--insecure", "--engine-binary", f"llama.cpp@b11434={binary}")
        wait_for(lambda: (state / "engine-binaries.json").is_file(), 60, "the agent to start",
                 lambda: (tmp_path / "agent.log").read_text())
    finally:
        procs.stop()

    def engines():
        done = subprocess.run([sys.executable, "-m", "llmgw.cli", "node", "doctor", "--json", "--weights-dir",
                               str(tmp_path), "--state-dir", str(state)], capture_output=True, text=True, timeout=120)
        return [(c["status"], c["detail"]) for c in json.loads(done.stdout)["checks"] if c["name"] == "engines"]

    (found,) = engines()
    assert found[0] == "ok" and found[1].startswith(f"llama.cpp@b11434: {binary} ")
    binary.unlink()
    (found,) = engines()
    assert found[0] == "warn" and f"llama.cpp@b11434: {binary}, which the agent was last started with" in found[1]


def test_bandwidth_is_refused_with_captures_of_another_machine(tmp_path):
    from click.testing import CliRunner

    from llmgw.cli.main import cli

    done = CliRunner().invoke(cli, ["node", "doctor", "--bandwidth", "--from", str(tmp_path)])
    assert done.exit_code == 1 and "--bandwidth measures this machine, --from reads captures" in str(done.exception)
