"""`llmgw node doctor`: discovery plus checks of what a node needs to serve (NVML and driver, AVX2, engines,
weights directory space, clock, certificates, GPU health as the agent reads it: `llmgw.agent.doctor_health`), as data (`DoctorReport`) with JSON and a readable rendering.

Each check has a status (`CheckStatus`): ok, info (a fact, e.g. "a CPU node"), warn (works, but worse or soon
broken) or fail (this node cannot do its job until fixed). Blocking (runs discovery and a few tools).
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmgw.agent.config import AgentConfig, installed_engines, load_engine_binaries, load_offline_record
from llmgw.agent.discovery import NodeDiscovery, discover_node, load_nvml, run_tool
from llmgw.agent.discovery.node import Runner
from llmgw.agent.doctor_health import FAIL, INFO, OK, WARN, CheckStatus, health_checks
from llmgw.agent.health import HealthReader
from llmgw.errors import UsageError
from llmgw.tools.node_report import NodeHealthReport

LOW_DISK_BYTES = 20 * 1024**3       # below this, one 8B model's weights may not fit
CERT_WARN_DAYS = 30
CA_WARN_DAYS = 180  # the CA that signed the node certificate (ca.crt beside it): warned about six months ahead
_EARLIEST_SANE = datetime.datetime(2025, 1, 1, tzinfo=datetime.timezone.utc)
_LOAD = object()


@dataclass(frozen=True)
class Check:
    """One check: `name` ("nvml", "cpu", ...), `status` ok/info/warn/fail, `detail` a sentence for a person."""

    name: str
    status: CheckStatus
    detail: str

    def to_json(self) -> dict:
        """{"name", "status" (its value: "ok", "info", "warn" or "fail"), "detail"}."""
        return {"name": self.name, "status": CheckStatus(self.status).value, "detail": self.detail}


@dataclass(frozen=True)
class DoctorReport:
    """The checks in order and the discovery they were made from. `ok` is False when any check failed."""

    checks: tuple[Check, ...]
    discovery: NodeDiscovery
    health: NodeHealthReport | None = None

    @property
    def ok(self) -> bool:
        return all(c.status is not FAIL for c in self.checks)

    def to_json(self) -> dict:
        """Plain JSON types: {"ok", "checks": [{name, status, detail}], "node": NodeDiscovery.to_json(), "health":
        NodeHealthReport.to_json() (null when not read)}."""
        return {"ok": self.ok, "checks": [c.to_json() for c in self.checks], "node": self.discovery.to_json(),
                "health": self.health.to_json() if self.health is not None else None}

    def render(self) -> str:
        """One line per check ("warn  cpu        this CPU has no AVX2 ..."), then a verdict line."""
        width = max((len(c.name) for c in self.checks), default=4)
        lines = [f"{c.status.value:<5} {c.name:<{width}}  {c.detail}" for c in self.checks]
        failed = sum(c.status is FAIL for c in self.checks)
        warned = sum(c.status is WARN for c in self.checks)
        lines.append("node doctor: " + ("ready" if not failed else f"{failed} check(s) failed")
                     + (f", {warned} warning(s)" if warned else ""))
        return "\n".join(lines)


def _gib(size: int) -> str:
    return f"{size / 1024**3:.1f} GiB"


def gpu_checks(node: NodeDiscovery) -> list[Check]:
    """One check per device of `node.gpus` (placeable or why not, class, memory), after the GPU source's."""
    report = node.gpus
    if report.source == "none":
        why = "; ".join(report.notes) or "no NVIDIA driver"
        return [Check("nvml", INFO, f"a CPU node: no NVIDIA GPU found ({why})")]
    checks = []
    if report.source == "nvml":
        checks.append(Check("nvml", OK, f"NVML loaded, driver {report.driver_version or '?'}, CUDA "
                                        f"{report.cuda_version or '?'}, {len(report.gpus)} device(s)"))
    else:
        checks.append(Check("nvml", WARN, f"NVML could not be loaded ({'; '.join(report.notes)}); GPUs read from "
                                          f"nvidia-smi, driver {report.driver_version or '?'}: install nvidia-ml-py "
                                          "or fix the driver's library path for live telemetry"))
    for gpu in report.gpus:
        label = f"GPU {gpu.index}" + (f" MIG {gpu.mig_profile or '?'} {gpu.device_id}" if gpu.is_mig_instance else "")
        facts = f"{gpu.name or 'unnamed'}, class {gpu.gpu_class or 'unknown'}"
        if gpu.memory_total_bytes is not None:
            facts += f", {_gib(gpu.memory_total_bytes)}"
        if not gpu.is_mig_instance and gpu.pcie_gen_max is not None:
            width = f" x{gpu.pcie_width_current}" if gpu.pcie_width_current is not None else ""
            facts += f", PCIe gen {gpu.pcie_gen_max}{width}" + (f" of x{gpu.pcie_width_max}"
                                                                 if gpu.pcie_width_max is not None else "")
        if not gpu.is_mig_instance and gpu.ecc_enabled is not None:
            facts += f", ECC {'on' if gpu.ecc_enabled else 'off'}"
        if gpu.placeable:
            checks.append(Check("gpu", OK, f"{label}: {facts}, placeable"))
        elif gpu.mig_enabled and not gpu.is_mig_instance:
            checks.append(Check("gpu", INFO, f"{label}: {facts}, MIG enabled: shards go on its instances"))
        elif gpu.foreign_pids:
            pids = ", ".join(str(p) for p in gpu.foreign_pids)
            checks.append(Check("gpu", WARN, f"{label}: {facts}, used by processes llmgw did not start "
                                             f"(pid {pids}): not placeable until they end"))
        else:
            checks.append(Check("gpu", WARN, f"{label}: {facts}: not placeable (class or memory unknown)"))
        if gpu.pcie_gen_current is not None and gpu.pcie_gen_max and gpu.pcie_gen_current < gpu.pcie_gen_max:
            checks.append(Check("gpu", INFO, f"{label}: PCIe link at gen {gpu.pcie_gen_current} of "
                                             f"{gpu.pcie_gen_max} now (cards lower it when idle)"))
    return checks


