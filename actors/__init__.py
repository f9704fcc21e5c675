"""actors: processes that generate completions, score them and publish scored groups.

Owns the generation engines (``engines``: hf everywhere, vllm on GPUs), the
prompt source shared through a Redis cursor (``prompts``), reward functions and
the code-execution sandbox (``rewards``, ``sandbox``), functions a config names
(``plugins``), the inputs' build hooks (``inputs``), multi-turn environments and their
token-in/token-out trajectories (``environment``, ``trajectory``), the OpenAI API served to agent
programs and the recording of their calls (``openai_server``, ``agent_recorder``), the actor loop
(``loop``) and its process entry point (``__main__``); metrics are defined once in ``metrics``.

Talks to: Redis through ``broker`` (stream, admission, heartbeats) and the
learner's weights through ``weightsync`` subscribers. May import: ``configs``,
``broker``, ``weightsync``. Must not import ``learner``.
"""
