"""Example tasks shipped with streamrl, outside its core.

``streamrl.examples.reverse_digits`` is the CPU demo (``configs/demo_cpu.yaml``): an
importable package, because the preset names its policy builder, dataset writer and
rewards as ``module:function``. The other folders here (``copy_task``, ``gsm8k``) are
plain folders a config loads by path, as a user's own task would be.
"""
