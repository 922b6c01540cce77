"""Worker metrics: what is published, under the identity the stack scales on."""

import asyncio
import io
import json

import pytest

from sim import emf as sim_emf

from wsfleet import metrics_names as names
from wsfleet.aws import Aws
from wsfleet.config import WorkerConfig
from wsfleet.logs import JsonLogger
from wsfleet.metrics import EMF_MAX_METRICS, Counters, emf, metric_data
from wsfleet.store import ConnectionsStore, SessionsStore
from wsfleet.worker.lifecycle import Worker
from wsfleet.worker.report import LoopLag


def test_counter_deltas_report_only_what_changed_since_the_last_publish():
    c = Counters()
    c.add(names.MESSAGES_STORED, 5)
    assert c.take_deltas()[names.MESSAGES_STORED] == 5
    c.add(names.MESSAGES_STORED, 2)
    assert c.take_deltas()[names.MESSAGES_STORED] == 2
    assert c.total(names.MESSAGES_STORED) == 7


def test_an_unknown_counter_is_refused():
    with pytest.raises(KeyError):
        Counters().add("Typo")


def test_metric_data_carries_the_gauge_and_counters_with_the_service_dimension():
    data = metric_data(service_name="svc", active_connections=3, deltas={names.RECONNECTS: 1})
    assert data[0] == {
        "MetricName": "ActiveConnections",
        "Dimensions": [{"Name": "ServiceName", "Value": "svc"}],
        "Value": 3.0,
        "Unit": "Count",
    }
    assert {d["MetricName"] for d in data} == {"ActiveConnections", "Reconnects"}
    with_unowned = metric_data(service_name="svc", active_connections=0, deltas={}, unowned_connections=2)
    assert {d["MetricName"]: d["Value"] for d in with_unowned} == {"ActiveConnections": 0.0, "UnownedConnections": 2.0}


def test_every_metric_carries_the_service_dimension_only_so_their_number_does_not_grow_with_workers():
    data = metric_data(service_name="svc", active_connections=3, deltas=dict.fromkeys(names.COUNTERS, 1),
                       unowned_connections=1, loop_lag_p99_ms=1.0, loop_lag_max_ms=2.0, refused_connections=0,
                       trace_export_failures=1)
    assert {tuple(d["Name"] for d in datum["Dimensions"]) for datum in data} == {("ServiceName",)}
    assert len({d["MetricName"] for d in data}) == len(data)  # one of each


def test_an_emf_line_is_what_cloudwatch_extracts_the_same_datapoints_from():
    data = metric_data(service_name="svc", active_connections=3, deltas={names.RECONNECTS: 2}, loop_lag_max_ms=850.0)
    line = emf("WsFleet", data, timestamp_ms=1_800_000_000_000, properties={"WorkerId": "task-1"})
    points = sim_emf.extract(json.loads(json.dumps(line)))  # as written to the log and read back
    assert {(p.name, p.value, p.unit) for p in points} == {
        ("ActiveConnections", 3.0, "Count"), ("Reconnects", 2.0, "Count"), ("EventLoopLagMs", 850.0, "Milliseconds")}
    assert {p.dimensions for p in points} == {(("ServiceName", "svc"),)}
    assert {p.namespace for p in points} == {"WsFleet"} and {p.timestamp_ms for p in points} == {1_800_000_000_000}
    assert line["WorkerId"] == "task-1"  # a property: in the line, not a dimension


@pytest.mark.parametrize(
    "change, why",
    [
        (lambda line: line["_aws"].update(Timestamp="now"), "Timestamp"),
        (lambda line: line.pop("ServiceName"), "dimension 'ServiceName'"),
        (lambda line: line.update(ActiveConnections="3"), "metric ActiveConnections must be a number"),
        (lambda line: line["_aws"]["CloudWatchMetrics"][0]["Metrics"][0].update(Unit="Connections"), "unknown Unit"),
    ],
)
def test_a_line_cloudwatch_would_drop_is_refused_locally(change, why):
    line = emf("WsFleet", metric_data(service_name="svc", active_connections=3, deltas={}), timestamp_ms=1,
               properties={"WorkerId": "w"})
    change(line)
    with pytest.raises(sim_emf.InvalidEmf, match=why):
        sim_emf.extract(line)


