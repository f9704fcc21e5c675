"""launch: `make run` — supervisor, live view, scrape config and dashboards.

Owns starting and stopping a whole run (``supervisor``; ``run``, which is ``streamrl.run``
and ``streamrl run``), what a run does with an existing run directory (``rundir``: resume,
start, refuse; never delete what it did not write), the actors of one host of a run on several
(``host``: ``streamrl actors``), the learner as a command of its own (``learner``: ``streamrl
learner``, which checks the policy is there first), which GPUs and CPU cores each of
its processes gets (``placement``), the terminal view and end-of-run summary (``view``,
``status``), a run's plots (``plot``), live scaling (``scale``, whose signed commands are
``control``'s) and the
Prometheus side (``scrape``, ``dashboard``), the ``streamrl`` console script
(``cli``) and the decoded view of a run's Redis (``inspect``). May import every streamrl package;
none of them imports it.
"""
