"""Which of this host's addresses another host reaches it on.

A host name can resolve to 127.0.1.1 (Debian's /etc/hosts) or to nothing at all, so neither
``socket.gethostname()`` nor ``getfqdn()`` tells another host where to connect. The kernel's
routing table does: the source address of a route to the peer is the address the peer sees.
"""

from __future__ import annotations

import socket

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


def advertised(bound: str, peer: str) -> str:
    """The address to tell ``peer`` for a socket bound to ``bound``: itself, unless it is a
    wildcard, then the address the route to ``peer`` leaves from."""
    return route_source(peer) if wildcard(bound) else bound
