"""The memory plan per strategy and ``auto``: profile a model on the meta device, estimate bytes per rank,
render the table, and measure the plan against real ranks.

``profile`` / ``estimate`` / ``render`` are pure arithmetic over a model: they import config, errors, utils,
build and dist. ``measure`` starts workers and runs training steps, so it sits above ``launch`` and ``train``.
"""
