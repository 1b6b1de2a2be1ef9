"""GPU classes: the name a catalog entry asks for ("h200-141g", "a100-80g-mig-3g.40gb"), derived from a card's name
and memory. Pure functions.

The memory part is the marketed size in GB, found from the size the driver reports: NVML and nvidia-smi report a
little less than the label (an H200 "141GB" reports 143771 MiB = 140.4 GiB, an L40S "48GB" 46068 MiB = 45 GiB,
an L4 "24GB" 23034 MiB), so the reported GiB is rounded up to the next marketed size within a tolerance.
"""

from __future__ import annotations

import re

# Memory sizes NVIDIA data-centre and workstation cards are sold with, in GB, ascending.
MARKETED_GB = (
    2, 3, 4, 5, 6, 8, 10, 11, 12, 16, 20, 24, 32, 40, 48, 64, 80, 94, 96, 120, 128, 141, 144, 180, 186, 192, 256, 288,
)
# A card reports at most this much less than the next marketed size and still counts as that size
# (L40S and L4 report 93.75 % of their label, the lowest seen).
_TOLERANCE = 0.90

_DROP_WORDS = {"nvidia", "tesla", "geforce", "quadro", "pcie", "sxm", "sxm2", "sxm4", "sxm5", "nvl", "hbm2",
               "hbm2e", "hbm3", "hbm3e", "generation", "laptop", "gpu", "graphics", "max-q", "edition"}
_SIZE_WORD = re.compile(r"^[0-9]+(gb|g)$")


def card_label(name: str) -> str:
    """The card part of a class from the driver's product name, lower case with dashes.

    "NVIDIA H200" -> "h200", "NVIDIA A100-SXM4-80GB" -> "a100", "NVIDIA GeForce RTX 4090" -> "rtx-4090",
    "Tesla V100-SXM2-32GB" -> "v100", "NVIDIA RTX 6000 Ada Generation" -> "rtx-6000-ada". Form factor words
    (PCIe, SXM, NVL), memory sizes and memory types are dropped: the memory part of the class says the size.
    "" when nothing is left.
    """
    name = name.split(" MIG ")[0]
    words = [w for w in re.split(r"[\s\-_/(),]+", name.lower()) if w]
    kept = [w for w in words if w not in _DROP_WORDS and not _SIZE_WORD.match(w)]
    return "-".join(kept)


def marketed_gb(memory_bytes: int) -> int:
    """The marketed memory size in GB of a card that reports `memory_bytes` in total (see the module docstring).

    Sizes above the table are whole GiB rounded to nearest. Raises ValueError for a size of 0 or less.
    """
    if memory_bytes <= 0:
        raise ValueError(f"a GPU memory size must be positive, not {memory_bytes}")
    gib = memory_bytes / 1024**3
    for size in MARKETED_GB:
        if gib <= size * 1.005 and gib >= size * _TOLERANCE:
            return size
        if gib < size * _TOLERANCE:
            break
    return round(gib)


def gpu_class(name: str, memory_bytes: int | None) -> str | None:
    """"<card>-<marketed GB>g" from a product name and total memory in bytes; None when either is unknown."""
    label = card_label(name)
    if not label or not memory_bytes or memory_bytes <= 0:
        return None
    return f"{label}-{marketed_gb(memory_bytes)}g"


def mig_profile(name: str) -> str:
    """The MIG profile from a MIG device's name or `nvidia-smi -L` line ("NVIDIA A100-SXM4-80GB MIG 3g.40gb" ->
    "3g.40gb", "MIG 1g.18gb+me" -> "1g.18gb+me"); "" when the text names none."""
    match = re.search(r"\bMIG\s+([0-9]+c?\.?[0-9]*g[.0-9a-z+]*)", name, re.IGNORECASE)
    return match.group(1).lower() if match else ""


def mig_class(parent_class: str | None, profile: str) -> str | None:
    """A MIG instance's class, "<parent class>-mig-<profile>" ("a100-80g-mig-3g.40gb"); None if either is unknown."""
    if not parent_class or not profile:
        return None
    return f"{parent_class}-mig-{profile.lower()}"
