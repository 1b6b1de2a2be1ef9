"""Renewing the node certificate over the agent's stream, before it expires.

Node certificates last 825 days (`llmgw.wire.tls.NODE_DAYS`); without renewal a fleet stops on the day they end.
Once a share `fraction` of the certificate's lifetime has passed (agents/ `certificate_renew_fraction`, default two
thirds: `renewal_time`, pure), the agent makes a new key and a CSR, sends RenewCertificate on one of its streams
(the key never leaves the node), and the control plane answers CertificateRenewed with a certificate its CA signed.
The agent checks it (its node id, its key, the CA: `llmgw.wire.check_renewed`), writes the pair so that a crash
leaves a matching one (`llmgw.wire.install_renewed`) and uses it from its next connection on: the open streams keep
the certificate they were opened with. A request not answered within `RETRY_SECONDS` (a control plane without TLS,
one that is down, one that refused and said why) is made again with a new key.

A CA rotation (`llmgw ca rotate`) reaches the agent as TrustCertificates: the trust bundle replaces `ca.crt`, and a
certificate not signed by the CA that signs now is renewed at once (`trust`), not at its renewal point. A bundle
without the CA of the node's own certificate is not taken: it comes from a control plane that has not seen the
rotation (several control planes, docs/ha.md), and taking it would undo the move.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import trio

from llmgw.errors import WireError
from llmgw.wire import agent_message, certificate_validity, check_renewed, install_renewed, pb, signed_by_any
from llmgw.wire.tls import make_key_and_csr, write_file

log = logging.getLogger("llmgw.agent")

RETRY_SECONDS = 600.0
"""Seconds before an unanswered renewal request is made again (with a new key)."""
RECHECK_SECONDS = 3600.0
"""The longest sleep before the certificate and the fraction are read again (a renewal on another stream, new
AgentSettings)."""
DEFAULT_FRACTION = 0.6667


def renewal_time(not_before: float, not_after: float, fraction: float) -> float:
    """When a certificate valid from `not_before` to `not_after` (unix seconds) is renewed: after `fraction` of its
    lifetime (a fraction outside (0, 1), or NaN, counts as `DEFAULT_FRACTION`). Pure."""
    if not 0.0 < fraction < 1.0:
        fraction = DEFAULT_FRACTION
    return not_before + fraction * (not_after - not_before)


def renewal_delay(not_before: float, not_after: float, fraction: float, now: float) -> float:
    """Seconds from `now` until the renewal (0: due now or overdue). Pure."""
    return max(0.0, renewal_time(not_before, not_after, fraction) - now)


class CertificateRenewer:
    """Renews the certificate in `tls_dir` (`node.crt`, `node.key`, `ca.crt`) of node `node_id`. `fraction()` is
    the share of the lifetime after which to renew, read at each decision; `secret()` the node secret sent with the
    request; `wall()` the clock (unix seconds; tests pass one that follows trio's MockClock). `renewed` counts the
    certificates installed."""

    def __init__(self, tls_dir: Path, node_id: str, fraction: Callable[[], float], secret: Callable[[], str],
                 wall: Callable[[], float] = time.time):
        self.tls_dir = Path(tls_dir)
        self.node_id = node_id
        self.fraction = fraction
        self.secret = secret
        self.wall = wall
        self.renewed = 0
        self._pending: tuple[bytes, float] | None = None  # (the key asked with, when asked), one for every stream
        self._answered = trio.Event()
        self.signing_ca: bytes | None = None  # the CA that signs now, as the control plane said (TrustCertificates)
        self._wake = trio.Event()  # set when a rotation makes the certificate due at once

    def due_in(self) -> float:
        """Seconds until the certificate on disk is due for renewal (0: now). Blocking (reads node.crt). Raises
        WireError when it cannot be read."""
        try:
            pem = (self.tls_dir / "node.crt").read_bytes()
        except OSError as exc:
            raise WireError(f"{self.tls_dir / 'node.crt'} cannot be read ({exc}); its renewal waits.") from exc
        if self.signing_ca is not None and not signed_by_any(pem, self.signing_ca):
            return 0.0  # signed by a CA being retired: renewed under the new one now
        start, end = certificate_validity(pem)
        return renewal_delay(start, end, self.fraction(), self.wall())

    def trust(self, message: pb.TrustCertificates) -> None:
        """TrustCertificates: `ca_pem` replaces `ca.crt` (when it parses and differs), and a certificate not signed
        by `signing_ca_pem` becomes due at once. Blocking (writes one file). Never raises (logged)."""
        bundle, signing = bytes(message.ca_pem), bytes(message.signing_ca_pem)
        try:
            certificate_validity(signing)
            if not bundle or not signed_by_any(signing, bundle):
                raise WireError("the CA that signs is not in the trust bundle")
            if not signed_by_any((self.tls_dir / "node.crt").read_bytes(), bundle):
                raise WireError("the trust bundle does not hold the CA of this node's certificate (a control plane "
                                "that has not seen a CA rotation yet, or one this node missed: then join again)")
            if (self.tls_dir / "ca.crt").read_bytes() != bundle:
                write_file(self.tls_dir / "ca.crt", bundle)
                log.info("the control plane's trusted CAs changed; %s rewritten", self.tls_dir / "ca.crt")
        except (WireError, OSError) as exc:
            log.warning("the control plane's trusted CAs were not taken: %s", exc)
            return
        self.signing_ca = signing
        try:
            if self.due_in() == 0:
                self._wake.set()
        except WireError as exc:
            log.warning("%s", exc)

    async def run(self, send: Callable[[pb.AgentMessage], object]) -> None:
        """For one stream, until cancelled: sleep until the certificate is due, then ask for a new one with `send`
        (the stream's outbox) unless a request made on any stream is still waiting for its answer, and wait for the
        answer (at most `RETRY_SECONDS`). A checkpoint; never raises for a certificate it cannot read (logged)."""
        while True:
            try:
                delay = self.due_in()
            except WireError as exc:
                log.warning("%s", exc)
                delay = RECHECK_SECONDS
            if delay > 0:
                with trio.move_on_after(min(delay, RECHECK_SECONDS)):
                    await self._wake.wait()
                if self._wake.is_set():
                    self._wake = trio.Event()
                continue
            if self._pending is None or self.wall() - self._pending[1] >= RETRY_SECONDS:
                key, csr = make_key_and_csr(self.node_id)
                self._pending = (key, self.wall())
                self._answered = trio.Event()
                log.info("asking the control plane to renew this node's certificate (%s)", self.tls_dir / "node.crt")
                send(agent_message(renew_certificate=pb.RenewCertificate(csr_pem=csr, node_secret=self.secret())))
            with trio.move_on_after(RETRY_SECONDS):
                await self._answered.wait()

    def accept(self, answer: pb.CertificateRenewed) -> None:
        """The control plane's answer: a certificate for the key asked with is checked and installed; a refusal is
        logged and the request made again after `RETRY_SECONDS`. Blocking (writes two files). Never raises."""
        pending = self._pending
        if pending is None:
            log.warning("the control plane sent a renewed certificate this agent did not ask for; ignored")
            return
        if answer.error or not answer.certificate_pem:
            log.warning("the control plane did not renew this node's certificate: %s", answer.error or "no answer")
            return
        try:
            ca = (self.tls_dir / "ca.crt").read_bytes()
            end = check_renewed(answer.certificate_pem, pending[0], ca, self.node_id)
            install_renewed(self.tls_dir, answer.certificate_pem, pending[0])
        except (WireError, OSError) as exc:
            log.warning("the renewed certificate was not installed: %s", exc)
            return
        self._pending = None
        self.renewed += 1
        self._answered.set()
        log.info("renewed this node's certificate, valid until %s UTC; used from the next connection on",
                 time.strftime("%Y-%m-%d %H:%M", time.gmtime(end)))
