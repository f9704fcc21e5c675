"""Example tasks shipped with streamrl, outside its core.

``streamrl.examples.reverse_digits`` is the CPU demo (``configs/demo_cpu.yaml``) and
``streamrl.examples.longtail_copy`` the long-tail task (``configs/longtail_cpu.yaml``):
importable packages, because the presets name their policy builders, dataset writers and
rewards as ``module:function``. The other folders here (``copy_task``, ``gsm8k``) are
plain folders a config loads by path, as a user's own task would be.
"""
