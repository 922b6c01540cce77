"""The commands, each ``(args, env) -> exit status``: find the fleet (``locate``),
ask the API or read the tables (``api``, ``views``), print a table or JSON (``render``)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from typing import Any, Mapping

from .. import schema, settings_spec
from ..plan import environments as plan_environments
from ..plan import fleet as plan_fleet
from ..plan import large_frames
from ..plan import limits as plan_limits
from ..plan import model as plan_model
from ..plan import modes as plan_modes
from ..plan import secrets as plan_secrets
from ..plan import sinks as plan_sinks
from ..plan import task_sizes
from ..store import now_ms
from ..stream import MAX_MESSAGE_BYTES
from . import desired, locate, log_lines, plan_chart, reading, render, render_plan, run_report, run_verdicts, timeline, upstream_flags, views, watch
from . import apply as apply_run
from . import records as stream_records
from .api import ApiClient, ApiReply, is_local, region_in_url
from .errors import CliError
from .fleet import FleetReader

DEFAULT_MESSAGES = 20  # what `wsfleet messages` shows without --limit or --follow

# --- through the API ---------------------------------------------------------------------


def _api(args: argparse.Namespace, env: Mapping[str, str]) -> ApiClient:
    session = locate.aws_session(args.region, env)
    url = locate.api_url(args.api, args.stack, args.env, session, env)
    if is_local(url):
        return ApiClient(url)
    return ApiClient(url, credentials=session.get_credentials(), region=region_in_url(url) or session.region_name)


def _reply(args: argparse.Namespace, reply: ApiReply, human: str) -> int:
    if not reply.ok:
        if args.json:
            print(json.dumps({"status": reply.status, "body": reply.body}, indent=2))
        raise CliError(reply.sentence())
    _emit(args, {"status": reply.status, "body": reply.body}, human)
    return 0


def _event_line(reply: ApiReply) -> str:
    body = reply.body
    return f"{body.get('connection_id', '?')}: {body.get('desired_state', '?')} ({body.get('outcome', '?')}), HTTP {reply.status}"


def start(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    upstream = upstream_flags.upstream_of(args)  # before any request: a bad flag sends nothing
    reply = _api(args, env).start(args.connection_id, args.ws_url, upstream)
    return _reply(args, reply, _event_line(reply))


def stop(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    reply = _api(args, env).stop(args.connection_id)
    return _reply(args, reply, _event_line(reply))


def retry(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Run a quarantined connection again: START it with the ws_url and upstream it has
    (GET first), which clears the quarantine (a START of one not quarantined changes nothing)."""
    client = _api(args, env)
    got = client.get(args.connection_id)
    if not got.ok:
        return _reply(args, got, "")
    if got.body.get(schema.DESIRED_STATE) != schema.STARTED:
        raise CliError(f"Connection {args.connection_id} is {got.body.get(schema.DESIRED_STATE)}: START it to run it again.")
    reply = client.start(args.connection_id, got.body[schema.WS_URL], got.body.get(schema.UPSTREAM) or None)
    was = got.body.get(schema.QUARANTINED)
    human = _event_line(reply) + (f"; was quarantined: {was.get('reason')}" if isinstance(was, dict) else "; was not quarantined")
    return _reply(args, reply, human)


