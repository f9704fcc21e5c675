"""weightsync: versioned weights from the learner to running actors without pausing generation.

Owns the learner-to-engine name mapping (``naming``), the publisher and
subscriber (``publisher``, ``subscriber``) over the transports registered in
``transports`` by name: POSIX shared memory on one host (``shm``, segment code
in ``shm``), CUDA IPC from slots on the learner's GPU to GPU actors on its host
(``cuda_ipc``: slots and their control segment in ``ipc_slots``, every CUDA call in
``device_ipc``), torch.distributed broadcast in buckets (``dist``: NCCL on GPUs,
gloo on CPU, group code in ``dist``) and ``none``, the host relay across hosts
(``relay``: one receiver per actor host serving its actors over shm; what is
host-local is keyed by ``run.host_id`` in ``hosts``, the dist address is
``address``'s), plus the GPU-free logic of the vLLM weight-transfer adapter
(``vllm_adapter``) and the vLLM workers' backends that load a slot in place
(``vllm_shm_engine``, ``vllm_ipc_engine``, registered by ``vllm_plugin``). What a version holds (a policy's
tensors, merged or adapters with LoRA) is ``policy``'s to say; weightsync only moves it.

Talks to: Redis through ``broker`` (version announcements, rendezvous).
May import: ``configs``, ``broker``, ``policy``, ``runtime``. Must not import ``actors`` or
``learner``.
"""
