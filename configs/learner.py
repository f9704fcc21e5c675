"""The learner: the RL objective (``algo``), the DeepSpeed trainer (``learner``) and the
supervised commands' dataset and loss (``supervised``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from streamrl.configs.section import Section, unread_options_kept


class StalenessAuto(Section):
    """``max_staleness: auto``: the drift the learner keeps to and the range it sets the bound in."""

    ess_floor: float = Field(
        0.9,
        gt=0,
        lt=1,
        description="The drift target: the lowest normalised effective sample size mean(w)^2/mean(w^2) of the step's truncated IS weights (the step row's is_ess) the bound may cost. The bound is raised while the ESS, projected to one more version of lag, stays above it, and lowered when it falls below. An ESS floor and not a KL ceiling: it is scale-free (1 on-policy, the share of the batch's tokens that still count), the same for any model, vocabulary or task, where a useful KL(behaviour || proximal) ceiling depends on the policy's entropy; and it measures what staleness costs the update, the variance of the IS-weighted gradient.",
    )
    min: int = Field(0, ge=0, description="The lowest bound, and the bound a learner starts at.")
    max: int = Field(
        8,
        ge=0,
        description="The highest bound; also the staleness past which the learner masks tokens (a group admitted under a higher bound than the current one still trains).",
    )
    window: int = Field(
        4,
        ge=1,
        description="Learner steps whose mean ESS one decision reads (after a change, only steps whose data was admitted under the new bound).",
    )

    @model_validator(mode="after")
    def _ordered(self) -> StalenessAuto:
        if self.min > self.max:
            raise ValueError(f"min={self.min} > max={self.max}")
        return self


class AlgoConfig(Section):
    """The RL objective: advantages, staleness bound, importance weights and clipping, aggregation."""

    max_staleness: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        2,
        description="Tokens (and groups) older than this many versions are masked/dropped; also the admission-control bound. auto = the learner sets the admission bound after every step from the measured drift, within staleness_auto's [min, max] (actors follow it without a restart; tokens are masked past staleness_auto.max). Needs proximal: recompute and importance_correction: the drift is read from the IS weights.",
    )
    staleness_auto: StalenessAuto = Field(
        default_factory=StalenessAuto,
        description="The controller of max_staleness: auto (read only then).",
    )
    advantage: Literal["grpo", "drgrpo"] = Field(
        "grpo", description="grpo = (r - mean)/(std + eps); drgrpo = r - mean (no std)."
    )
    adv_eps: float = Field(1e-4, gt=0, description="eps in (r - mean)/(std + eps).")
    std_threshold: float = Field(
        1e-6,
        ge=0,
        description="Adaptive fallback: a group whose reward std is below this uses mean subtraction only.",
    )
    skip_zero_variance: bool = Field(
        True,
        description="Leave groups whose rewards are all equal out of the update (they still count in the loss normaliser and are counted); ignored while kl_coef or entropy_coef is on, whose terms give those tokens a gradient.",
    )
    dynamic_sampling: bool = Field(
        False,
        description="DAPO's dynamic sampling: a step keeps reading until groups_per_step of its groups carry a signal (neither zero-variance nor wholly stale); the others are counted, acked with the step and left out of the loss normaliser. Uses the actors' spare generation once most groups are solved or collapsed.",
    )
    dynamic_sampling_max_groups: int = Field(
        0,
        ge=0,
        description="Most groups one step reads under dynamic_sampling (0 = 8 x groups_per_step, never fewer than groups_per_step); a step that reaches it trains on the signal it has.",
    )
    clip_low: float = Field(
        0.2,
        ge=0,
        lt=1,
        description="PPO ratio clip: r is clipped to [1 - clip_low, 1 + clip_high].",
    )
    clip_high: float = Field(
        0.2, ge=0, description="Upper clip range (DAPO's clip-higher when > clip_low)."
    )
    importance_sampling_level: Literal["token", "sequence"] = Field(
        "token",
        description="token = one ratio pi_theta/pi_prox per token; sequence = GSPO: one ratio per completion, exp of the mean over its tokens of the log-ratio, clipped with sequence_clip_low/high (TRL's importance_sampling_level). The truncated IS weight and the KL stay per token; GSPO's paper averages per sequence (aggregation: seq_mean).",
    )
    sequence_clip_low: float = Field(
        3e-4,
        ge=0,
        lt=1,
        description="Lower clip range of the sequence ratio under importance_sampling_level: sequence (the GSPO paper's 3e-4: a mean log-ratio moves far less than a token's).",
    )
    sequence_clip_high: float = Field(
        4e-4,
        ge=0,
        description="Upper clip range of the sequence ratio under importance_sampling_level: sequence (the GSPO paper's 4e-4).",
    )
    rho_max: float = Field(
        2.0,
        gt=0,
        description="Truncation of the importance weight exp(pi_prox - mu) (V-trace rho-bar).",
    )
    importance_correction: bool = Field(
        True,
        description="Decoupled objective with the truncated IS weight; off = plain PPO ratio against the behaviour policy.",
    )
    staleness_tighten: float = Field(
        0.0,
        ge=0,
        description="Per version of staleness, shrink the clip ranges towards 0 and rho_max towards 1 by this fraction of their size (0 = off).",
    )
    proximal: Literal["recompute", "behaviour"] = Field(
        "recompute",
        description="pi_prox source: recompute with a no-grad pass, or reuse the behaviour log-probs.",
    )
    aggregation: Literal["token_mean", "seq_mean", "constant"] = Field(
        "token_mean",
        description="Loss aggregation: over all tokens, per sequence then mean, or sum / constant (Dr.GRPO).",
    )
    constant_normalizer: int = Field(
        0,
        ge=0,
        description="Normaliser for aggregation=constant (0 = a completion's token budget x batch size: rollout.max_new_tokens, or env.max_total_tokens for multi-turn trajectories, agent.max_total_tokens for agents).",
    )
    kl_coef: float = Field(
        0.0,
        ge=0,
        description="k3 KL penalty to the frozen initial policy (0 = off, no reference model kept).",
    )
    reference_on: Literal["learner", "actors"] = Field(
        "learner",
        description="Where the frozen initial policy scores the completions for the KL term: a no-grad pass on the learner, or on each actor right after generating (every actor then holds one more copy of model.path and sends the per-token log-probs with the group; entries without them are dead-lettered). The learner is usually what the actors wait for, so moving that pass to them shortens every step. Unused when kl_coef is 0.",
    )

    @property
    def staleness_range(self) -> tuple[int, int]:
        """The lowest and highest admission bound: the fixed bound twice, or auto's range."""
        if self.max_staleness == "auto":
            return self.staleness_auto.min, self.staleness_auto.max
        return self.max_staleness, self.max_staleness

    @property
    def staleness_limit(self) -> int:
        """The most versions a trained token may lag (older ones are masked): the highest bound."""
        return self.staleness_range[1]

    @model_validator(mode="after")
    def _auto_staleness_reads_drift(self) -> AlgoConfig:
        if self.max_staleness != "auto":
            unread_options_kept(
                self, "algo", ["staleness_auto"], f"max_staleness is {self.max_staleness}, not auto"
            )
        elif self.proximal != "recompute" or not self.importance_correction:
            raise ValueError(
                "max_staleness: auto reads the drift from the IS weights pi_prox / mu, which are 1 "
                "by construction without proximal: recompute and importance_correction: true"
            )
        return self

    @property
    def actors_score_reference(self) -> bool:
        """Whether the actors send the KL term's reference log-probs (a KL term, reference_on: actors)."""
        return self.kl_coef > 0 and self.reference_on == "actors"

    @property
    def learner_scores_reference(self) -> bool:
        """Whether the learner runs the KL term's reference pass itself (a KL term, reference_on: learner)."""
        return self.kl_coef > 0 and self.reference_on == "learner"

    entropy_coef: float = Field(
        0.0,
        ge=0,
        description="Entropy bonus: subtracts coef x the policy's per-token entropy from the loss; counters collapse onto one wrong answer (0 = off).",
    )


