"""Example tasks shipped with streamrl, outside its core.

``streamrl.examples.reverse_digits`` is the CPU demo (``configs/demo_cpu.yaml``) and
``streamrl.examples.longtail_copy`` the long-tail task (``configs/longtail_cpu.yaml``):
importable packages, because the presets name their rewards as ``module:function``;
``assets_cli`` is ``streamrl example``, the one command that makes an example's policy and
data (no config key builds them). The other folder here (``copy_task``) is a
plain folder a config loads by path, as a user's own task would be (GSM8K needs none: its
reward is the built-in ``gsm8k``).
"""
