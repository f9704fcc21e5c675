"""A segment that does not fit in /dev/shm fails before it is made, in one line naming the size it
needs, the size free and the fix (a container's /dev/shm is 64 MiB unless given more), instead of
a relay or a learner dying on posix_fallocate with no hint.

On a real 4 MiB tmpfs standing in for a container's /dev/shm (mounting one needs root; the
message itself is checked everywhere).
"""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

from streamrl.weightsync.transports.shm import segment

MIB = 1 << 20


def test_the_message_names_the_need_the_free_space_and_both_fixes():
    said = segment.space_error(401 * MIB, 64 * MIB)
    assert said == (
        "/dev/shm has 64.0 MiB free, and this shared-memory segment needs 401.0 MiB (its slots x "
        "the model's bytes): give it more (docker run --shm-size=1g; Kubernetes: an emptyDir "
        "volume with medium: Memory mounted at /dev/shm), or use fewer slots"
    )
    assert segment.space_error(64 * MIB, 64 * MIB) is None


@pytest.fixture
def small_shm(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where = tmp_path / "shm"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)], check=True)
    monkeypatch.setattr(segment, "SHM_DIR", where)
    yield where
    subprocess.run(["umount", str(where)], check=True)


def test_a_segment_larger_than_the_free_shm_is_refused_before_it_is_made(small_shm):
    run = f"space-{uuid.uuid4().hex[:8]}"
    with pytest.raises(segment.ShmSpaceError) as refused:
        segment.SegmentWriter(run, slots=2, stride=3 * MIB, body_bytes=6 * MIB, lease_s=5.0)
    said = str(refused.value)
    assert said.startswith(
        f"{small_shm} has 4.0 MiB free, and this shared-memory segment needs 6.0"
    )
    assert "--shm-size" in said and "medium: Memory" in said and "\n" not in said
    assert list(small_shm.iterdir()) == []
    # one that fits is made there
    fits = segment.SegmentWriter(run, slots=2, stride=MIB, body_bytes=2 * MIB, lease_s=5.0)
    try:
        assert fits.path.parent == small_shm and fits.path.exists()
    finally:
        fits.close()