def restart(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """STOP the connection, then START it again with the ws_url and upstream it has (GET
    first): its socket is closed and opened anew, resuming from its checkpoint."""
    client = _api(args, env)
    got = client.get(args.connection_id)
    if not got.ok:
        return _reply(args, got, "")
    if got.body.get(schema.DESIRED_STATE) == schema.STARTED:
        stopped = client.stop(args.connection_id)
        if not stopped.ok:
            return _reply(args, stopped, "")
    reply = client.start(args.connection_id, got.body[schema.WS_URL], got.body.get(schema.UPSTREAM) or None)
    return _reply(args, reply, _event_line(reply))


def delete(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    reply = _api(args, env).delete(args.connection_id)
    return _reply(args, reply, f"{args.connection_id}: deleted, HTTP {reply.status}")


def get(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    reply = _api(args, env).get(args.connection_id)
    return _reply(args, reply, render.connection(reply.body, now_ms()))


def messages(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Entries as they come, a line each (JSON Lines with --json), each flushed so that
    a pipe sees it at once; Ctrl-C ends --follow with status 0."""
    client = _api(args, env)

    def show(entry: dict) -> None:
        line = json.dumps(entry, ensure_ascii=False, separators=(",", ":")) if args.json else render.message(entry)
        print(line, flush=True)

    limit = args.limit if args.limit is not None or args.follow else DEFAULT_MESSAGES
    try:
        shown = reading.read(
            client,
            args.connection_id,
            after_seq=args.from_seq - 1,
            limit=limit,
            show=show,
            follow=args.follow,
            interval=args.interval,
            fetch_urls=args.follow_urls,
        )
    except KeyboardInterrupt:
        if not args.follow:
            raise
        return 0
    if not shown and not args.json:
        print(f"no messages stored for {args.connection_id} from seq {args.from_seq}")
    return 0


def apply(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """The file checked whole first (nothing is sent for a file with an error), then
    every entry compared and, unless --dry-run, brought to its desired state."""
    try:
        entries = desired.read(args.file)
    except desired.BadFile as bad:
        for line in bad.errors:
            print(line, file=sys.stderr)
        raise CliError(str(bad)) from None
    client = _api(args, env)
    outcomes = apply_run.apply_all(
        client, entries, dry_run=args.dry_run, progress=apply_run.progress_line(sys.stderr)
    )
    shown = apply_run.result(outcomes, path=args.file, dry_run=args.dry_run)
    _emit(args, shown, apply_run.render(outcomes, path=args.file, dry_run=args.dry_run))
    failed = shown["counts"]["failed"]
    if failed:
        raise CliError(f"{failed} of {len(outcomes)} connections in {args.file} failed (each shown with its line)")
    return 0


# --- from the logs -----------------------------------------------------------------------


def logs(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """The connection's lines from --since, in time order (JSON Lines with --json);
    with --follow, new ones every --interval until Ctrl-C (status 0)."""
    now = dt.datetime.now(dt.timezone.utc).timestamp()
    start_s = 0.0 if args.since is None else now - args.since
    if args.run_dir:
        source = log_lines.RunDirLines(args.run_dir, args.connection_id, start_s=start_s)
    else:
        session = locate.aws_session(args.region, env)
        groups = args.log_group
        if not groups:
            stack = locate.stack_for(locate.SERVICE, args.stack, args.env, env)
            if not stack:
                raise CliError(
                    f"which fleet? Name it once: --env NAME (or {locate.ENV_VARIABLE}=NAME) reads the log groups from "
                    "the stack wsfleet-NAME-service; or give --stack NAME, --log-group NAME, or --run-dir DIR for a local run"
                )
            groups = log_lines.log_groups_of(locate.stack_outputs_of(locate.client(session, "cloudformation", env), stack), stack)
        source = log_lines.CloudWatchLines(
            locate.client(session, "logs", env), groups, args.connection_id, start_ms=int(start_s * 1000)
        )

    def show(record: dict) -> None:
        print(json.dumps(record, ensure_ascii=False, separators=(",", ":")) if args.json else log_lines.text(record), flush=True)

    first = source.read()
    for record in first:
        show(record)
    if not args.follow:
        if not first and not args.json:
            since = "ever" if args.since is None else f"in the last {render.duration(args.since)}"
            print(f"no log lines for {args.connection_id} {since}")
        return 0
    try:
        log_lines.follow(source.read, show, interval=args.interval)
    except KeyboardInterrupt:
        return 0
    return 0


# --- from the messages stream ------------------------------------------------------------


def records(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """The connection's records on the stream from --since, the highest fence per seq,
    in seq order from --from-seq; a line each (JSON Lines with --json)."""
    session = locate.aws_session(args.region, env)
    stack = None if args.stream else locate.stack_for(
        locate.STATEFUL, args.stack, args.env, env, specific=settings_spec.MESSAGES_STREAM_NAME
    )
    outputs = locate.stack_outputs_of(locate.client(session, "cloudformation", env), stack) if stack else None
    stream = stream_records.stream_of(args.stream, outputs, stack, env)
    now = dt.datetime.now(dt.timezone.utc)
    got = stream_records.read(locate.client(session, "kinesis", env), stream, args.connection_id, since_s=args.since, now=now)
    shown = [got.kept[seq] for seq in sorted(got.kept) if seq >= args.from_seq][: args.limit]
    for record in shown:
        line = stream_records.entry(record)
        if args.json:
            print(json.dumps(line, ensure_ascii=False, separators=(",", ":")), flush=True)
        elif record.data_ref is not None:
            print(f"{record.seq}  (large data: {record.data_bytes or 0:,} bytes at {record.data_ref})", flush=True)
        else:
            print(render.message(line), flush=True)
    if not args.json:
        since = "its trim horizon" if args.since is None else f"{render.duration(args.since)} ago"
        print(
            f"{args.connection_id}: {got.records} records on {got.shards} shard(s) of {stream} since {since}; "
            f"{len(shown)} seqs shown, {got.again} deliveries again dropped (the highest fence kept)"
            + (f", {got.bad} records that are not wsfleet records skipped" if got.bad else "")
        )
    return 0


# --- from the tables -------------------------------------------------------------------------


def tables_of(args: argparse.Namespace, env: Mapping[str, str], *needed: str) -> tuple[Any, locate.Tables]:
    """(a DynamoDB client, the fleet's tables): ``--stack``, ``--env``, the variables."""
    session = locate.aws_session(args.region, env)
    stack = locate.stack_for(locate.STATEFUL, args.stack, args.env, env, specific=settings_spec.TABLE_NAME)
    if stack:
        outputs = locate.stack_outputs_of(locate.client(session, "cloudformation", env), stack)
        tables = locate.Tables.from_outputs(outputs, stack, env)
    else:
        tables = locate.Tables.from_env(env)
    tables.need(*needed)
    return locate.client(session, "dynamodb", env), tables


def _reader(args: argparse.Namespace, env: Mapping[str, str], *needed: str) -> FleetReader:
    return FleetReader(*tables_of(args, env, *needed))


def status(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """The fleet once, or with --watch every --interval until Ctrl-C; with --stack, the
    stacks' alarms in ALARM state too."""
    reader = _reader(args, env, "connections", "sessions")
    cloudwatch = locate.client(locate.aws_session(args.region, env), "cloudwatch", env) if args.stack else None

    def view() -> dict:
        got = views.status(reader, now_ms())
        if cloudwatch is not None:
            got["alarms"] = watch.firing(cloudwatch, watch.alarm_prefix(args.stack))
        return got

    if not args.watch:
        got = view()
        _emit(args, got, render.status(got))
        return 0
    first = [view()]  # read before the loop: a fleet that cannot be read is an error, not a line

    def snapshot() -> str:
        got = first.pop() if first else view()
        return json.dumps(got) if args.json else render.status(got)

    return watch.run(snapshot, interval=args.interval, out=sys.stdout, tty=sys.stdout.isatty(), lines=args.json)


def connections(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    reader = _reader(args, env, "connections", "sessions")
    now = now_ms()
    rows = views.connections(reader, now, worker=args.worker, state=args.state)
    if args.worker and not rows and not views.known_worker(reader, args.worker):
        known = ", ".join(views.worker_names(reader)) or "none"
        raise CliError(f"no worker {args.worker!r} in the sessions table (live or in the ring: {known})")
    _emit(args, rows, render.connections(rows, now))
    return 0


# --- computed ---------------------------------------------------------------------------------


# Sizes the plan prices a large frame at: the largest inline item, and two over any item.
LARGE_EXAMPLE_SIZES = (MAX_MESSAGE_BYTES, 1 << 20, 32 << 20)


def plan(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    if args.region and args.region != plan_model.PRICES_REGION:
        raise CliError(
            f"--region {args.region}: the plan carries {plan_model.PRICES_REGION}'s list prices only; leave --region out "
            "and scale its dollars by your region's prices"
        )
    # The environment's file: --env, else WSFLEET_ENV, else dev.
    args.env = args.env or env.get(locate.ENV_VARIABLE, "").strip() or "dev"
    try:
        settings = plan_environments.load(args.env, env)
    except (plan_environments.EnvironmentNotFound, plan_environments.BadEnvironment) as error:
        raise CliError(f"--env {args.env}: {error}") from None
    per_worker = args.per_worker or settings["target_per_worker"]
    if per_worker > settings["max_per_worker"]:
        raise CliError(
            f"--per-worker {per_worker} is above {args.env}'s MAX_CONNECTIONS ({settings['max_per_worker']})"
        )
    measured = plan_model.load_measured()
    retention_days = settings["message_ttl_days"]
    result = plan_fleet.plan(
        measured,
        connections=args.connections,
        per_worker=per_worker,
        rate=args.rate,
        shards=settings["shards"],
        checkpoint_s=settings["checkpoint_s"],
    )
    result["env"] = args.env
    # The limits in every scenario, the first hit and the month's $ (wsfleet.plan.limits): at the top
    # level, as `--json` promises {"workers", "limits", "first_limit", "usd_per_month"}.
    checked = plan_limits.evaluate(
        measured, settings, connections=args.connections, rate=args.rate, per_worker=per_worker,
        frame_bytes=args.frame_bytes, upstream_addresses=args.upstream_addresses, quotas=dict(args.quota),
    )
    for key in ("workers", "limits", "first_limit", "first_limit_scenario", "first_limit_fix", "exceeded", "cells",
                "usd_per_month", "deploy_minutes", "fill_seconds", "quotas", "task"):
        result[key] = checked[key]
    result["month"] = checked["month"]
    if args.large_rate:
        result["large_frames"] = large_frames.large_frames_month(
            connections=args.connections,
            rate=args.large_rate,
            size_bytes=args.large_bytes,
            prices=measured.prices,
            retention_days=retention_days,
        )
    if args.refused > args.connections:
        raise CliError(f"--refused {args.refused} is more than --connections {args.connections}")
    if args.secrets:
        result["secrets"] = plan_secrets.secrets_month(
            connections=args.connections,
            per_worker=per_worker,
            secrets=args.secrets,
            reconnects_per_hour=args.reconnects,
            refused=args.refused,
        )
    consumer = None if args.no_consumer else plan_sinks.Consumer(batch_size=args.consumer_batch, window_s=args.consumer_window)
    result["sinks"] = plan_sinks.sinks(
        measured,
        connections=args.connections,
        per_worker=per_worker,
        rate=args.rate,
        shards=settings["shards"],
        checkpoint_s=settings["checkpoint_s"],
        ttl_days=retention_days,
        frame_bytes=args.frame_bytes,
        retention_hours=settings["stream_retention_hours"] if args.stream_retention_hours is None else args.stream_retention_hours,
        flush_ms=settings["flush_ms"] if args.flush_ms is None else args.flush_ms,
        consumer=consumer,
        gzip_ratio=args.gzip_ratio,
    )
    if args.rate:
        # Every mode of keeping the messages, the environment's and the cheapest; the
        # fleet's one monthly total with the messages as the environment deploys them.
        wru_price = measured.prices["dynamodb_wru_per_million"]
        result["modes"] = plan_modes.compare(result["sinks"], settings, wru_per_million=wru_price,
                                             table_quota=result["quotas"]["table_units"])
        on_demand_writes = args.connections * args.rate * measured.message_wru * plan_modes.MONTH_S / 1e6 * wru_price
        result["month"] = plan_modes.whole_month(result["month"], result["modes"]["deployed"],
                                                 on_demand_message_writes=on_demand_writes)
        result["usd_per_month"] = result["month"]["total"]
    if args.task_sizes:
        result["task_sizes"] = task_sizes.choose(
            measured, settings, connections=args.connections, rate=args.rate, max_frame_bytes=settings["max_frame_bytes"]
        )
    result["large_frame_cost"] = [
        large_frames.large_frame_cost(size, prices=measured.prices, retention_days=retention_days)
        for size in sorted({*LARGE_EXAMPLE_SIZES, args.large_bytes})
    ]
    _emit(args, result, render_plan.plan(result))
    if args.chart:
        figures = plan_chart.series(lambda n: plan_limits.evaluate(
            measured, settings, connections=n, rate=args.rate, per_worker=per_worker, frame_bytes=args.frame_bytes,
            upstream_addresses=args.upstream_addresses, quotas=dict(args.quota),
        ))
        title = f"wsfleet plan, {args.env}: {per_worker} connections per worker, {args.rate:g} messages/s each"
        _write(args.chart, plan_chart.chart(figures, title=title, asked=args.connections))
        if not args.json:
            print(f"chart: {args.chart}")
    return 0


# --- from a run's logs ---------------------------------------------------------------------------


def report(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """One HTML file of the run in RUN_DIR, from its logs (and its report.json); prints its path."""
    try:
        path = run_report.write(args.run_dir, args.out, max_lanes=args.max_lanes)
    except (timeline.NoEvents, run_verdicts.BadReport) as error:
        raise CliError(str(error)) from None
    except OSError as error:
        raise CliError(f"cannot write the report: {error.strerror or error}: {error.filename}") from None
    print(path)
    return 0


def _write(path: str, text: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as error:
        raise CliError(f"cannot write {path}: {error.strerror or error}") from None


def _emit(args: argparse.Namespace, value: Any, human: str) -> None:
    print(json.dumps(value, indent=2) if args.json else human)
