"""actors: processes that generate completions, score them and publish scored groups.

Owns one actor's loop (``loop``): admit -> roll out -> score -> publish, each step a module:

- ``admit``: admission leases and the next prompt, from the run's shared cursor (``prompt_data``);
- ``sources``: what is rolled out, chosen once from the config: dataset prompts, an
  environment's multi-turn trajectories (``environment``, ``trajectory``) or agents' calls
  through the OpenAI API the actor serves (``openai_server``, ``agent_recorder``);
- ``engines``: how tokens are generated, by name (``hf`` everywhere, ``vllm`` on GPUs);
- ``scoring``: reward functions in worker processes (``rewards``, with the code sandbox
  ``sandbox``) and the reference policy's log-probs (``reference``);
- ``publish``: one stream entry per group (``group``: a group in flight).

Also the start's input checks (``inputs``) and functions a config names (``plugins``),
held-out evaluation (``evaluation``) and the process entry point (``__main__``); metrics are
defined once in ``metrics``.

Talks to: Redis through ``broker`` (stream, admission, heartbeats) and the learner's weights
through ``weightsync`` (a subscriber, or announcements an engine follows). May import:
``configs``, ``broker``, ``weightsync``, ``policy``, ``runtime``. Must not import ``learner``.
"""
