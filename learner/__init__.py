"""learner: turns scored groups from the stream into optimizer steps and policy versions.

Owns the RL math as pure functions (``algorithm``), batching into token-budget
micro-batches (``batching``), the DeepSpeed ZeRO-2 engine (``engine``),
checkpoint/resume (``checkpoint``), the training loop (``__main__``), experiment
tracking of the step rows (``tracking``), their MFU (``throughput``) and the export of the policy as a Hugging Face
folder (``export``); the same engine trains SFT and DPO from a dataset file
(``supervised_loop``, ``supervised_data``, ``supervised_batches``, ``supervised_loss``). The policy itself (loading, token scoring, LoRA) is ``policy``'s.

Talks to: Redis through ``broker`` (consumer group, version, admission
counters) and the actors through ``weightsync`` publishers. May import:
``configs``, ``broker``, ``weightsync``, ``policy``, ``runtime``. Must not import ``actors``.
"""
