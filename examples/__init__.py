"""Example tasks shipped with streamrl, outside its core.

``streamrl.examples.reverse_digits`` is the CPU demo (``configs/demo_cpu.yaml``) and
``streamrl.examples.longtail_copy`` the long-tail task (``configs/longtail_cpu.yaml``):
importable packages, because the presets name their policy builders, dataset writers and
rewards as ``module:function``; ``assets_cli`` is the command line their ``__main__`` share
(build the policy and dataset). The other folder here (``copy_task``) is a
plain folder a config loads by path, as a user's own task would be (GSM8K needs none: its
reward is the built-in ``gsm8k``).
"""