def _cpu_checks(node: NodeDiscovery) -> list[Check]:
    inv = node.inventory
    cpu = inv.cpu
    flags = " ".join(cpu.flags) or "none known"
    checks = [Check("cpu", OK, f"{cpu.cores} logical CPUs, {cpu.model or 'model unknown'} ({inv.arch}); "
                               f"vector extensions: {flags}")]
    checks.extend(Check("cpu", WARN, w) for w in inv.warnings)
    checks.append(Check("memory", OK if inv.memory_total_bytes else WARN,
                        f"{_gib(inv.memory_total_bytes)} total" if inv.memory_total_bytes
                        else "total memory could not be read from /proc/meminfo"))
    return checks


def _disk_check(weights_dir: Path, free: int | None, min_free: int | None = None) -> Check:
    if free is None:
        return Check("weights", WARN, f"free space under {weights_dir} cannot be measured")
    if min_free is not None and free < min_free:
        return Check("weights", FAIL, f"only {_gib(free)} free under {weights_dir}, less than the {_gib(min_free)} "
                                      "asked for (--min-free): free space or point weights_dir at a larger disk")
    if free < LOW_DISK_BYTES:
        return Check("weights", WARN, f"only {_gib(free)} free under {weights_dir}: free space or point "
                                      "weights_dir at a larger disk")
    return Check("weights", OK, f"{_gib(free)} free under {weights_dir}")


def _engine_checks(engines_dir: Path | None, state_dir: Path | None) -> list[Check]:
    """The engines the agent of `state_dir` can run: installs under the engines directory, plus the binaries it
    was last started with (`engine-binaries.json`: `llmgw up`'s cached llama-server, `--engine-binary`), each a
    warning when it is no longer an executable file."""
    config = AgentConfig(**{k: v for k, v in (("engines_dir", engines_dir), ("state_dir", state_dir)) if v})
    checks: list[Check] = []
    given: dict[str, Path] = {}
    try:
        given = load_engine_binaries(config.state_dir)
    except UsageError as exc:
        checks.append(Check("engines", WARN, str(exc)))
    for key, binary in sorted(given.items()):
        if binary.is_file() and os.access(binary, os.X_OK):
            checks.append(Check("engines", OK, f"{key}: {binary} (the binary the agent was last started with: "
                                               "`llmgw up`'s engine or `--engine-binary`)"))
        else:
            checks.append(Check("engines", WARN, f"{key}: {binary}, which the agent was last started with, is "
                                                 "missing or not executable: build it again (`make engine` for "
                                                 "`llmgw up`) or start the agent with another --engine-binary"))
    installed = [key for key in installed_engines(config) if key not in given]
    if installed:
        checks.append(Check("engines", OK, "installed: " + ", ".join(installed)))
    elif not given:
        checks.append(Check("engines", INFO, f"no engine installed under {config.engines_path} yet; the agent "
                                             "installs llama.cpp when a model placed here needs it"))
    return checks


