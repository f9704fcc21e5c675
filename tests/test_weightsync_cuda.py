"""CUDA IPC weight handles, end to end on a real GPU: what ``IPCSender`` puts in an update info is
rebuilt by another process exactly the way vLLM's IPC weight-transfer worker rebuilds it (vLLM 0.32,
``ipc_engine.py``: pick the entry of its GPU's UUID, set args[6] to its own device index, call
``rebuild_cuda_tensor``), and the receiver sees the staged values, also those of a non-contiguous view.

Skipped without CUDA (CI has no GPU); the rest of the IPC sender is tested in
``test_actors_vllm_adapter.py``."""

from __future__ import annotations

import base64
import multiprocessing
import pickle

import pytest
import torch

from streamrl.weightsync.vllm_adapter import IPCSender, staged_buckets

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _receive(handles_b64: str, device_index: int, results) -> None:
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    try:
        handles = pickle.loads(base64.b64decode(handles_b64))
        uuid = str(torch.cuda.get_device_properties(device_index).uuid)
        tensors = []
        for handle in handles:
            args = list(handle[uuid])
            args[6] = device_index
            tensors.append(rebuild_cuda_tensor(*args).cpu().tolist())
        results.put(("ok", tensors))
    except Exception as exc:
        results.put(("error", f"{type(exc).__name__}: {exc}"))


def test_ipc_handles_rebuild_in_another_process_as_vllms_worker_does():
    device = torch.device("cuda", 0)
    base = torch.arange(12.0, device=device).reshape(3, 4)
    staged = {
        "w": base * 2,
        # a transposed view: the sender must hand out a contiguous copy, not the view's storage
        "t": base.t(),
        "b": torch.full((5,), 7.0, device=device, dtype=torch.bfloat16),
    }
    (bucket,) = staged_buckets(staged, 1 << 20)
    sender = IPCSender()
    info = sender.update_info(bucket, bucket.tensors(staged))
    assert info["names"] == ["w", "t", "b"] and info["shapes"] == [[3, 4], [4, 3], [5]]

    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    proc = ctx.Process(target=_receive, args=(info["ipc_handles_pickled"], 0, results))
    proc.start()
    status, received = results.get(timeout=120)
    proc.join(timeout=30)
    assert status == "ok", received
    for name, values in zip(info["names"], received, strict=True):
        assert values == staged[name].float().cpu().tolist(), name
    sender.close()
