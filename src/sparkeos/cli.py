"""The `sparkeos` command line."""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import sys
from pathlib import Path

from . import client_settings
from .broker.core import BrokerConfig
from .stack import serve


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    try:
        number = int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"port in {value!r} is not a number") from None
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"port in {value!r} is out of range")
    return host.strip("[]"), number


def _bootstrap_servers(value: str) -> str:
    """A Kafka bootstrap list: HOST:PORT entries separated by commas, each port above 0."""
    entries = [entry.strip() for entry in value.split(",")]
    for entry in entries:
        if _host_port(entry)[1] == 0:
            raise argparse.ArgumentTypeError(f"port in {entry!r} must be above 0")
    return ",".join(entries)


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return number


def _listeners(value: str) -> list:
    from .broker.listeners import ListenerError, parse_listeners

    try:
        return parse_listeners(value)
    except ListenerError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _sasl_mechanisms(value: str) -> tuple[str, ...]:
    from .broker.sasl import MECHANISMS

    mechanisms = tuple(m.strip() for m in value.split(",") if m.strip())
    unknown = [m for m in mechanisms if m not in MECHANISMS]
    if unknown or not mechanisms:
        raise argparse.ArgumentTypeError(f"unsupported SASL mechanism {', '.join(unknown) or '(none)'}; the broker "
                                         f"has {', '.join(MECHANISMS)}")
    return mechanisms


def _principals(value: str) -> tuple[str, ...]:
    principals = tuple(p.strip() for p in value.split(";") if p.strip())
    for principal in principals:
        if ":" not in principal:
            raise argparse.ArgumentTypeError(f"super user {principal!r} is not TYPE:NAME, such as User:admin")
    return principals


def _readable_file(value: str) -> Path:
    path = Path(value)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such file: {value}")
    return path


def _add_broker_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("broker", help="run the embedded Kafka-protocol broker",
                                 description="Run the embedded Kafka-protocol broker; `sparkeos broker add-user` "
                                             "creates a SASL/SCRAM user in its data directory.")
    actions = parser.add_subparsers(dest="broker_action", metavar="add-user")
    add_user = actions.add_parser("add-user", help="create or replace a user's SCRAM credentials before the broker "
                                                   "starts (kafka-storage format --add-scram)")
    add_user.add_argument("--data-dir", required=True, type=Path, help="the broker's data directory")
    add_user.add_argument("name", help="the user name")
    add_user.add_argument("--password", required=True, help="the user's password")
    add_user.add_argument("--mechanism", action="append", choices=["SCRAM-SHA-256", "SCRAM-SHA-512"],
                          help="the SCRAM mechanism (repeatable; default: both). PLAIN accepts the password too")
    add_user.add_argument("--iterations", type=int, default=4096, help="PBKDF2 iterations (4096 to 16384)")
    parser.add_argument("--data-dir", type=Path, help="where logs and broker state live (required)")
    parser.add_argument("--listeners", type=_listeners, default=None,
                        metavar="PROTOCOL://HOST:PORT,...",
                        help="Kafka's listeners: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL, each on HOST:PORT (port "
                             "0 picks a free one); the first is the bootstrap address. Instead of --listen")
    parser.add_argument("--listen", type=_host_port, default=None,
                        help="HOST:PORT of one PLAINTEXT listener (port 0 picks a free port; default 127.0.0.1:9092)")
    parser.add_argument("--advertised-listener", type=_host_port, default=None,
                        help="HOST:PORT that clients of the first listener are told to connect to (default: its "
                             "address)")
    parser.add_argument("--ssl-certfile", type=_readable_file, help="the broker's certificate chain (PEM), for SSL "
                                                                    "and SASL_SSL listeners (ssl.keystore)")
    parser.add_argument("--ssl-keyfile", type=_readable_file, help="its private key (PEM)")
    parser.add_argument("--sasl-enabled-mechanisms", type=_sasl_mechanisms,
                        default=("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"), metavar="MECHANISM,...",
                        help="of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 (default: all three; sasl.enabled.mechanisms)")
    parser.add_argument("--authorizer", action="store_true",
                        help="enforce ACLs: a request no ACL allows is denied (authorizer.class.name, with "
                             "allow.everyone.if.no.acl.found=false)")
    parser.add_argument("--allow-everyone-if-no-acl-found", action="store_true",
                        help="with --authorizer, a resource no ACL names is open to every principal "
                             "(allow.everyone.if.no.acl.found)")
    parser.add_argument("--super-users", type=_principals, default=(), metavar="User:NAME;...",
                        help="principals the ACLs never deny, separated by ';' (super.users)")
    parser.add_argument("--fsync", choices=["always", "interval"], default="always",
                        help="'always' syncs to disk before acknowledging acks=all; 'interval' every second")
    parser.add_argument("--auto-create-topics", action=argparse.BooleanOptionalAction, default=True,
                        help="create unknown topics on metadata requests (auto.create.topics.enable)")
    parser.add_argument("--num-partitions", type=_positive, default=1,
                        help="partitions of auto-created topics (num.partitions)")
    parser.add_argument("--socket-request-max-bytes", type=_positive, default=100 * 1024 * 1024,
                        help="largest request accepted (socket.request.max.bytes)")
    parser.add_argument("--queued-max-request-bytes", type=int, default=256 * 1024 * 1024,
                        help="request bytes read and not yet handled, over all connections, before reading waits; "
                             "0 or less: unbounded (queued.max.request.bytes)")
    parser.add_argument("--offsets-retention-minutes", type=_positive, default=10080,
                        help="how long committed offsets of empty groups are kept (offsets.retention.minutes)")
    parser.add_argument("--group-initial-rebalance-delay-ms", type=int, default=0,
                        help="wait for more members before the first rebalance of a new group")
    parser.add_argument("--transaction-max-timeout-ms", type=_positive, default=900000,
                        help="largest transaction.timeout.ms a producer may ask for (transaction.max.timeout.ms)")
    parser.add_argument("--transactional-id-expiration-ms", type=_positive, default=604800000,
                        help="forget transactional ids unused this long (transactional.id.expiration.ms)")
    parser.add_argument("--schema-registry", type=_host_port, default=None, metavar="HOST:PORT",
                        help="also serve a Confluent-compatible schema registry there, stored in the _schemas topic")
    parser.add_argument("--log-level", default="WARNING", help="Python logging level for the broker (stderr)")


