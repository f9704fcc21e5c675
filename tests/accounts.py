"""System accounts the security tests run code as (created on first use; needs root)."""

from __future__ import annotations

import pwd
import subprocess


def system_user_uid(name: str) -> int:
    """The uid of the system account ``name``, created (no home, no shell) if missing; needs root."""
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            check=True,
        )
        return pwd.getpwnam(name).pw_uid