def offline_checks(state_dir: Path | None) -> list[Check]:
    """"offline" when the agent of `state_dir` was last started to install from its mirrors only (`llmgw agent
    --offline`, `offline-mirror.json`): which mirrors and which imported bundle each holds (`llmgw bundle import`),
    failed when a mirror is gone. None for a node that may use the network. Blocking (small reads)."""
    from llmgw.release import imported_bundle

    mirrors = load_offline_record(Path(state_dir) if state_dir else AgentConfig().state_dir)
    if mirrors is None:
        return []
    if not mirrors:
        return [Check("offline", FAIL, "offline-mirror-only, but no mirror is configured: nothing can be installed; "
                                       "start the agent with --mirror DIR (the directory `llmgw bundle import` made)")]
    checks = []
    for mirror in mirrors:
        if not mirror.is_dir():
            checks.append(Check("offline", FAIL, f"offline-mirror-only, but the mirror {mirror} is missing: import "
                                                 "the bundle again (`llmgw bundle import BUNDLE " f"{mirror}`)"))
            continue
        bundle = imported_bundle(mirror)
        held = (f"bundle llmgw {bundle.version} created {bundle.created}, {len(bundle.files)} files"
                if bundle is not None else "not an imported bundle")
        checks.append(Check("offline", INFO, f"offline-mirror-only: engines, weights and releases are installed from "
                                             f"{mirror} only ({held}); nothing is downloaded"))
    return checks


def _clock_check(now: float, run: Runner) -> Check:
    moment = datetime.datetime.fromtimestamp(now, tz=datetime.timezone.utc)
    if moment < _EARLIEST_SANE:
        return Check("clock", FAIL, f"the clock reads {moment:%Y-%m-%d %H:%M} UTC, before this release: "
                                    "certificates will not verify; set the time (NTP)")
    out = run(["timedatectl", "show", "-p", "NTPSynchronized", "--value"])
    synced = out.text.strip().lower() if out is not None and out.exit_code == 0 else ""
    if synced == "no":
        return Check("clock", WARN, f"{moment:%Y-%m-%d %H:%M:%S} UTC, not synchronised by NTP: "
                                    "certificate checks and audit times may be off")
    state = "NTP synchronised" if synced == "yes" else "NTP state unknown (no timedatectl)"
    return Check("clock", OK, f"{moment:%Y-%m-%d %H:%M:%S} UTC, {state}")


def _certificate_check(path: Path, now: float, name: str = "certificate", warn_days: int = CERT_WARN_DAYS,
                       soon: str = "the agent renews it over its stream before this (agents/ "
                                   "certificate_renew_fraction): check the agent's log for why it did not",
                       issuer_of: Path | None = None) -> Check:
    """`path`'s certificate checked for its dates at `now`. A file of several CAs (during `llmgw ca rotate`): the
    one that signed the certificate `issuer_of` is checked (the first when none did)."""
    from cryptography import x509

    try:
        data = path.read_bytes()
        found = x509.load_pem_x509_certificates(data)
    except OSError as exc:
        return Check(name, FAIL, f"{path} cannot be read ({exc.strerror}): run `llmgw node join`")
    except ValueError as exc:
        return Check(name, FAIL, f"{path} is not a PEM certificate ({exc})")
    certificate = found[0]
    if len(found) > 1 and issuer_of is not None:
        from cryptography.hazmat.primitives.serialization import Encoding

        from llmgw.wire.tls import signed_by_any

        try:
            signed = issuer_of.read_bytes()
        except OSError:
            signed = b""
        certificate = next((ca for ca in found if signed_by_any(signed, ca.public_bytes(Encoding.PEM))), certificate)
    moment = datetime.datetime.fromtimestamp(now, tz=datetime.timezone.utc)
    start, end = certificate.not_valid_before_utc, certificate.not_valid_after_utc
    subject = certificate.subject.rfc4514_string()
    if len(found) > 1:
        subject += f", the CA of {issuer_of.name if issuer_of else 'it'} among {len(found)} (a CA rotation)"
    if moment < start:
        return Check(name, FAIL, f"{path} ({subject}) is valid only from {start:%Y-%m-%d %H:%M} UTC: "
                                 "check this node's clock")
    if moment > end:
        return Check(name, FAIL, f"{path} ({subject}) expired {end:%Y-%m-%d}: run `llmgw node join` "
                                 "with a new token")
    if end - moment < datetime.timedelta(days=warn_days):
        return Check(name, WARN, f"{path} ({subject}) expires {end:%Y-%m-%d}, in {(end - moment).days} days: {soon}")
    return Check(name, OK, f"{path} ({subject}) valid until {end:%Y-%m-%d}")