def test_emf_refuses_what_the_format_cannot_say():
    data = metric_data(service_name="svc", active_connections=3, deltas={})
    with pytest.raises(ValueError, match="named twice"):
        emf("WsFleet", data, timestamp_ms=1, properties={"ActiveConnections": 1})
    many = [{**data[0], "MetricName": f"M{i}"} for i in range(EMF_MAX_METRICS + 1)]
    with pytest.raises(ValueError, match="at most 100 metrics"):
        emf("WsFleet", many, timestamp_ms=1, properties={})


def test_refused_connections_is_a_gauge_published_when_counted():
    data = metric_data(service_name="svc", active_connections=4, deltas={}, refused_connections=2)
    refused = [d for d in data if d["MetricName"] == names.REFUSED_CONNECTIONS]
    assert refused == [
        {"MetricName": names.REFUSED_CONNECTIONS, "Dimensions": [{"Name": "ServiceName", "Value": "svc"}],
         "Value": 2.0, "Unit": "Count"}
    ]
    assert not [d for d in metric_data(service_name="svc", active_connections=0, deltas={})
                if d["MetricName"] == names.REFUSED_CONNECTIONS]


def test_loop_lag_is_a_millisecond_gauge_published_once_it_has_been_measured():
    data = metric_data(service_name="svc", active_connections=0, deltas={}, loop_lag_p99_ms=12.5)
    assert {
        "MetricName": "LoopLagP99",
        "Dimensions": [{"Name": "ServiceName", "Value": "svc"}],
        "Value": 12.5,
        "Unit": "Milliseconds",
    } in data
    unmeasured = metric_data(service_name="svc", active_connections=0, deltas={}, loop_lag_p99_ms=None)
    assert names.LOOP_LAG_P99 not in {d["MetricName"] for d in unmeasured}


def test_event_loop_lag_is_the_intervals_longest_stall_published_once_per_interval():
    data = metric_data(service_name="svc", active_connections=0, deltas={}, loop_lag_max_ms=850.0)
    assert {
        "MetricName": "EventLoopLagMs",
        "Dimensions": [{"Name": "ServiceName", "Value": "svc"}],
        "Value": 850.0,
        "Unit": "Milliseconds",
    } in data
    assert names.EVENT_LOOP_LAG not in {d["MetricName"] for d in metric_data(service_name="svc", active_connections=0, deltas={})}


def test_the_longest_lag_is_taken_per_interval_and_starts_again_after_each_publish():
    lag = LoopLag()
    assert lag.take_longest() is None  # nothing probed: nothing published
    for ms in (3.0, 120.0, 7.5):
        lag.note(ms)
    assert lag.take_longest() == 120.0
    lag.note(2.0)
    assert lag.take_longest() == 2.0  # the earlier stall belongs to the earlier interval
    assert list(lag.recent) == [3.0, 120.0, 7.5, 2.0]  # the p99's two minutes keep every probe
    assert lag.window_max() == 120.0


