"""The operators' CLI, ``wsfleet``: START, STOP, GET, DELETE and the stored messages through
the API, and the fleet as the tables record it (workers, ownership, checkpoints).

Two ways in, as the fleet has them. ``start``, ``stop``, ``retry``, ``restart``, ``delete``,
``get`` and ``messages`` go through the API like any caller (``api``, ``reading``).
``apply`` brings many connections to a file's desired state through the same API
(``desired``, ``apply``). ``status`` and ``connections`` only read the tables (``fleet``,
``views``), found through the environment named once, a stack's outputs or the worker's
variables (``locate``); they never write. ``drain`` finds a worker's session the same way
and writes one attribute of it, conditional on it being LIVE (``drain``). ``records`` reads the messages stream
(``records``) where the fleet's SINK has kinesis; ``logs`` a connection's log lines
(``log_lines``); ``completion`` prints a shell script written from this parser. Here: the
command line and the one sentence an operator sees when something fails.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Mapping, Sequence

from botocore.exceptions import BotoCoreError, ClientError

from .. import __version__, schema, settings_spec
from ..plan.sinks import DEFAULT_FRAME_BYTES, Consumer
from ..plan.firehose import GZIP_RATIO as FIREHOSE_GZIP_RATIO
from ..store import TransientError
from . import apply as apply_mod
from . import commands, completion, drain, render, run_report, upstream_flags
from .arguments import _count, _flush_ms, _per_hour, _positive, _quota, _rate, _ratio, _retention_hours, _seconds, _seq, _since
from .errors import CliError, aws_sentence

PROG = "wsfleet"


def _one_connection(subcommands: Any, name: str, api: argparse.ArgumentParser, run: Any, **texts: str) -> None:
    """A command of one connection through the API: ``wsfleet NAME CONNECTION_ID``."""
    command = subcommands.add_parser(name, parents=[api], **texts)
    command.add_argument("connection_id", metavar="CONNECTION_ID")
    command.set_defaults(run=run)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print JSON on stdout for scripts (--output json)")
    common.add_argument(
        "--output", choices=("text", "json"), default=None, help="text (tables, for people) or json (for scripts) [text]"
    )
    common.add_argument(
        "--region", help="AWS region [AWS_REGION, else the default chain's]; an execute-api URL names its own"
    )
    common.add_argument(
        "--env",
        metavar="NAME",
        help="the environment, named once [WSFLEET_ENV]: the API is the ApiUrl output of its stack wsfleet-NAME-service, "
        "the tables and the stream the outputs of wsfleet-NAME-stateful; plan reads its file environments/NAME.toml "
        "(the directory: WSFLEET_ENVIRONMENTS, else ./environments, else the checkout's) [dev]",
    )

    api = argparse.ArgumentParser(add_help=False, parents=[common])
    where = api.add_mutually_exclusive_group()
    where.add_argument(
        "--api",
        metavar="URL",
        help="the API's base URL: http://127.0.0.1:PORT locally, https://ID.execute-api.REGION.amazonaws.com/v1 "
        "deployed [WSFLEET_API, read after --env and before WSFLEET_ENV]",
    )
    where.add_argument(
        "--stack",
        metavar="NAME",
        help="read the API URL from the ApiUrl output of this service stack (wsfleet-<env>-service; --env names it)",
    )

    tables = argparse.ArgumentParser(add_help=False, parents=[common])
    tables.add_argument(
        "--stack",
        metavar="NAME",
        help="read the table names from the outputs of this stateful stack (wsfleet-<env>-stateful, which --env "
        "names: ConnectionsTableName, SessionsTableName, MessagesTableName); without --stack or --env they come "
        "from TABLE_NAME, SESSIONS_TABLE_NAME and MESSAGES_TABLE_NAME, else from WSFLEET_ENV's stack",
    )

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Operate a wsfleet: START, STOP and GET connections through the API, and read the fleet's state from its tables.",
        epilog=(
            "Name the fleet once: --env NAME or WSFLEET_ENV=NAME (its stacks wsfleet-NAME-service and "
            "wsfleet-NAME-stateful). Requests to a deployed API are signed with SigV4 (execute-api) from the default AWS "
            "credential chain; a loopback API (the local one) is not. Table reads take --env, --stack or the worker's "
            "variables (TABLE_NAME, SESSIONS_TABLE_NAME, MESSAGES_TABLE_NAME, STATE_SHARDS, AWS_REGION, "
            "AWS_ENDPOINT_URL); only drain writes (one attribute of one LIVE session item). "
            "Exit status: 0 done; 1 an error, the API's 4xx/5xx included (one sentence on stderr); 2 bad usage."
        ),
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    subcommands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    start = subcommands.add_parser(
        "start",
        parents=[api],
        help="START a connection (POST /events)",
        description=(
            "START a connection: it is created, or restarted from its checkpoint if STOPPED. A STARTED connection "
            "keeps its ws_url and upstream: STOP it, then START it again, to change them."
        ),
    )
    start.add_argument("connection_id", metavar="CONNECTION_ID")
    start.add_argument("ws_url", metavar="WS_URL", help="ws:// or wss:// URL of the upstream stream")
    upstream_flags.add_flags(start)
    start.set_defaults(run=commands.start)

    _one_connection(
        subcommands, "stop", api, commands.stop,
        help="STOP a connection (POST /events)",
        description="STOP a connection: its owner closes the socket, checkpoints and releases it.",
    )

    _one_connection(
        subcommands, "retry", api, commands.retry,
        help="run a quarantined connection again (GET, then START with its ws_url and upstream)",
        description=(
            "Run a connection the crash-loop breaker quarantined again: START it with the ws_url and upstream it has, "
            "which clears the quarantine and its strikes. A STARTED connection that is not quarantined is left as it is."
        ),
    )

    _one_connection(
        subcommands, "restart", api, commands.restart,
        help="close a connection's socket and open it again (STOP, then START with its ws_url and upstream)",
        description=(
            "STOP the connection, then START it again with the ws_url and upstream it has (read by a GET first): its "
            "owner closes the socket, checkpoints and releases it, and a worker takes it again, resuming from its "
            "checkpoint. A STOPPED connection is STARTED."
        ),
    )

    _one_connection(
        subcommands, "delete", api, commands.delete,
        help="delete a STOPPED connection (DELETE /connections/ID)",
        description=(
            "Delete a STOPPED connection whose owner has released it: its item goes; its stored messages expire "
            "with the environment's message TTL. A STARTED one is refused (STOP it first); a START of the same id "
            "later is a new connection."
        ),
    )

    _one_connection(
        subcommands, "get", api, commands.get,
        help="a connection's public state (GET /connections/ID)",
        description="A connection's public state, as GET /connections/{connection_id} answers it.",
    )

    status = subcommands.add_parser(
        "status",
        parents=[tables],
        help="the fleet at a glance, from the tables",
        description=(
            "The fleet at a glance. Workers: the LIVE, unexpired sessions (a Scan of the sessions table, which holds one "
            "item per worker run): session age, connections active / max as last renewed, heartbeat age, time to expiry. "
            "Connections by desired state, from a paginated Scan of the connections table (it reads every item, so it "
            "costs what the table's size does: an operator's tool, not a monitor). STARTED but unowned: the FREE# "
            "partitions of the by_owner index (free for: since updated_at_ms) and the connections still attached to a "
            "session that expired or ended (unowned for: since that session's expiry), and those a live session handed "
            "off that nobody has taken yet (in the same Scan; 'handed off', for: since the release), each checked "
            "against its item. "
            "Refused by their upstream: STARTED connections whose owner wrote a last_error (from the same Scan). "
            "Oldest checkpoint: the owned STARTED connection (not one handed off) whose updated_at_ms is oldest; "
            "updated_at_ms is the best "
            "proxy the table has (acquire and release write it too, and a connection receiving no frames is not "
            "checkpointed, so an idle one shows its acquisition)."
        ),
    )
    status.add_argument("--watch", action="store_true",
                        help="read again every --interval and redraw in place until Ctrl-C (exit 0); not on a terminal, "
                        "one snapshot after another with no escape codes (--json: one JSON line each)")
    status.add_argument("--interval", type=_seconds, default=5.0, metavar="S", help="seconds between reads with --watch [5]")
    status.set_defaults(run=commands.status)

    connections = subcommands.add_parser(
        "connections",
        parents=[tables],
        help="connections, with owner, fence and checkpoint",
        description=(
            "Connections with their owner, fence token, checkpoint (last_seq) and last update, and their upstream "
            "and last_error when any has one. With --worker, the "
            "connections attached to that worker's sessions (by_owner index queries, then a BatchGetItem); without it, "
            "a paginated Scan of the connections table."
        ),
    )
    connections.add_argument("--worker", metavar="WORKER_ID", help="only those attached to this worker's sessions")
    connections.add_argument("--state", choices=(schema.STARTED, schema.STOPPED), help="only this desired state")
    connections.set_defaults(run=commands.connections)

    drain.add_parser(subcommands, tables)

    messages = subcommands.add_parser(
        "messages",
        parents=[api],
        help="a connection's stored messages (GET /connections/ID/messages)",
        description=(
            "A connection's stored messages in seq order, read page by page through GET "
            "/connections/{connection_id}/messages: one line each, its seq and its data (clipped to "
            f"{render.MESSAGE_WIDTH} characters), or a skip marker with its reason, or large data (kept in S3) "
            "with its size. With --json, one JSON object a line: the API's entries, whole."
        ),
    )
    messages.add_argument("connection_id", metavar="CONNECTION_ID")
    messages.add_argument(
        "--from-seq", type=_seq, default=0, metavar="N", help="first seq to show (after_seq N-1) [0: from the start]"
    )
    messages.add_argument(
        "--limit", type=_positive, metavar="N", help="show at most this many [20; without limit with --follow]"
    )
    messages.add_argument(
        "--follow",
        action="store_true",
        help="at the end of what is stored, keep polling for new messages like tail -f, until Ctrl-C (exit 0)",
    )
    messages.add_argument(
        "--interval", type=_seconds, default=2.0, metavar="S", help="seconds between polls with --follow [2]"
    )
    messages.add_argument(
        "--follow-urls",
        action="store_true",
        help="fetch large data from its data_url and show it as data, after checking its size and SHA-256",
    )
    messages.set_defaults(run=commands.messages)

    records = subcommands.add_parser(
        "records",
        parents=[common],
        help="a connection's frames on the messages stream (SINK with kinesis)",
        description=(
            "A connection's frames as the messages stream holds them, for a fleet whose SINK has kinesis (its read "
            "API has no table to read without dynamodb). Reads only the shards the connection's partition key maps to "
            "(GetRecords from --since to the end of each), keeps the delivery with the highest fence per seq (the "
            "consumer rule: a takeover's replay, a resend and a stale owner's late record are dropped) and shows "
            "them in seq order. Needs kinesis:ListShards, GetShardIterator and GetRecords on the stream (and "
            "kms:Decrypt with a customer-managed key)."
        ),
    )
    records.add_argument("connection_id", metavar="CONNECTION_ID")
    stream_where = records.add_mutually_exclusive_group()
    stream_where.add_argument("--stream", metavar="NAME", help="the stream's name or ARN [MESSAGES_STREAM_NAME]")
    stream_where.add_argument(
        "--stack",
        metavar="NAME",
        help="read the stream from the MessagesStreamName output of this stateful stack (wsfleet-<env>-stateful; "
        "--env names it)",
    )
    records.add_argument(
        "--since", type=_since, default=3600.0, metavar="T",
        help="how far back to read: 90s, 15m, 2h, 7d, or all (the trim horizon) [1h]",
    )
    records.add_argument("--from-seq", type=_seq, default=0, metavar="N", help="first seq to show [0]")
    records.add_argument("--limit", type=_positive, default=20, metavar="N", help="show at most this many seqs [20]")
    records.set_defaults(run=commands.records)

    plan = subcommands.add_parser(
        "plan",
        parents=[common],
        help="workers, DynamoDB load and $ per month for a fleet of a given size",
        description=(
            "Workers needed, DynamoDB requests and capacity units per second per table and per hottest index "
            "partition, $ per month and the limit that binds first, for N connections receiving R messages/s "
            "each; each sink (SINK=dynamodb, kinesis, both) priced side by side, with where its limits bind; with --secrets, the Secrets Manager calls and $ of the connections' secret_headers. Computed "
            "(no AWS calls) from the per-operation counts `make bench` last measured "
            "(wsfleet/measured_ops.json) and the environment's settings."
        ),
    )
    plan.add_argument("--connections", type=_positive, required=True, metavar="N", help="connections to hold")
    plan.add_argument(
        "--rate", "--msgs-per-s", dest="rate", type=_rate, default=0.0, metavar="R",
        help="messages per second per connection [0]",
    )
    plan.add_argument(
        "--quota", type=_quota, action="append", default=[], metavar="NAME=VALUE",
        help="an adjustable quota raised, on top of the environment's own: table_units (per table and index, 40000), "
        "tasks_per_service (5000), task_launches_per_minute (500), eips_per_nat_gateway (2), eips_per_region (5); "
        "repeat for several",
    )
    plan.add_argument(
        "--upstream-addresses", type=_positive, default=1, metavar="K",
        help="distinct upstream IP:port the connections go to, for the NAT's per-destination limit [1: all to one]",
    )
    plan.add_argument(
        "--per-worker",
        type=_positive,
        metavar="M",
        help="connections per worker [the environment's scaling target: dev 70, prod 1690]",
    )
    plan.add_argument(
        "--large-rate",
        type=_rate,
        default=0.0,
        metavar="R",
        help="large frames (stored in S3) per second per connection, on top of --rate [0]",
    )
    plan.add_argument(
        "--large-bytes",
        type=_positive,
        default=1 << 20,
        metavar="B",
        help="size of a large frame's data in bytes [1048576]",
    )
    plan.add_argument(
        "--secrets",
        type=_count,
        default=0,
        metavar="S",
        help="distinct Secrets Manager secrets the connections' secret_headers name, one per connection [0]",
    )
    plan.add_argument(
        "--reconnects",
        type=_per_hour,
        default=1.0,
        metavar="R",
        help="connects per connection per hour: reconnects, takeovers, handoffs [1]",
    )
    plan.add_argument(
        "--refused",
        type=_count,
        default=0,
        metavar="N",
        help="connections whose upstream keeps refusing them (each fetches its secret at every retry) [0]",
    )
    plan.add_argument(
        "--task-sizes",
        action="store_true",
        help="price every Fargate task size a worker could use at --rate, what each holds by CPU and memory, "
        "and pick the cheapest that passes every limit",
    )
    plan.add_argument(
        "--frame-bytes",
        type=_positive,
        default=DEFAULT_FRAME_BYTES,
        metavar="B",
        help=f"a frame's data in bytes (compact JSON), to price the sinks side by side [{DEFAULT_FRAME_BYTES}]",
    )
    plan.add_argument(
        "--stream-retention-hours",
        type=_retention_hours,
        metavar="H",
        help="the Kinesis stream's retention, 24 to 8760 hours (beyond 24 is billed) [the environment's stream_retention_hours]",
    )
    plan.add_argument(
        "--consumer-batch",
        type=_positive,
        default=Consumer.batch_size,
        metavar="N",
        help=f"the reference consumer's largest batch of records [{Consumer.batch_size}]",
    )
    plan.add_argument(
        "--consumer-window",
        type=_seconds,
        default=Consumer.window_s,
        metavar="S",
        help=f"the reference consumer's batching window in seconds [{Consumer.window_s:g}]",
    )
    plan.add_argument(
        "--no-consumer", action="store_true", help="price the stream without the reference consumer (your own reader)"
    )
    plan.add_argument(
        "--gzip-ratio", type=_ratio, default=FIREHOSE_GZIP_RATIO, metavar="X",
        help="how many times smaller GZIP makes the delivery stream's objects (SINK=firehose), for their S3 storage "
        f"[{FIREHOSE_GZIP_RATIO:g}: data that does not compress; JSON feeds 7-9, python -m bench sinks measures it]",
    )
    plan.add_argument("--flush-ms", type=_flush_ms, metavar="MS", help="the workers' FLUSH_INTERVAL_MS: a connection's "
                      "frames of one flush share one Kinesis record [the environment's flush_interval_ms]")
    plan.add_argument(
        "--chart", metavar="FILE.svg",
        help="also write an SVG chart of workers, $ per month and each limit's headroom from 1k to 1M connections "
        "(log scale; these settings), the first limit that binds marked",
    )
    plan.set_defaults(run=commands.plan)

    report = subcommands.add_parser(
        "report",
        help="a run's pictures: one HTML file of who held which connection when, from its logs",
        description=(
            "One self-contained HTML file (inline SVG, nothing fetched) of a run: a lane per connection (its owners over "
            "time, one colour per worker, its sockets and the gaps between them, fence changes, warnings), each worker's "
            "load, and, from a report.json beside the logs (make demo and make chaos write one), the faults as bands "
            "and the checks' verdicts. RUN_DIR: a directory of the workers' JSON-lines logs (*.log, *.jsonl, gzipped "
            "too, read recursively), as a local run writes them or as a deployed fleet's log group is exported."
        ),
    )
    report.add_argument("run_dir", metavar="RUN_DIR", help="the run's directory, or a directory of exported worker logs")
    report.add_argument("--out", metavar="FILE.html", help="where to write it [RUN_DIR/report.html]")
    report.add_argument("--max-lanes", type=_positive, default=run_report.MAX_LANES, metavar="N",
                        help=f"draw at most this many connections, the first by id [{run_report.MAX_LANES}]")
    report.set_defaults(run=commands.report)

    apply = subcommands.add_parser(
        "apply",
        parents=[api],
        help="bring many connections to the state a file describes (YAML or JSON), sending only what differs",
        description=(
            "Read the desired state of many connections from FILE (YAML or JSON: a list of entries with "
            "connection_id, ws_url, desired running|stopped and the START's upstream keys, under 'upstream' or "
            "beside it), check it whole (an error names the line and the key; nothing is sent), GET each "
            "connection and send only what differs: START what is unknown or STOPPED, STOP then START a STARTED "
            "one whose ws_url or upstream changed, STOP what is to stop. Applying the same file again sends "
            f"nothing. {apply_mod.CONCURRENCY} connections in flight at once; a failed one is reported with its "
            "line and the API's sentence and the others go on (exit status 1 if any failed)."
        ),
    )
    apply.add_argument("-f", "--file", required=True, metavar="FILE", help="the desired state (.yaml, .yml or .json)")
    apply.add_argument("--dry-run", action="store_true", help="only show what would be sent (GETs only)")
    apply.set_defaults(run=commands.apply)

    logs = subcommands.add_parser(
        "logs",
        parents=[common],
        help="a connection's log lines (CloudWatch Logs, or a local run's files)",
        description=(
            "The log lines of one connection: the JSON lines whose connection_id is CONNECTION_ID, from the "
            "workers' and the router's log groups (FilterLogEvents; the service stack's WorkerLogGroupName and "
            "RouterLogGroupName outputs, found like the API: --stack, --env, WSFLEET_ENV; or --log-group), or "
            "from a local run's directory (--run-dir: its *.log files, as make demo writes them), in time order."
        ),
    )
    logs.add_argument("connection_id", metavar="CONNECTION_ID")
    where = logs.add_mutually_exclusive_group()
    where.add_argument("--run-dir", metavar="DIR", help="a local run's directory (make demo's .demo/<run>): its log files")
    where.add_argument("--log-group", action="append", metavar="NAME", help="a CloudWatch log group to read (repeat for several)")
    where.add_argument("--stack", metavar="NAME", help="read the log groups from this service stack's outputs")
    logs.add_argument("--since", type=_since, default=600.0, metavar="T",
                      help="how far back: 90s, 15m, 2h, 7d, or all [10m]")
    logs.add_argument("--follow", action="store_true", help="keep reading new lines like tail -f, until Ctrl-C (exit 0)")
    logs.add_argument("--interval", type=_seconds, default=2.0, metavar="S", help="seconds between reads with --follow [2]")
    logs.set_defaults(run=commands.logs)

    shell = subcommands.add_parser(
        "completion",
        help="print a shell completion script (bash or zsh)",
        description="Print a completion script for the shell: eval \"$(wsfleet completion bash)\" in ~/.bashrc, or "
        "the zsh one in ~/.zshrc (after compinit).",
    )
    shell.add_argument("shell", choices=tuple(completion.SHELLS))
    shell.set_defaults(run=_completion)
    return parser


def _completion(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    print(completion.SHELLS[args.shell](build_parser()), end="")
    return 0


def main(argv: Sequence[str] | None = None, *, env: Mapping[str, str] | None = None) -> int:
    """Run one command; returns the exit status. ``env`` stands for ``os.environ``."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:  # --help, or bad usage (argparse has said why)
        return int(exit_.code or 0)
    env = os.environ if env is None else env
    if getattr(args, "output", None) is not None:
        if args.json and args.output == "text":
            print(f"{PROG}: --json and --output text disagree: give one.", file=sys.stderr)
            return 2
        args.json = args.output == "json"
    try:
        return args.run(args, env)
    except CliError as error:
        sentence = str(error)
    except (BotoCoreError, ClientError, TransientError, settings_spec.ConfigError) as error:
        sentence = aws_sentence(error)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `wsfleet connections | head`: the reader is gone; keep the final flush quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as error:  # noqa: BLE001 - an operator sees a sentence, never a traceback
        sentence = f"unexpected {type(error).__name__}: {error}"
    print(f"{PROG}: {sentence.rstrip('.')}.", file=sys.stderr)
    return 1
