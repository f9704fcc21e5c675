"""weightsync: versioned weights from the learner to running actors without pausing generation.

Owns the publisher on learner rank 0 and the subscriber on each actor (``publisher``,
``subscriber``), the weight transports they drive, by name (``transports``: ``shm``,
``cuda_ipc``, ``dist``, ``none``, each one subpackage holding all its wire and storage code),
and what several transports share: the learner-to-engine name mapping (``naming``), a version's
byte layout (``layout``), the announcements in Redis (``announce``), an actor's way to its
weights (``feed``), what is host-local, keyed by ``run.host_id`` (``hosts``), the host relay
that serves one actor host over shm from the learner's dist group (``relay``) and the metrics
(``metrics``). What a version holds (a policy's tensors, merged or adapters with LoRA) is
``policy``'s to say, and how a vLLM engine loads one is ``actors.engines.vllm``'s; weightsync
only moves it.

Talks to: Redis through ``broker`` (version announcements, rendezvous).
May import: ``configs``, ``broker``, ``policy``, ``runtime``. Must not import ``actors`` or
``learner``.
"""