def test_the_worker_publishes_its_gauges_as_one_emf_line_naming_itself(emulator, aws_env, ddb):
    cfg = WorkerConfig.from_env({**aws_env, "SERVICE_NAME": "wsfleet-test", "METRICS_NAMESPACE": "WsFleetTest"})
    conns = ConnectionsStore(
        ddb, aws_env["TABLE_NAME"], state_shards=cfg.state_shards, sessions_table_name=aws_env["SESSIONS_TABLE_NAME"]
    )
    for cid in ("a", "b", "c", "e"):
        conns.start(cid, "ws://127.0.0.1:9/x")
    conns.start("d", "ws://127.0.0.1:9/x")
    sessions = SessionsStore(ddb, aws_env["SESSIONS_TABLE_NAME"])
    sessions.open("elsewhere#1", worker_id="elsewhere", lease_ms=60_000, max_connections=10)
    conns.acquire("c", session_id="elsewhere#1", worker_id="elsewhere")  # owned by a live session: not counted
    sessions.open("dead#1", worker_id="dead", lease_ms=60_000, max_connections=10)
    conns.acquire("d", session_id="dead#1", worker_id="dead")  # its session is ended below: counted by its watcher
    sessions.end_own("dead#1", worker_id="dead")
    conns.stop("b", sessions=sessions)  # not STARTED: not counted

    async def publish():
        aws = Aws(cfg, threads=2)
        worker = Worker(cfg, "w1", aws=aws, log=JsonLogger(log))
        assert await worker.keeper.open(asyncio.Event())
        await worker.takeover.watch_once()  # watches elsewhere#1 and dead#1
        worker.takeover.cancel()  # counted while still attached: stop the drain it just spawned
        await worker.balancer.summarize_once()  # the last in the ring: it counts for the fleet, dead#1 included
        for _ in range(200):
            worker.report.lag.note(4.0)  # what the loop probe would have recorded
        worker.report.lag.note(950.0)  # one long stall: the p99 hides it, the interval's longest does not
        # A connection counts as free only once it is still free at the next count: "e"
        # was free at the first and taken before the second, "a" stays free.
        assert await worker.report.count_unowned() == 1  # only "d" (its session ENDED): "a" and "e" just seen
        conns.acquire("e", session_id="elsewhere#1", worker_id="elsewhere")
        await worker.report.publish_metrics_once()
        aws.close()

    log = io.StringIO()
    asyncio.run(publish())
    lines = [json.loads(line) for line in log.getvalue().splitlines()]
    (line,) = [line for line in lines if line.get("event") == "metrics"]
    points = {p.name: p for p in sim_emf.extract(line)}
    assert {p.namespace for p in points.values()} == {"WsFleetTest"}
    assert {p.dimensions for p in points.values()} == {(("ServiceName", "wsfleet-test"),)}
    assert line["WorkerId"] == "w1"  # which worker: a property of the line, never a dimension

    def latest(metric: str) -> float:
        return points[metric].value

    assert latest("ActiveConnections") == 0
    assert latest("LoopLagP99") == 4.0
    assert latest("EventLoopLagMs") == 950.0
    assert latest("UnownedConnections") == 2  # "a", free at both counts, and "d", on an ended session


def test_only_the_last_session_of_the_ring_counts_unowned_connections_for_the_fleet(aws_env, ddb):
    cfg = WorkerConfig.from_env(aws_env)
    sessions = SessionsStore(ddb, aws_env["SESSIONS_TABLE_NAME"])

    async def scenario():
        aws = Aws(cfg, threads=2)
        worker = Worker(cfg, "w1", aws=aws, log=JsonLogger())
        assert await worker.keeper.open(asyncio.Event())
        await worker.takeover.watch_once()
        assert await worker.report.count_unowned() == 0  # alone: it counts
        sessions.open("zz#1", worker_id="zz", lease_ms=60_000, max_connections=10)  # a later session joins
        assert sessions.announce(worker.keeper.session_id)  # as a newcomer tells its watchers
        assert await worker.keeper.renew_once()  # which brings the news
        await worker.takeover.watch_once()
        assert worker.takeover.successors() == ["zz#1"]
        assert await worker.report.count_unowned() is None  # not the last of the ring any more: zz#1 counts
        worker.takeover.cancel()
        aws.close()

    asyncio.run(scenario())


def test_the_plan_prices_metrics_as_log_bytes_and_a_fixed_set_of_metrics_whatever_the_workers():
    from wsfleet.plan import metrics_cost

    line = metrics_cost.full_line()
    assert sim_emf.extract(line)  # the line the plan prices is one CloudWatch extracts
    small, large = metrics_cost.month(10), metrics_cost.month(2_000)
    assert small["metrics"] == large["metrics"] == metrics_cost.metric_count() * metrics_cost.CLOUDWATCH_CUSTOM_METRIC_MONTH
    assert large["logs"] == pytest.approx(small["logs"] * 200)  # only the bytes grow with the workers
    # A line a minute per worker: 2,000 workers x 43,800 lines a month x its bytes at $0.50 a GB.
    lines = 2_000 * 730 * 60
    assert large["log_gb"] == pytest.approx(lines * metrics_cost.line_bytes() / 1e9)
    # Against what PutMetricData cost (two calls a minute per worker, $0.01 per 1,000): $1,752.
    assert large["total"] < 2_000 * 730 * 120 / 1_000 * 0.01 / 10
