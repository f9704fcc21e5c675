"""What is host-local in weight sync, keyed by ``run.host_id``: each host's announcement keys (read by
that host's actors, written by whoever serves the host's shared memory: the learner on its own
host, the host's relay elsewhere) and the relay's identity in the learner's dist group.

Hosts may share a filesystem and even ``/dev/shm`` (the multi-host test's network namespaces do),
so nothing here may be found through a name that another host would also use.
"""

from __future__ import annotations

import copy

from streamrl.broker.keys import Keys

RELAY_PREFIX = "relay:"


def host_keys(keys: Keys, host_id: str) -> Keys:
    """``keys`` with the weight announcement and its notify channel of ``host_id``'s shared memory."""
    local = copy.copy(keys)
    local.weights = f"{keys.prefix}host:{host_id}:weights"
    local.weights_notify = f"{keys.prefix}host:{host_id}:weights:notify"
    return local


def relay_member(host_id: str) -> str:
    """The member id of ``host_id``'s relay in the learner's dist group."""
    return RELAY_PREFIX + host_id


def relay_stats_key(keys: Keys) -> str:
    """Hash of what each host's relay received: ``<host_id>:bytes`` and ``<host_id>:versions``, and
    what went wrong: ``<host_id>:refused`` (values the learner did not sign) and ``<host_id>:errors``
    (failed steps)."""
    return f"{keys.prefix}weights:relay:received"
