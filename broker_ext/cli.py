"""`broker-ext`: the watermark generator's command line."""

from __future__ import annotations

import argparse
import faulthandler
import gc
import logging
import signal
import sys
import threading
from types import FrameType

from broker_ext import config as generator_config
from pulsar_access.admin import AdminError
from pulsar_access.errors import PulsarClientError, checked_admin_url, checked_service_url
from pulsar_access.settings import PulsarSettings

log = logging.getLogger("broker_ext")

GC_YOUNG_THRESHOLD = 50_000
"""Allocations between two of Python's youngest collections (its default is 700). The generator keeps its
states immutable, so each marker replaces a few short-lived objects; at 700 they were swept up into the older
generations, whose collections took 5-7 % of the generator's CPU in a burst; at 50 000, none ran in it
(measured with `gc.callbacks`, docs/DECISIONS.md, session 21)."""


def tune_gc() -> None:
    """Collect less often: cycles are still found, the short-lived states are freed by their reference count."""
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def _serve(args: argparse.Namespace) -> int:
    from broker_ext.service import GeneratorService

    config = generator_config.from_arguments(args)
    tune_gc()
    service = GeneratorService(config, PulsarSettings.from_env())

    def _on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        service.stop()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    service.start_metrics()  # a busy port is one clear error here, before anything runs
    failure: list[BaseException] = []

    def _run() -> None:
        try:
            service.run()
        except BaseException as exc:  # reported below: the exit code must say the service failed
            failure.append(exc)
            log.exception("the watermark generator stopped on an unexpected error")

    runner = threading.Thread(target=_run, name="wm-service")
    runner.start()
    while runner.is_alive():
        runner.join(timeout=0.5)
    return 1 if failure else 0


def _status(args: argparse.Namespace) -> int:
    from broker_ext.status import render, status_rows

    print(render(status_rows(PulsarSettings.from_env(), args.topic, args.timeout)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="broker-ext",
        description="Broker-side event-time watermarks for Pulsar. Connection: PULSAR_SERVICE_URL "
        "(default pulsar://127.0.0.1:6650), PULSAR_ADMIN_URL (default http://127.0.0.1:8080), "
        "PULSAR_AUTH_TOKEN or PULSAR_AUTH_TOKEN_FILE.",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the watermark generator service until SIGTERM")
    generator_config.add_arguments(serve)
    serve.set_defaults(run=_serve)
    status = commands.add_parser("status", help="show a topic's subscriptions, positions and watermarks")
    status.add_argument("topic", help="topic name, short (my-topic) or persistent://tenant/ns/name")
    status.add_argument("--timeout", type=int, default=10, metavar="SECONDS",
                        help="how long to wait for a broker that does not answer (default: 10)")  # fmt: skip
    status.set_defaults(run=_status)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("urllib3").setLevel(logging.WARNING)  # one line per admin call is noise, even at DEBUG
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID`: every thread's stack to stderr
    try:
        settings = PulsarSettings.from_env()
        checked_service_url(settings.service_url)
        checked_admin_url(settings.admin_url)
        return int(args.run(args))
    except (AdminError, PulsarClientError, ValueError, OSError) as exc:
        print(f"broker-ext: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