class LearnerConfig(Section):
    """The DeepSpeed learner: optimizer, batching, checkpoints, acknowledgement."""

    lr: float = Field(1e-6, gt=0, description="AdamW learning rate.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    warmup_steps: int = Field(
        0,
        ge=0,
        description="Linear LR warm-up, in optimizer steps (minibatches x updates_per_batch per learner step): the LR rises from 0 at the first to `lr` after warmup_steps (transformers' schedules, as TRL's).",
    )
    lr_scheduler: Literal["auto", "constant", "linear", "cosine"] = Field(
        "auto",
        description="LR after the warm-up, over run.max_steps learner steps of minibatches x updates_per_batch optimizer steps each (transformers' get_scheduler, TRL's lr_scheduler_type): constant; linear = decays to 0 at run.max_steps; cosine = half a cosine down to 0 at run.max_steps; auto = linear (TRL's default) when run.max_steps is set, else constant (no step limit, no horizon to decay over). linear and cosine need run.max_steps.",
    )
    init_optimizer: Literal["auto", "fresh"] = Field(
        "auto",
        description="What a new run's AdamW starts from (a resumed run's checkpoint holds its own). auto = the moments and step count a warm start saved next to the policy (`optimizer.pt`, written by `streamrl.learner.init_optimizer.save`, as the demo's policy builder does) where they fit the learner's optimizer (same trainable parameter names and shapes, betas, eps), else a fresh AdamW, the learner's log saying why; fresh = always a fresh AdamW.",
    )
    grad_clip: float = Field(1.0, ge=0, description="Gradient norm clip (0 = off).")
    groups_per_step: int = Field(
        16, ge=1, description="Rollout groups consumed by one optimizer step (across all ranks)."
    )
    updates_per_batch: int = Field(
        1,
        ge=1,
        description="Passes over one consumed batch (PPO epochs); each pass takes `minibatches` optimizer steps, each of which publishes a version.",
    )
    minibatches: int = Field(
        1,
        ge=1,
        description="Disjoint random mini-batches one pass splits the batch into, one optimizer step each (PPO style); the clip and IS weight stay relative to the policy at the start of the batch.",
    )

    @property
    def versions_per_batch(self) -> int:
        """Policy versions one consumed batch publishes (one per optimizer step)."""
        return self.updates_per_batch * self.minibatches

    micro_batch_tokens: int = Field(
        8192,
        ge=1,
        description="Token budget of one micro-batch: its packed rows (short samples end to end, each attending only to itself) x the longest sample; samples are never split. It bounds the activations (the logits: the completion tokens among them x vocabulary); the loss is the mini-batch's whatever the split.",
    )
    logprob_chunk_tokens: int = Field(
        1024,
        ge=1,
        description="Completion tokens whose logits (tokens x vocabulary, float32) the learner's log-prob and entropy pass holds at once; each chunk is recomputed in the backward pass, so autograd keeps only the hidden states (one more output-layer forward per step). 1024 x Qwen's 151,936 = 0.6 GB per chunk.",
    )
    packed_attention: Literal["auto", "varlen", "mask"] = Field(
        "auto",
        description="How an sdpa policy keeps the samples of a packed row apart in the learner's passes (other attention implementations are left as they are). mask = transformers' 4D mask from the position ids ([rows, width, width]; on a GPU it keeps sdpa off its flash kernel); varlen = no mask: causal attention within each sample's bounds (policy.packed_attention: torch's variable-length flash kernel on a CUDA GPU in bf16/fp16, one causal sdpa per sample elsewhere), the same arithmetic; auto = varlen on a CUDA learner, mask on a CPU one.",
    )
    peak_tflops: float | None = Field(
        None,
        ge=0,
        description="The learner GPU's dense bf16 peak, TFLOP/s per rank, that the step row's mfu divides by (x the learner's ranks). None or 0 = from the table of known GPUs by CUDA device name (learner.throughput); on a CPU learner or an unknown GPU mfu is left empty unless this is set.",
    )
    zero_stage: Literal[0, 1, 2] = Field(2, description="DeepSpeed ZeRO stage.")
    offload_optimizer: bool = Field(
        False,
        description="DeepSpeed ZeRO offload_optimizer to CPU (stage 1 or 2): the fp32 master weights, gradients and Adam moments live in pinned host memory and the optimizer steps on the CPU, with DeepSpeedCPUAdam on a GPU host (built once on first use, ~1-2 min, cached under TORCH_EXTENSIONS_DIR; torch AdamW if it cannot build) and torch AdamW on a CPU learner. Frees ~16 bytes per parameter on the GPU.",
    )
    gradient_checkpointing: bool = Field(
        False,
        description="Recompute each decoder layer's activations in the backward pass (transformers' gradient checkpointing, non-reentrant) instead of keeping them: activation memory per token drops from every layer's to about one layer's, for ~30 % more forward compute.",
    )
    gpus: list[int] | None = Field(
        None,
        description="GPUs of the learner ranks, one per rank (length = `ranks`), as indices into the devices the launcher sees; the learner gets them as its CUDA_VISIBLE_DEVICES and rank r takes the r-th. None = no placement (inherited CUDA_VISIBLE_DEVICES; rank r takes cuda:r).",
    )
    cpus: list[int] | Literal["auto"] | None = Field(
        None,
        description='CPU cores the learner ranks run on once started (start-up uses every core), as indices into the cores the launcher may use (its affinity: `taskset`, a cgroup cpuset); its threads included. "auto" = on a host without NVIDIA GPUs (none in the launcher\'s CUDA_VISIBLE_DEVICES, else no /dev/nvidiaN), the first `ranks` x `run.torch_threads` of them, when at least one core is left for the actors; otherwise no pinning. A learner that trains on the CPU and shares its cores with the actors (and Redis, and the launcher) is preempted mid-step and its caches evicted: on 2 cores the demo\'s learner steps took 1.1-1.2x as long unpinned (docs/benchmarks.md, "CPU placement"). None = no pinning.',
    )
    checkpoint_every: int = Field(
        50, ge=1, description="Save a resumable checkpoint every N steps (and at shutdown)."
    )
    ack_policy: Literal["step", "checkpoint"] = Field(
        "checkpoint",
        description="Ack consumed entries after every step, or only once a checkpoint holds the step (crash replays exactly the lost steps).",
    )
    read_timeout_s: float = Field(
        0.0,
        ge=0,
        description="Give up waiting for data after this long and exit (0 = wait forever).",
    )
    metrics_port: int = Field(
        0, ge=0, le=65535, description="Prometheus port of learner rank 0 (0 = free port)."
    )
    ranks: int = Field(
        1,
        ge=1,
        description="Learner ranks (data parallel) on each node: `streamrl run` and `streamrl learner` start them with torchrun --nproc-per-node; `streamrl learner --nnodes N` starts this many on each of N nodes.",
    )
    trusted_network: bool = Field(
        False,
        description="With `streamrl learner --nnodes N` (N > 1) over a network (not loopback): the user has made sure that only the run's hosts reach the learner nodes' ports (torch's TCPStore at --rdzv-endpoint's port on node 0, gloo/NCCL's ephemeral ports), which authenticate nobody and listen on every interface (docs/multihost.md, 'Addresses and ports'). False = each node prints a warning saying so at start.",
    )
    max_crashes: int = Field(
        5,
        ge=1,
        description="`make run` stops the run, showing the learner's last traceback, once the learner has crashed this many times within `crash_window_s` (instead of restarting it forever).",
    )
    crash_window_s: float = Field(
        600.0, gt=0, description="The window of `max_crashes`, in seconds."
    )
    commit_log: bool = Field(
        False,
        description="Append the group ids of every acked (committed) batch, with the step that covers them, to <run.dir>/learner_commits.jsonl (audit; the chaos harness checks exactly-once training against it).",
    )


