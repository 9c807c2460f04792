"""Helpers shared by the tests and the benchmarks, none of them used by a normal run: fault injection
(:mod:`~disttrain.testing.faults`, installed by a worker entry only when ``DISTTRAIN_FAULT`` is set), free ports
(:mod:`~disttrain.testing.ports`), launching a script on N ranks and collecting their results
(:mod:`~disttrain.testing.launch`), tiny models, configs and data (:mod:`~disttrain.testing.tiny`), and two hosts
on one machine (:mod:`~disttrain.testing.netns`)."""
