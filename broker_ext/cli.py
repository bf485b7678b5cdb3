"""`broker-ext`: the watermark generator's command line."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from types import FrameType

from broker_ext.settings import PulsarSettings

log = logging.getLogger("broker_ext")


def _serve(args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT. Placeholder loop until the generator service lands."""
    settings = PulsarSettings.from_env()
    stop = threading.Event()

    def _on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    log.info(
        "watermark generator idle (placeholder) for %s, admin %s", settings.service_url, settings.admin_url
    )
    while not stop.wait(3600):
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="broker-ext", description=__doc__)
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the watermark generator service")
    serve.set_defaults(run=_serve)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
