"""What a job's measured link classes (cluster/linkcheck.py) mean for the choice of mode, in words: the
run's start-up line and summary.json's `links`, and `granndis report`.  Standard library only (the report
imports neither torch nor MPI).

GraNNDis' preloading (flx, eas) computes more rows to send fewer bytes between servers.  That pays
where the inter-server link is much slower than the links inside a server (the paper's 10 GbE testbed:
28x; clusters with one NIC per node: 60-120x) and not where it is about as fast: one machine, or
emulated servers sharing loopback.
"""
from __future__ import annotations

from typing import Optional

# Below this ratio of intra- to inter-server bandwidth, the inter-server link is "about as fast".
SLOW_LINK_RATIO = 2.0


def ratio(links: dict) -> Optional[float]:
    """How many times faster the intra-server link is than the inter-server one (None: not both measured)."""
    inter, intra = links.get("inter_Bps"), links.get("intra_Bps")
    return intra / inter if inter and intra else None


def rate(bytes_per_s: float) -> str:
    bits = bytes_per_s * 8
    return f"{bits / 1e9:.2f} Gbit/s" if bits >= 1e9 else f"{bits / 1e6:.0f} Mbit/s"


def verdict(links: dict) -> str:
    """One line: the measured rates and, where the inter-server link is not the slow one, that fb is the
    expected winner."""
    if links.get("inter_Bps") is None:
        return "links: one server, no inter-server link: every mode sends the same (no) inter-server bytes"
    parts = [f"inter-server {rate(links['inter_Bps'])}"]
    r = ratio(links)
    if r is not None:
        parts.append(f"intra-server {rate(links['intra_Bps'])} ({r:.1f}x the inter-server)")
    line = "links: " + ", ".join(parts)
    if r is not None and r < SLOW_LINK_RATIO:
        line += ("; the inter-server link is about as fast as the intra-server one, so saving inter-server bytes "
                 "does not pay here (flx and eas compute more rows to send fewer bytes) and fb is the expected "
                 "winner: GraNNDis' modes are for a slower link between servers (docs/concepts.md)")
    return line
