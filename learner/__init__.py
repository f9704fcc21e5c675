"""learner: turns scored groups from the stream into optimizer steps and policy versions.

Owns one trainer (``trainer``: the policy and its reference, the DeepSpeed ZeRO-2 engine
(``engine``), checkpoint/resume (``checkpoint``, ``init_optimizer``, ``progress``), the export
as a Hugging Face folder (``export``), the step rows, their trackers (``tracking``) and MFU
(``throughput``), the Prometheus endpoint (``metrics``)) and the objectives that run on it, each
supplying its batches and its loss: RL (``grpo``: the stream through ``rollout_io``, the commit
bookkeeping ``commits``, the step ``step`` of the RL math in ``algorithm``, batching into
token-budget micro-batches in ``batching``), SFT (``sft``) and DPO (``dpo``), which share a
dataset file's steps (``supervised``, ``supervised_data``, ``supervised_batches``,
``supervised_loss``), and how its ranks start on one node or several (``nodes``: torchrun's
static rendezvous; ``torchrun``: torch's launcher, quiet on a stop signal). The policy itself
(loading, token scoring, LoRA) is ``policy``'s.

Talks to: Redis through ``broker`` (consumer group, version, admission
counters) and the actors through ``weightsync`` publishers. May import:
``configs``, ``broker``, ``weightsync``, ``policy``, ``runtime``. Must not import ``actors``.
"""
