"""Metric identity shared by the worker (which publishes) and the stack (which scales
and alarms on it), so that the two cannot drift apart."""

DEFAULT_NAMESPACE = "WsFleet"
DIMENSION_SERVICE_NAME = "ServiceName"
# Not a dimension: each metrics line names its worker (the ECS task id) in this member, a
# property Logs Insights reads (the dashboard's per-worker line), so that the number of
# metrics does not grow with the workers.
DIMENSION_WORKER_ID = "WorkerId"

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
# Frames not stored as sent (wsfleet.stream.Problem): skipped (no usable seq), stored as a
# skip marker, or stored escaped (a lone surrogate).
MALFORMED_FRAMES = "MalformedFrames"
# The worker's event-loop lag, 99th percentile of the last two minutes of probes (ms).
LOOP_LAG_P99 = "LoopLagP99"
# The longest the worker's event loop was held since its previous publish (ms): the
# largest lag of any probe in the interval. One stall the p99 hides (a huge frame parsed
# on the loop, a blocking call) shows here; past a second, every socket of the worker
# waits, and near the heartbeat its session misses a renewal.
EVENT_LOOP_LAG = "EventLoopLagMs"
# Receive loops that had to wait because the worker's writer was at its pending cap.
BACKPRESSURE_WAITS = "BackpressureWaits"
# Connections the fleet's reachability sweep found that no worker would ever take (free
# but in no FREE# partition, or attached to a session out of the watch ring), each one
# repaired as found: any at all is a broken invariant (worker.sweep).
UNREACHABLE_CONNECTIONS = "UnreachableConnections"
# Connections this worker handed off (a SHUTDOWN or SHED release, attached to its session,
# released at its fence) that nobody took in time: freed into FREE# and hinted as free
# (worker.handoffs). A few are a lost hint; many say the handoff hints do not work.
HANDOFFS_UNCLAIMED = "HandoffsUnclaimed"
# Exceptions a long-lived loop met that were neither transient nor handled where they
# arose (worker.supervision): each was logged with its traceback and the loop went on.
LOOP_ERRORS = "LoopErrors"
# Frames neither stored nor stored as a skip marker (the table refused the marker too).
FRAMES_DROPPED = "FramesDropped"
# Skip markers stored (any reason: over_frame_limit, malformed, upstream_gap): seqs whose
# data the users will not get. A gap marker counts once, however many seqs it covers.
SKIPPED_FRAMES = "SkippedFrames"
# Data stored as an S3 object instead of inline (over an item's size), and their bytes.
LARGE_FRAMES = "LargeFrames"
# Handshakes the upstream refused (HTTP 401/403 after the secrets were fetched again,
# another 4xx, a secret that cannot be read, a stored upstream this worker refuses):
# each is followed by a long wait (worker.connection REFUSED_RETRY_S), never a storm.
UPSTREAM_REFUSALS = "UpstreamRefusals"
# Sockets the worker closed because their peer went over a budget (worker.socket_budget:
# budget control_flood, a peer flooding control frames or not reading our answers), each
# followed by the refusal wait and shown in the connection's last_error, which names the budget.
BUDGET_CLOSES = "BudgetCloses"
# Connections whose last connect attempt was refused, at publish time (a gauge: the
# alarm on credentials that stopped working reads it).
REFUSED_CONNECTIONS = "RefusedConnections"
# GetSecretValue calls the worker made (each priced by `wsfleet plan`).
SECRET_FETCHES = "SecretFetches"
# Seqs stored as upstream_gap markers: what the upstream went past (resume none after a
# takeover or reconnect, or seqs it never produced). A marker counts its whole range.
MISSED_SEQS = "MissedSeqs"
# SINK kinesis: records sent again after a PutRecords that stored only some of them: the
# refused ones and, so that a connection's last delivery of each seq stays in seq order,
# every later record of the same connection in that request (those are duplicates on
# the stream, same fence). Counted per record sent again.
RECORDS_RESENT = "RecordsResent"
# SINK kinesis: records the stream refused for throughput (ProvisionedThroughputExceeded
# or KMS throttling), each sent again after a backoff: a shard or the account is at
# its limit (the stack's alarm reads the stream's own WriteProvisionedThroughputExceeded).
RECORDS_THROTTLED = "RecordsThrottled"