def add_user(args: argparse.Namespace) -> int:
    from .broker.credentials import CredentialStore, check_iterations, new_credential

    store = CredentialStore(args.data_dir)
    try:
        for mechanism in args.mechanism or ["SCRAM-SHA-256", "SCRAM-SHA-512"]:
            check_iterations(mechanism, args.iterations)
            store.put(args.name, new_credential(mechanism, args.password, args.iterations))
    except ValueError as error:
        print(f"sparkeos broker add-user: {error}", file=sys.stderr)
        return 2
    args.data_dir.mkdir(parents=True, exist_ok=True)
    store.save()
    print(f"user {args.name}: {', '.join(sorted(store.users[args.name]))}")
    return 0


def run_broker(args: argparse.Namespace) -> int:
    if args.broker_action == "add-user":
        return add_user(args)
    if args.data_dir is None:
        print("sparkeos broker: --data-dir is required", file=sys.stderr)
        return 2
    if args.listen is not None and args.listeners is not None:
        print("sparkeos broker: give --listeners or --listen, not both", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    host, port = args.listen or ("127.0.0.1", 9092)
    if args.listeners:
        host, port = args.listeners[0].host, args.listeners[0].port
    advertised_host, advertised_port = args.advertised_listener or (None, None)
    if any(listener.tls for listener in args.listeners or []) and not (args.ssl_certfile and args.ssl_keyfile):
        print("sparkeos broker: an SSL or SASL_SSL listener needs --ssl-certfile and --ssl-keyfile", file=sys.stderr)
        return 2
    config = BrokerConfig(
        data_dir=args.data_dir,
        host=host,
        port=port,
        advertised_host=advertised_host,
        advertised_port=advertised_port,
        listeners=args.listeners or [],
        ssl_certfile=args.ssl_certfile,
        ssl_keyfile=args.ssl_keyfile,
        sasl_enabled_mechanisms=args.sasl_enabled_mechanisms,
        authorizer=args.authorizer,
        super_users=args.super_users,
        allow_everyone_if_no_acl_found=args.allow_everyone_if_no_acl_found,
        fsync=args.fsync,
        auto_create_topics=args.auto_create_topics,
        num_partitions=args.num_partitions,
        max_request_bytes=args.socket_request_max_bytes,
        queued_max_request_bytes=args.queued_max_request_bytes,
        offsets_retention_minutes=args.offsets_retention_minutes,
        group_initial_rebalance_delay_ms=args.group_initial_rebalance_delay_ms,
        transaction_max_timeout_ms=args.transaction_max_timeout_ms,
        transactional_id_expiration_ms=args.transactional_id_expiration_ms,
    )
    return asyncio.run(serve(config, args.schema_registry))


def _add_run_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("run", help="run a job file (YAML) with its restart strategy")
    parser.add_argument("job", help="the job file")
    parser.add_argument("--master", type=_spark_master,
                        help="Spark master: local[N], spark://HOST:PORT, yarn, k8s://https://HOST:PORT "
                             "(default: spark.master of --conf or the job's spark section, $SPARKEOS_MASTER, local[*])")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting, over the job file's spark section (repeatable)")
    parser.add_argument("--metrics-port", type=int, metavar="PORT",
                        help="serve the job's Prometheus metrics on http://HOST:PORT/metrics (docs/metrics.md)")
    parser.add_argument("--available-now", action="store_true",
                        help="process what is in the input now, then stop (Trigger.AvailableNow)")
    parser.add_argument("--status-file", type=Path, help="write the supervisor's status (restarts, state) there")
    parser.add_argument("--log-level", type=_log_level, default=None,
                        help="DEBUG, INFO, WARNING or ERROR: sparkeos's log lines and its Kafka clients' "
                             "(default: $SPARKEOS_LOG_LEVEL, or INFO)")


def _spark_master(value: str) -> str:
    from .jobs.runner import check_master

    try:
        return check_master(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _log_level(value: str) -> str:
    from .jobs.quiet import check_log_level

    try:
        return check_log_level(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_audit_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("audit", help="compare a job's output topic with what the job should have written")
    parser.add_argument("job", help="the job file whose transformation defines the expected output")
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--input", required=True, help="the input topic")
    parser.add_argument("--output", help="the output topic (required for a Kafka sink), the directory of a "
                                          "sparkeos.files sink (default: the job's sink.path), or the table of a "
                                          "sparkeos.postgres sink (default: the job's dbtable)")
    parser.add_argument("--dead-letter", help="the dead-letter topic (default: the job's bad_records.topic)")
    parser.add_argument("--master", type=_spark_master, default="local[*]",
                        help="Spark master of the audit's own session (local[*])")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object on the last line")


def _add_demo_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("demo", help="run the seed's ETL job end to end on the embedded broker, then audit it")
    parser.add_argument("--records", type=_positive, default=200_000, help="input records to produce (200000)")
    parser.add_argument("--data-dir", type=Path,
                        help="keep the broker, checkpoint and logs there (default: a temp dir)")
    parser.add_argument("--crash-every", type=float, metavar="SECONDS",
                        help="kill -9 the Spark driver this often; the restart strategy brings it back")
    parser.add_argument("--event-time", action="store_true",
                        help="20-second windows on event time with a watermark (default: processing time)")
    parser.add_argument("--partitions", type=_positive, default=2, help="partitions of the input topic (2)")
    parser.add_argument("--bootstrap-servers", type=_bootstrap_servers, metavar="HOST:PORT[,...]",
                        help="run on this existing Kafka cluster instead of the embedded broker, in topics and "
                             "groups named sparkeos-demo-<run id>-*, deleted when the output is exact")
    parser.add_argument("--keep-topics", action="store_true",
                        help="with --bootstrap-servers: keep the run's topics and groups after an exact run")
    client_settings.add_arguments(parser)
    parser.add_argument("--json", action="store_true",
                        help="print the final report as one JSON object on the last line")


def _add_chaos_parser(commands: argparse._SubParsersAction) -> None:
    from .chaos.faults import DEFAULT_MASTER, KINDS

    parser = commands.add_parser(
        "chaos", help="run a job under faults in a sandbox, then audit its output for lost and duplicated records",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="faults (KIND=SECONDS sets the mean time between two of them):\n" + "\n".join(
            f"  {kind.name:24} {kind.what} (every {kind.mean_interval_s:.0f} s)" for kind in KINDS.values()))
    parser.add_argument("job", type=Path, help="the job file")
    parser.add_argument("--faults", metavar="KIND[=SECONDS],...",
                        help="the faults to inject (default: every kind that applies to the job); none: the job "
                             "run without faults, its output watched and audited")
    parser.add_argument("--bootstrap-server", metavar="HOST:PORT[,...]",
                        help="run against this Kafka in place of the embedded broker: the run creates topics of its "
                             "own there (it kills no broker it did not start)")
    parser.add_argument("--use-job-endpoints", action="store_true",
                        help="run against the endpoints the job file names (its Kafka, schema registry, PostgreSQL "
                             "server, output directory's place) in place of the sandbox's: a staging environment, or "
                             "production when you mean it. The run uses names of its own there (topics, consumer "
                             "group, transactional ids, table, directory behind a prefix of the run's) and faults "
                             "only the processes and proxies it starts")
    parser.add_argument("--kafka-version", metavar="VERSION",
                        help="run against a node of Apache Kafka VERSION (3.x or 4.x) that the run starts, in place "
                             "of the embedded broker, and faults as its own; needs Java 17, and the jars in the cache "
                             "(fetched from Maven Central with mvn, once, when they are not)")
    parser.add_argument("--sample-input", type=_positive, metavar="RECORDS",
                        help="feed about this many of the last records of the job's own input topic (read from the "
                             "cluster its job file names: read only, no consumer group), over and over, in place of "
                             "generated ones")
    parser.add_argument("--seed", type=int, default=1, help="seed of the input and of the fault schedule (1)")
    parser.add_argument("--rate", type=_positive, default=100, metavar="RECORDS",
                        help="input records fed a second (100)")
    parser.add_argument("--duration", type=float, default=120.0, metavar="SECONDS",
                        help="how long to inject faults, from the job's first committed batch, and longer until each "
                             "chosen kind struck once (120); then input stops and the job catches up")
    parser.add_argument("--partitions", type=_positive, default=2, help="partitions of the input topic (2)")
    parser.add_argument("--master", type=_spark_master, default=DEFAULT_MASTER,
                        help=f"the job's Spark master ({DEFAULT_MASTER}: two cores, each task tried up to 4 times as "
                             "on a cluster)")
    parser.add_argument("--timeout", type=float, default=900.0, metavar="SECONDS",
                        help="give up waiting for the job to catch up after this long in all (900)")
    parser.add_argument("--workdir", type=Path, help="keep the sandbox's files there (default: a temporary "
                                                     "directory, removed afterwards)")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object on the last line")
    parser.add_argument("--report", type=Path, metavar="FILE.html",
                        help="also write the report as one self-contained HTML page, with the run's timeline")


def run_chaos(args: argparse.Namespace) -> int:
    import json

    from rich.console import Console
    from rich.live import Live

    from .apache_kafka import KafkaStartFailed
    from .chaos import ChaosSettings, FaultError, SandboxError, parse_faults, run_chaos
    from .chaos.input import SampleError
    from .chaos.report import PlainProgress, live_table, print_report
    from .jobs.quiet import quiet_third_party_warnings, setup_logging
    from .jobs.spec import JobError
    from .maven import MavenUnavailable

    quiet_third_party_warnings()
    setup_logging("WARNING")
    try:
        if not args.duration > 0:
            raise FaultError(f"--duration must be more than 0 seconds (got {args.duration})")
        if args.use_job_endpoints and (args.bootstrap_server or args.kafka_version):
            other = ("--bootstrap-server names another" if args.bootstrap_server
                     else "--kafka-version starts another")
            raise FaultError(f"--use-job-endpoints runs on the job's own Kafka; {other}: give one of them")
        if args.kafka_version is not None:
            if args.bootstrap_server:
                raise FaultError("--kafka-version starts a Kafka of the run's own; --bootstrap-server names one: "
                                 "give one of them")
            if not re.fullmatch(r"[34]\.\d+\.\d+", args.kafka_version):
                raise FaultError(f"--kafka-version: Apache Kafka 3.x and 4.x only (got {args.kafka_version!r})")
        from .chaos.sandbox import check_runnable, load_for_run

        spec = load_for_run(args.job, own_kafka=not (args.bootstrap_server or args.use_job_endpoints),
                            job_endpoints=args.use_job_endpoints)
        faults = parse_faults(args.faults, spec, args.master, kafka_named=bool(args.bootstrap_server),
                              job_endpoints=args.use_job_endpoints)
        check_runnable(spec)
    except (JobError, FaultError, SandboxError) as exc:
        print(f"sparkeos chaos: {exc}", file=sys.stderr)
        return 2
    console = Console(stderr=args.json)
    settings = ChaosSettings(faults, args.seed, args.rate, args.duration, args.partitions, args.master,
                             args.timeout, args.workdir, bootstrap_server=args.bootstrap_server,
                             sample_input=args.sample_input, kafka_version=args.kafka_version,
                             job_endpoints=args.use_job_endpoints)
    if args.kafka_version is not None:
        from .apache_kafka import kafka_jars_cached

        if not kafka_jars_cached(args.kafka_version):
            console.print(f"fetching Apache Kafka {args.kafka_version}'s jars from Maven Central into the cache "
                          "(once)", highlight=False)
    try:
        if console.is_terminal:
            with Live(console=console, refresh_per_second=2) as live:
                report = run_chaos(args.job, settings, on_tick=lambda report: live.update(live_table(report)))
        else:
            # A log, not a screen: Live would print its last table only, with the report's first line after it.
            report = run_chaos(args.job, settings, on_tick=PlainProgress(console).show)
    except (SampleError, SandboxError, MavenUnavailable, KafkaStartFailed) as exc:
        # What the clusters named (or sampled) refused, or an Apache Kafka that could not start: before the job ran.
        print(f"sparkeos chaos: {exc}", file=sys.stderr)
        return 2
    print_report(report, console)
    if args.report is not None:
        from .chaos.html import write_report

        write_report(report, args.report)
        console.print(f"report: {args.report}", highlight=False)
    if args.json:
        print(json.dumps(report.to_json()), flush=True)
    return 0 if report.exact else 1


def _add_lag_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("lag", help="how far a streaming query (its checkpoint) or a consumer group is "
                                             "behind its Kafka input")
    subject = parser.add_mutually_exclusive_group(required=True)
    subject.add_argument("--checkpoint", metavar="DIR",
                         help="a streaming query's checkpointLocation (a path, or a file://, s3a://, hdfs:// URI)")
    subject.add_argument("--group", help="a consumer group: its committed offsets")
    parser.add_argument("--bootstrap-servers", required=True, help="the Kafka cluster the input topics are on")
    client_settings.add_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object (one per line with --watch)")
    parser.add_argument("--watch", type=float, metavar="SECONDS", help="print again every SECONDS until Ctrl-C")
    parser.add_argument("--timeout", type=float, default=15.0, metavar="SECONDS",
                        help="how long to wait for the cluster's answers (15)")


def _add_sinks_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("sinks", help="list, or abort, what sinks hold unpublished: decisions, transactions")
    actions = parser.add_subparsers(dest="action", required=True)
    for action, text in (("pending", "list the unfinished decisions and pre-committed transactions of every query"),
                         ("abort", "abort a query's pre-committed transactions that no decision names")):
        sub = actions.add_parser(action, help=text)
        sub.add_argument("target", metavar="JOB_OR_FORMAT",
                         help="a job file (its sink), or a sink format (sparkeos.files, sparkeos.postgres, "
                              "sparkeos.kafka) with -o")
        sub.add_argument("-o", "--option", dest="options", action="append", default=[], metavar="KEY=VALUE",
                         help="the sink's options, as writeStream.option takes them (path=..., url=..., dbtable=..., "
                              "kafka.bootstrap.servers=..., topic=...)")
        sub.add_argument("--json", action="store_true", help="print one JSON object")
        if action == "pending":
            sub.add_argument("--query", help="only this query id")
        else:
            sub.add_argument("--query", required=True, help="the query id whose transactions to abort")
            sub.add_argument("--older-than", default="15m", metavar="DURATION",
                             help="abort only what was pre-committed longer ago than this (default 15m; 0s for all); "
                                  "Kafka tells no transaction's age, and fencing its ids is safe at any age")


def run_sinks(args: argparse.Namespace) -> int:
    import json
    from datetime import UTC, datetime

    from .jobs.spec import JobError, load_job
    from .spark.options import duration_s
    from .spark.pending_work import abort_lines, pending_lines, sink_operator

    try:
        if Path(args.target).is_file() or args.target.endswith((".yaml", ".yml")):
            if args.options:
                raise ValueError("-o applies to a sink format; a job file names its sink's options itself")
            sink_spec = load_job(args.target).sink
            sink_format, options = sink_spec.format, dict(sink_spec.options)
        else:
            sink_format, options = args.target.lower(), dict(_key_value(item) for item in args.options)
        operator = sink_operator(sink_format, options)
        now = datetime.now(UTC)
        if args.action == "pending":
            work = operator.list_pending(args.query)
            print(json.dumps({"pending": [w.to_json(now) for w in work]}) if args.json else
                  "\n".join(pending_lines(work, now)))
            return 0
        older_than = duration_s(args.older_than, "s")
        if older_than is None:
            raise ValueError(f"--older-than must be a duration such as 15m or 0s, not {args.older_than!r}")
        outcome = operator.abort_query(args.query, older_than)
    except (JobError, ValueError, OSError, RuntimeError) as exc:  # Kafka unreachable, a fence that failed
        print(f"sparkeos sinks {args.action}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"query": outcome.query, "fenced": outcome.fenced,
                          **{key: [w.to_json(now) for w in getattr(outcome, key)]
                             for key in ("aborted", "decided", "too_young")}}))
    else:
        print("\n".join(abort_lines(outcome, older_than)))
    return 0


def _key_value(item: str) -> tuple[str, str]:
    key, separator, value = item.partition("=")
    if not separator or not key:
        raise ValueError(f"-o takes KEY=VALUE, not {item!r}")
    return key, value


def run_lag(args: argparse.Namespace) -> int:
    from .lag import run

    return run(args)


def run_demo(args: argparse.Namespace) -> int:
    from .jobs.quiet import quiet_third_party_warnings, setup_logging

    quiet_third_party_warnings()
    setup_logging("WARNING")
    from .demo import run_demo as demo

    for given, name in ((args.keep_topics, "--keep-topics"), (args.command_config, "--command-config"),
                        (args.properties, "-X")):
        if given and not args.bootstrap_servers:
            print(f"sparkeos demo: {name} applies to --bootstrap-servers only", file=sys.stderr)
            return 2
    kafka_config = None
    if args.bootstrap_servers:
        try:
            kafka_config = client_settings.client_config(args.bootstrap_servers, args.command_config, args.properties)
        except client_settings.ClientSettingsError as error:
            print(f"sparkeos demo: {error}", file=sys.stderr)
            return 2
    return demo(args.records, args.data_dir, args.crash_every, args.event_time, args.json, args.partitions,
                bootstrap_servers=args.bootstrap_servers, keep_topics=args.keep_topics, kafka_config=kafka_config)


def run_job(args: argparse.Namespace) -> int:
    from .jobs.console import RunConsole
    from .jobs.quiet import quiet_third_party_warnings, setup_logging
    from .jobs.runner import Supervisor, parse_conf
    from .jobs.spec import JobError

    quiet_third_party_warnings()
    try:
        conf = parse_conf(args.conf)
        supervisor = Supervisor(args.job, args.master, args.available_now, args.status_file, conf=conf,
                                log_level=args.log_level, metrics_port=args.metrics_port)
        supervisor.console = RunConsole(supervisor.spec.name, sys.stdout)
    except (JobError, ValueError) as exc:
        print(f"sparkeos run: {exc}", file=sys.stderr)
        return 2
    setup_logging(supervisor.log_level)
    return supervisor.run()


def run_audit(args: argparse.Namespace) -> int:
    import json

    from .jobs.audit import SESSION_CONFIG, audit, print_report
    from .jobs.spec import JobError, load_job

    try:
        spec = load_job(args.job)
    except JobError as exc:
        print(f"sparkeos audit: {exc}", file=sys.stderr)
        return 2
    import sparkeos.spark

    spark = sparkeos.spark.session("sparkeos-audit", master=args.master, config=SESSION_CONFIG)
    spark.sparkContext.setLogLevel("ERROR")
    report = audit(spark, spec, args.bootstrap_servers, args.input, args.output, args.dead_letter)
    print_report(report)
    if args.json:
        print(json.dumps(report.summary()))
    spark.stop()
    return 0 if report.exact else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sparkeos", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    _add_broker_parser(commands)
    _add_run_parser(commands)
    _add_audit_parser(commands)
    _add_demo_parser(commands)
    _add_chaos_parser(commands)
    _add_lag_parser(commands)
    _add_sinks_parser(commands)
    args = parser.parse_args(argv)
    if args.command == "broker":
        return run_broker(args)
    if args.command == "run":
        return run_job(args)
    if args.command == "audit":
        return run_audit(args)
    if args.command in ("demo", "chaos"):
        try:
            return run_demo(args) if args.command == "demo" else run_chaos(args)
        except KeyboardInterrupt:  # the run's processes are stopped on the way out
            print(f"sparkeos {args.command}: interrupted", file=sys.stderr)
            return 130
    if args.command == "lag":
        return run_lag(args)
    if args.command == "sinks":
        return run_sinks(args)
    parser.error(f"unknown command {args.command}")
    return 2
