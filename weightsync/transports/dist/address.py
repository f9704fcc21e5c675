"""Which of this host's addresses the dist transport uses: the one other hosts reach it on.

Which local address traffic to a peer leaves from is ``broker.netaddr.toward``'s (the kernel's
routing table; no packet is sent).
"""

from __future__ import annotations

import socket

import psutil

from streamrl.broker.netaddr import toward
from streamrl.broker.server import is_loopback

# TEST-NET-1 (RFC 5737): never routed anywhere, so asking for it finds the default route's interface
_DEFAULT_ROUTE_PROBE = "192.0.2.1"


def _interface_address() -> str | None:
    """The first IPv4 address of an interface that is up and not loopback."""
    stats = psutil.net_if_stats()
    for name, addresses in psutil.net_if_addrs().items():
        if name in stats and not stats[name].isup:
            continue
        for address in addresses:
            if address.family == socket.AF_INET and not is_loopback(address.address):
                return address.address
    return None


def routable(broker_host: str | None) -> str:
    """This host's address as the run's other hosts reach it: the one its traffic to the broker
    leaves from. A broker on loopback (or a socket file) confines the run to this host, so it is
    loopback too; a broker name this host resolves to its own loopback (Debian's 127.0.1.1) says
    nothing, so then the default route's address, else any interface's that is up.
    """
    if broker_host is None or is_loopback(broker_host):
        return "127.0.0.1"
    for peer in (broker_host, _DEFAULT_ROUTE_PROBE):
        local = toward(peer)
        if local is not None and not is_loopback(local):
            return local
    return _interface_address() or "127.0.0.1"