def release_checks(prefix: Path | None = None) -> list[Check]:
    """The "release" check of a venv `llmgw node add` installed (`prefix`, default this one): which key signed
    the release it runs; none for an llmgw installed otherwise. Blocking (three small reads)."""
    from llmgw import __version__
    from llmgw.errors import ReleaseError
    from llmgw.release import installed_release

    try:
        release = installed_release(prefix)
    except ReleaseError as exc:
        return [Check("release", FAIL, f"{exc}: this is not the release that was installed; install it again")]
    if release is None:
        return []
    if release.version != __version__:
        return [Check("release", FAIL, f"the release record says llmgw {release.version}, this is {__version__}: "
                                       "install the release again")]
    return [Check("release", OK, f"llmgw {release.version}, from a release signed by key {release.key_id}")]


def run_doctor(weights_dir: Path, *, engines_dir: Path | None = None, state_dir: Path | None = None,
               cert_path: Path | None = None, our_pids: Collection[int] = (), nvml: Any = _LOAD,
               run: Runner = run_tool, now: float | None = None, min_free_bytes: int | None = None,
               **discover_args: Any) -> DoctorReport:
    """Discover this node and check it. Blocking. Never raises for a missing driver or tool: those are checks.

    `weights_dir` is where free space is measured; `engines_dir`/`state_dir` locate installed engines (defaults
    as `AgentConfig`); `cert_path` the node certificate to check (skipped when None); `nvml` and `run` as in
    `discover_node` (tests inject captures); `now` unix seconds (default: the clock); `min_free_bytes`: less free
    space than that under `weights_dir` fails (`llmgw node add --min-disk`; else too little is a warning). A venv
    installed by `llmgw node add` adds the check "release": which key signed the release it runs
    (`llmgw.release.installed_release`; a record that does not check fails). An agent started `--offline` adds
    "offline": the mirrors it installs from only (`offline_checks`).
    """
    now = time.time() if now is None else now
    kwargs = dict(discover_args)
    if nvml is not _LOAD:
        kwargs["nvml"] = nvml
    node = discover_node(Path(weights_dir), our_pids, run=run, **kwargs)
    checks = [*gpu_checks(node), *_cpu_checks(node),
              _disk_check(Path(weights_dir), node.inventory.disk_free_bytes, min_free_bytes),
              *_engine_checks(engines_dir, state_dir), *offline_checks(state_dir), _clock_check(now, run),
              *release_checks()]
    if cert_path is not None:
        checks.append(_certificate_check(Path(cert_path), now))
        if (Path(cert_path).parent / "ca.crt").is_file():  # the CA beside it (llmgw node join writes both)
            checks.append(_certificate_check(
                Path(cert_path).parent / "ca.crt", now, name="CA", warn_days=CA_WARN_DAYS, issuer_of=Path(cert_path),
                soon="every node certificate it signed stops working with it; run `llmgw ca rotate` on the control "
                     "plane before then (agents move onto a new CA over their streams; else every node must join "
                     "again)"))
    health = HealthReader(run, nvml=kwargs["nvml"] if "nvml" in kwargs else load_nvml(),
                          **{k: v for k, v in kwargs.items() if k in ("sys_root", "etc_root")}).read()
    checks.extend(node_checks(node, health))
    return DoctorReport(tuple(checks), node, health)


def node_checks(node: NodeDiscovery, health: NodeHealthReport) -> list[Check]:
    """The checks of what discovery and the health reading concluded, in the order `render` prints them: the
    fabrics, every health finding (`llmgw.agent.doctor_health`), then discovery's warnings. No I/O."""
    ib = node.fabrics.infiniband
    checks = [Check("fabrics", INFO, (f"InfiniBand: {', '.join(f'{p.ca}/{p.port} {p.state}' for p in ib)}"
                                      if ib else "no InfiniBand") + ("; IMEX configured" if node.fabrics.imex
                                                                    else "; no IMEX"))]
    checks.extend(Check(*check) for check in health_checks(health))
    topo_warnings = node.topology.warnings if node.topology else ()
    checks.extend(Check("discovery", WARN, w) for w in (*node.gpus.warnings, *topo_warnings))
    return checks
