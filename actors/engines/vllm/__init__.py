"""The vLLM engine and everything vLLM-specific about how weights reach it.

- ``engine``: ``VLLMEngine``, a thin adapter around vLLM's AsyncLLM (GPU, or the CPU build):
  its arguments, generation, and the task that pushes each new version in;
- ``outputs``: sampling arguments in, our ``Output`` (behaviour log-probs, per-token versions) out;
- ``push``: vLLM's weight-transfer protocol driven from the actor (pause, start, update per step,
  finish with the version label, resume; a failed push restores a complete version);
- ``senders``: the actor's side of vLLM's ``ipc`` and ``nccl`` backends (a staged set in buckets);
- ``shm_backend``, ``cuda_ipc_backend``: the worker side of our ``streamrl_shm`` and
  ``streamrl_cuda_ipc`` backends (import vLLM; run in vLLM's workers), whose workers load an
  announced slot of the ``shm`` or ``cuda_ipc`` transport in place;
- ``plugin``: registers those two in every vLLM process (``vllm.general_plugins``).

vLLM itself is imported only where an engine is built or a worker loads weights.
"""
