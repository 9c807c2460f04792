"""Health of a running job: ``monitor`` (heartbeats, hang watchdog, stragglers, collective timeouts), ``guard``
(non-finite / spiking steps), ``events`` (the run folder's event log and exit records), ``signals`` (SIGTERM).

May import config, errors and utils; nothing from dist, train, checkpoint or launch.
"""

from disttrain.errors import HealthError
from disttrain.health.events import log_event, record_exit, restart_event
from disttrain.health.guard import StepGuard
from disttrain.health.monitor import HealthMonitor, set_collective_timeout
from disttrain.health.signals import install_stop_signals

__all__ = [
    "HealthError",
    "HealthMonitor",
    "StepGuard",
    "install_stop_signals",
    "log_event",
    "record_exit",
    "restart_event",
    "set_collective_timeout",
]
