"""The broker plugin (broker_ext/plugin/, Java): built from source with Maven, loaded by every broker we start.

`ensure_plugin()` builds the NAR when its sources are newer than the last build (Maven runs the plugin's
unit tests on the way) and returns the folder holding it; `broker_settings()` is what a broker's
configuration needs to load it (the interceptor and the servlet come from the same NAR).
`python -m devtools.plugin` builds it and prints where it is.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

# Pulsar's poms name extra repositories that this machine cannot reach; everything is on Central.
MAVEN_SETTINGS = """<settings><mirrors><mirror><id>central-only</id><mirrorOf>*</mirrorOf>
<url>https://repo.maven.apache.org/maven2</url></mirror></mirrors></settings>
"""
PLUGIN_NAME = "watermark-cursors"
SOURCE = Path(__file__).resolve().parent.parent / "broker_ext" / "plugin"
NAR_DIR = SOURCE / "target" / "nar"
NAR = NAR_DIR / f"{PLUGIN_NAME}.nar"


class PluginBuildError(RuntimeError):
    """The plugin did not build; the message says what to do."""


def _newest_source() -> float:
    return max(p.stat().st_mtime for p in [SOURCE / "pom.xml", *(SOURCE / "src").rglob("*")] if p.is_file())


def ensure_plugin(*, run_tests: bool = False, quiet: bool = False) -> Path:
    """Build the NAR if its sources changed since the last build (or always with `run_tests`); its folder."""
    if NAR.exists() and NAR.stat().st_mtime >= _newest_source() and not run_tests:
        return NAR_DIR
    if shutil.which("mvn") is None:
        raise PluginBuildError("Maven ('mvn') is not installed; install it (apt-get install maven) and retry")
    if not quiet:
        print(f"[plugin] building the broker plugin {PLUGIN_NAME} (Java, broker_ext/plugin)"
              + (" with its unit tests" if run_tests else ""), flush=True)  # fmt: skip
    settings = SOURCE / "target" / "maven-settings.xml"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(MAVEN_SETTINGS)
    command = ["mvn", "-B", "-q", "-s", str(settings), "-f", str(SOURCE / "pom.xml"), "package"]
    if not run_tests:
        command.append("-DskipTests")
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stdout.write(result.stdout[-6000:])
        raise PluginBuildError(f"building the broker plugin failed (mvn exited {result.returncode}); output above")
    if run_tests:
        sys.stdout.write(_surefire_summary())
    NAR_DIR.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SOURCE / "target" / f"{PLUGIN_NAME}.jar", NAR)  # a NAR needs no more than the jar's layout
    return NAR_DIR


def _surefire_summary() -> str:
    """Surefire's closing line over the plugin's tests (Maven's -q hides it)."""
    run = failures = errors = skipped = 0
    for report in (SOURCE / "target" / "surefire-reports").glob("*.txt"):
        for line in report.read_text().splitlines():
            if line.startswith("Tests run:"):
                fields = dict(part.strip().split(": ") for part in line.split(",")[:4])
                run += int(fields["Tests run"])
                failures += int(fields["Failures"])
                errors += int(fields["Errors"])
                skipped += int(fields["Skipped"])
    return f"[plugin] Tests run: {run}, Failures: {failures}, Errors: {errors}, Skipped: {skipped}\n"


def broker_settings() -> dict[str, str]:
    """The broker configuration that loads the plugin from `NAR_DIR` (docs/OPERATIONS.md); `ensure_plugin()`
    builds it there before the broker starts."""
    folder = str(NAR_DIR)
    return {
        "brokerInterceptorsDirectory": folder,
        "brokerInterceptors": PLUGIN_NAME,
        "additionalServletDirectory": folder,
        "additionalServlets": PLUGIN_NAME,
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        folder = ensure_plugin(run_tests="--test" in args)
    except PluginBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(folder / NAR.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
