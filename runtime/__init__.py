"""runtime: what every streamrl process does around its own job.

Owns the Prometheus endpoint a process serves and registers as a scrape target, with the build it
reports (``metrics_endpoint``), the append-only JSONL logs it keeps in its run directory: step
rows, evaluations and the delivery audit (``jsonl_log``), the log of where its start-up time went
(``startup_phases``), the CPU cores it pins itself to once started (``cpu_pinning``) and its
threads' stacks on request (``stacks``). The
metrics themselves are defined by each subsystem (its ``metrics``).

Talks to: Redis through ``broker`` (the scrape-target registration only) and the run directory.
May import: ``configs``, ``broker``. Must not import ``actors``, ``learner``, ``weightsync``,
``policy`` or ``launch``.
"""
