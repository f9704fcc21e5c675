"""weightsync: versioned weights from the learner to running actors without pausing generation.

Owns loading a policy folder (``policy``: the one loader learner and actors
share), the learner-to-engine name mapping (``naming``), the publisher and
subscriber (``publisher``, ``subscriber``) over the transports registered in
``transports`` by name: POSIX shared memory on one host (``shm``, segment code
in ``shm``), torch.distributed broadcast in buckets (``dist``: NCCL on GPUs,
gloo on CPU, group code in ``dist``) and ``none``, plus the GPU-free logic of
the vLLM weight-transfer adapter (``vllm_adapter``). With LoRA (``model.lora``), what
a version publishes (merged weights or adapters) and how an actor applies adapters
(``lora``), and a vLLM actor's adapter versions (``vllm_lora``).

Talks to: Redis through ``broker`` (version announcements, rendezvous).
May import: ``configs``, ``broker``. Must not import ``actors`` or ``learner``.
"""