# The reference consumer (wsfleet.consumer), in its Lambda logs as CloudWatch embedded
# metrics (no request of its own), dimension ServiceName = CONSUMER_SERVICE_NAME:
CONSUMER_SERVICE_NAME = "wsfleet-consumer"
# Frames delivered downstream (a marker counts once).
FRAMES_DELIVERED = "FramesDelivered"
# Records dropped as delivered already: a takeover's replay or a resend after a partial failure.
DUPLICATES_DROPPED = "DuplicatesDropped"
# Records dropped for a fence below the highest seen: a stale owner's late request.
STALE_RECORDS_DROPPED = "StaleRecordsDropped"
# Records that are not wsfleet records (logged, skipped: never a batch failure).
BAD_RECORDS = "BadRecords"
# Connections whose delivery failed in a batch (S3 or DynamoDB): the shard goes again from there.
DELIVERIES_FAILED = "DeliveriesFailed"
# Seqs given up as never to arrive: holes left past the state's range limit (each logged
# as gap_abandoned). Lost downstream unless a record of them was hostile or lost: alarm-worthy.
SEQS_ABANDONED = "SeqsAbandoned"
CONSUMER_METRICS = (FRAMES_DELIVERED, DUPLICATES_DROPPED, STALE_RECORDS_DROPPED, BAD_RECORDS, DELIVERIES_FAILED, SEQS_ABANDONED)

# Connections quarantined by the crash-loop breaker (wsfleet.crash_loop), counted by the
# worker whose strike quarantined each (one write lands it: one count). Any at all: a
# connection took down its owners QUARANTINE_AFTER times in a row and waits for a START.
QUARANTINED_CONNECTIONS = "QuarantinedConnections"
# TRACING=otel: span exports that failed (wsfleet.tracing._otel), published only when
# not zero (a metric that exists only while tracing is broken costs nothing otherwise).
TRACE_EXPORT_FAILURES = "TraceExportFailures"

# Frames dropped by their upstream's ignore rules (heartbeats, acks): not stored, not
# malformed, no marker.
IGNORED_FRAMES = "IgnoredFrames"
# Sockets closed and opened again because their feed sent no frame for the upstream's
# max_silence_seconds while the socket stayed open (worker.feed_health).
SILENCE_RECONNECTS = "SilenceReconnects"
# Gauges at publish time (worker.feed_health): held connections that have accepted no
# frame for longer than their max_silence_seconds, across reconnects; and those whose
# frames over the last 5 minutes were mostly malformed (a feed whose format changed: alarm).
SILENT_CONNECTIONS = "SilentConnections"
MALFORMED_CONNECTIONS = "MalformedConnections"

COUNTERS = (
    LEASES_ACQUIRED,
    LEASES_LOST,
    LEASES_RELEASED,
    ORPHANS_RECOVERED,
    RECONNECTS,
    MESSAGES_STORED,
    MALFORMED_FRAMES,
    BACKPRESSURE_WAITS,
    UNREACHABLE_CONNECTIONS,
    HANDOFFS_UNCLAIMED,
    LOOP_ERRORS,
    FRAMES_DROPPED,
    SKIPPED_FRAMES,
    LARGE_FRAMES,
    UPSTREAM_REFUSALS,
    BUDGET_CLOSES,
    SECRET_FETCHES,
    MISSED_SEQS,
    RECORDS_RESENT,
    RECORDS_THROTTLED,
    QUARANTINED_CONNECTIONS,
    IGNORED_FRAMES,
    SILENCE_RECONNECTS,
)
