"""What an XID means for the card: NVIDIA's XID catalog, reduced to what placement needs. Pure data.

Source: NVIDIA, "XID Errors" and its catalog sheet (https://docs.nvidia.com/deploy/xid-errors/index.html,
https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), column "Immediate resolution": RESTART_APP
(the application's error; the card is fine), RESET_GPU, RESTART_BM (reboot the machine), CHECK_MECHANICALS,
IGNORE, CONTACT_SUPPORT and per-XID workflows. The descriptions below are the catalog's; where the catalog names a
workflow rather than an action, the action chosen here is written beside it.

Xid 154 ("GPU recovery action changed") carries the new action in its message ("... to 0x1 (GPU Reset
Required)", "to 0x2 (Node Reboot Required)", "to 0x4 (Drain and Reset)", "to 0x0 (None)"): `classify_xid` reads it.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"


class XidAction(enum.Enum):
    """What the card needs after an XID, mildest first.

    IGNORE: informational. RESTART_APP: the application failed; the card keeps working. WATCH: the card works but
    something is wearing out or needs a look (NVIDIA: contact support, check). RESET_GPU: the card cannot be
    trusted to compute until it is reset. REBOOT: the card is gone from the bus or the machine must be rebooted
    (or its power or seating checked).
    """

    IGNORE = "ignore"
    RESTART_APP = "restart-app"
    WATCH = "watch"
    RESET_GPU = "reset-gpu"
    REBOOT = "reboot"

    @property
    def takes_card_out(self) -> bool:
        """True when the card must leave placement until it is reset or the machine rebooted."""
        return self in (XidAction.RESET_GPU, XidAction.REBOOT)


@dataclass(frozen=True)
class XidInfo:
    """One catalog entry: `xid`, the catalog's `description`, the `action` chosen here, `note` (why, where the
    catalog names a workflow) and `source` (the catalog's address)."""

    xid: int
    description: str
    action: XidAction
    note: str = ""
    source: str = CATALOG_URL


_A = XidAction
# (description, action, note). Codes the catalog marks "Unused" are left out: they read as unknown (WATCH).
_CATALOG: dict[int, tuple[str, XidAction, str]] = {
    8: ("GPU stopped processing", _A.RESTART_APP, ""),
    11: ("Invalid or corrupted push buffer stream", _A.RESTART_APP, ""),
    13: ("Graphics Engine Exception", _A.RESTART_APP, "catalog workflow XID 13: usually the application"),
    25: ("Invalid or illegal push buffer stream", _A.RESTART_APP, ""),
    31: ("GPU memory page fault", _A.RESTART_APP, "catalog workflow XID 31: usually an illegal access by the app"),
    32: ("Invalid or corrupted push buffer stream", _A.RESTART_APP, ""),
    37: ("Driver firmware error", _A.IGNORE, ""),
    38: ("Driver firmware error", _A.IGNORE, ""),
    39: ("Copy Engine Exception", _A.RESTART_APP, ""),
    40: ("Copy Engine Exception", _A.RESTART_APP, ""),
    41: ("Copy Engine Exception", _A.RESTART_APP, ""),
    43: ("GPU stopped processing", _A.IGNORE, "the application's channel was reset; the card is fine"),
    44: ("Graphics Engine fault during context switch", _A.IGNORE, ""),
    45: ("Preemptive cleanup, due to previous errors", _A.IGNORE, "follows another XID, which decides"),
    46: ("GPU stopped processing", _A.RESET_GPU, ""),
    48: ("Double Bit ECC Error", _A.RESET_GPU,
         "catalog workflow XID 48: an uncorrectable memory error; reset so the row remap or page retirement "
         "takes effect"),
    54: ("Auxiliary power is not connected to the GPU board", _A.REBOOT, "catalog: check mechanicals"),
    60: ("Video processor exception", _A.RESTART_APP, ""),
    62: ("Internal micro-controller halt", _A.RESET_GPU, ""),
    63: ("GPU memory remapping event", _A.IGNORE, "a row was marked for remapping; see remapped rows pending"),
    64: ("GPU memory remapping failure", _A.RESET_GPU, ""),
    66: ("Illegal access by driver", _A.IGNORE, ""),
    67: ("Illegal access by driver", _A.IGNORE, ""),
    68: ("NVDEC0 Exception", _A.RESTART_APP, ""),
    69: ("Graphics Engine class error", _A.RESTART_APP, ""),
    74: ("NVLINK Error", _A.RESET_GPU,
         "catalog workflow NVLink error: a link that went down stays down until the GPU is reset"),
    79: ("GPU has fallen off the bus", _A.REBOOT, "catalog: restart the bare-metal machine"),
    80: ("Corrupted data sent to GPU", _A.RESTART_APP, ""),
    92: ("High single-bit ECC error rate", _A.WATCH, "catalog: ignore; counted here as wear"),
    93: ("Non-fatal violation of provisioned InfoROM wear limit", _A.WATCH, "catalog: ignore; counted as wear"),
    94: ("Contained memory error", _A.RESTART_APP,
         "the error was contained to one application; a row remap is then pending (reset at a convenient time)"),
    95: ("Uncontained memory error", _A.RESET_GPU, ""),
    109: ("Context Switch Timeout Error", _A.RESET_GPU, ""),
    110: ("Security Fault Error", _A.RESET_GPU, ""),
    119: ("GSP RPC Timeout", _A.RESET_GPU, ""),
    120: ("GSP Error", _A.RESET_GPU, ""),
    121: ("C2C Error", _A.IGNORE, ""),
    136: ("Link Training Failed", _A.RESET_GPU, ""),
    137: ("NVLink Privilege Error", _A.IGNORE, ""),
    140: ("ECC Unrecovered Error", _A.RESET_GPU, ""),
    141: ("CUDA Fast Path Error", _A.IGNORE, ""),
    143: ("GPU Initialization Error", _A.RESET_GPU, ""),
    144: ("NVLINK: SAW Error", _A.RESET_GPU, "catalog workflow NVLink5 error"),
    145: ("NVLINK: RLW Error", _A.RESET_GPU, "catalog workflow NVLink5 error"),
    146: ("NVLINK: TLW Error", _A.RESET_GPU, "catalog workflow NVLink5 error"),
    147: ("NVLINK: TREX Error", _A.RESET_GPU, "catalog workflow NVLink5 error"),
    148: ("NVLINK: NVLPW_CTRL Error", _A.RESET_GPU, "catalog workflow NVLink5 error"),
    149: ("NVLINK: NETIR Error", _A.RESET_GPU, "catalog workflow NVLink5 error"),
    150: ("NVLINK: MSE Error", _A.RESET_GPU, "catalog workflow NVLink5 error"),
    151: ("Key rotation Error", _A.REBOOT, "catalog: restart the VM"),
    154: ("GPU Recovery Action Changed", _A.WATCH, "the action is read from the message"),
    155: ("NVLINK: SW Defined Error", _A.RESET_GPU, ""),
    156: ("Resource Retirement Event", _A.RESET_GPU, ""),
    157: ("Resource Retirement Failure", _A.IGNORE, ""),
    158: ("GPU Fatal Timeout", _A.RESET_GPU, ""),
    160: ("Channel Retirement Event", _A.IGNORE, ""),
    161: ("Channel Retirement Failure", _A.IGNORE, ""),
}
# Engine exceptions the catalog resolves by restarting the application (copy engines CE3..CE19, video and JPEG
# decoders and encoders, OFA).
for _code in (*range(70, 73), *range(75, 78), *range(82, 87), 88, 89, *range(96, 106), *range(126, 136), 139):
    _CATALOG.setdefault(_code, ("Engine exception (copy engine, video or JPEG unit)", _A.RESTART_APP, ""))
for _code in (106, 107):
    _CATALOG[_code] = ("SMBPBI Test Message", _A.IGNORE, "")

_RECOVERY = re.compile(r"to 0x([0-9a-fA-F]+)\s*\(([^)]*)\)")
_RECOVERY_ACTIONS = {0: XidAction.IGNORE, 1: XidAction.RESET_GPU, 2: XidAction.REBOOT, 4: XidAction.RESET_GPU}


def xid_info(xid: int) -> XidInfo:
    """The catalog entry of `xid`; an XID the table does not know is WATCH with a note saying so."""
    entry = _CATALOG.get(xid)
    if entry is None:
        return XidInfo(xid, "not in llmgw's copy of NVIDIA's XID catalog", XidAction.WATCH,
                       "look it up in NVIDIA's catalog")
    return XidInfo(xid, *entry)


def classify_xid(xid: int, message: str = "") -> XidInfo:
    """`xid_info(xid)`, except for Xid 154, whose action is read from its message ("... to 0x1 (GPU Reset
    Required)": RESET_GPU; 0x2 Node Reboot Required: REBOOT; 0x4 Drain and Reset: RESET_GPU; 0x0 None: IGNORE).
    Never raises."""
    info = xid_info(xid)
    if xid != 154:
        return info
    match = _RECOVERY.search(message)
    if not match:
        return info
    action = _RECOVERY_ACTIONS.get(int(match.group(1), 16), XidAction.WATCH)
    return XidInfo(xid, info.description, action, f"recovery action now {match.group(2).strip()!r}")