class SupervisedConfig(Section):
    """`streamrl sft` and `streamrl dpo`: the dataset and the loss of a supervised run on the learner (no actors, no Redis)."""

    path: str | None = Field(
        None,
        description="JSONL dataset, one example a line. sft: `messages` (a chat, the loss on the assistant turns only), `prompt` + `completion` (the loss on the completion and an end-of-sequence token), or `text` (TRL's language-modelling rows: the loss on every token and an end-of-sequence token). dpo: `chosen` + `rejected`, either strings after a `prompt` (string or messages) or whole chats whose last assistant turn is the response (TRL's and RL2's formats). Required by both commands.",
    )
    epochs: int = Field(
        1, ge=1, description="Passes over the dataset (`run.max_steps` may end the run sooner)."
    )
    batch_size: int = Field(
        64, ge=1, description="Examples (sft) or pairs (dpo) per optimizer step, across all ranks."
    )
    shuffle: bool = Field(
        True,
        description="Draw each epoch's order from `run.seed` and the epoch (False: file order).",
    )
    max_length: int = Field(
        2048,
        ge=2,
        description="Tokens an example (prompt + response) may hold; a longer one is cut from the right.",
    )
    beta: float = Field(0.1, gt=0, description="dpo: beta of the sigmoid loss, tau of IPO.")
    loss: Literal["sigmoid", "ipo"] = Field(
        "sigmoid",
        description="dpo: sigmoid = DPO's -log sigmoid(beta x margin) over summed log-prob ratios; ipo = (margin of per-token mean log-prob ratios - 1/(2 beta))^2 (TRL's loss_type of the same name).",
    )
    save_optimizer: bool = Field(
        False,
        description="Write the AdamW state next to the exported policy (`optimizer.pt`), so that an RL run with `learner.init_optimizer: auto` continues its moments (the demos' warm starts do).",
    )
