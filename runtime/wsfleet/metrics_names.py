"""Metric identity shared by the worker (which publishes) and the stack (which scales
and alarms on it), so that the two cannot drift apart."""

DEFAULT_NAMESPACE = "WsFleet"
DIMENSION_SERVICE_NAME = "ServiceName"

ACTIVE_CONNECTIONS = "ActiveConnections"
# STARTED connections with no live lease, as this worker counted them at publish time:
# the alarm on connections left unowned past the failover bound reads it.
UNOWNED_CONNECTIONS = "UnownedConnections"
LEASES_ACQUIRED = "LeasesAcquired"
LEASES_LOST = "LeasesLost"
LEASES_RELEASED = "LeasesReleased"
ORPHANS_RECOVERED = "OrphansRecovered"
RECONNECTS = "Reconnects"
MESSAGES_STORED = "MessagesStored"
MALFORMED_FRAMES = "MalformedFrames"
# Receive loops that had to wait because the worker's writer was at its pending cap.
BACKPRESSURE_WAITS = "BackpressureWaits"

COUNTERS = (
    LEASES_ACQUIRED,
    LEASES_LOST,
    LEASES_RELEASED,
    ORPHANS_RECOVERED,
    RECONNECTS,
    MESSAGES_STORED,
    MALFORMED_FRAMES,
    BACKPRESSURE_WAITS,
)
