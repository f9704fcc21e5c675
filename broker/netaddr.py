"""Which of this host's addresses another host reaches it on, and the interface that holds it.

A host name can resolve to 127.0.1.1 (Debian's /etc/hosts) or to nothing at all, so neither
``socket.gethostname()`` nor ``getfqdn()`` tells another host where to connect. The kernel's
routing table does: the source address of a route to the peer is the address the peer sees.
gloo and NCCL pick their interface by name (``GLOO_SOCKET_IFNAME``, ``NCCL_SOCKET_IFNAME``);
``interface_of`` maps that address to it.
"""

from __future__ import annotations

import ipaddress
import socket

import psutil

# no packet is sent: connect() on a UDP socket only selects the route
_ANY_PORT = 9


def wildcard(host: str) -> bool:
    """``0.0.0.0``, ``::`` or empty: bound on every interface, so no address to hand out."""
    return host in ("", "0.0.0.0", "::")


def route_source(peer: str) -> str:
    """The local address the route to ``peer`` (a name or an address) leaves from."""
    family, _type, _proto, _name, sockaddr = socket.getaddrinfo(
        peer, _ANY_PORT, type=socket.SOCK_DGRAM
    )[0]
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.connect(sockaddr)
        return sock.getsockname()[0]


def interface_of(address: str) -> str | None:
    """The name of the interface that holds ``address`` (``eth0``), or None if none does."""
    wanted = ipaddress.ip_address(address.split("%")[0])
    for name, addrs in psutil.net_if_addrs().items():
        for addr in addrs:
            if addr.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            try:
                if ipaddress.ip_address(addr.address.split("%")[0]) == wanted:
                    return name
            except ValueError:
                continue
    return None


def advertised(bound: str, peer: str) -> str:
    """The address to tell ``peer`` for a socket bound to ``bound``: itself, unless it is a
    wildcard, then the address the route to ``peer`` leaves from."""
    return route_source(peer) if wildcard(bound) else bound
