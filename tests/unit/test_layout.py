"""The package boundaries of docs/ARCHITECTURE.md, checked on the source: a package imports only what is below it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

ALLOWED: dict[str, set[str]] = {
    "watermark_core": set(),
    "pulsar_access": {"watermark_core"},
    "producer": {"watermark_core", "pulsar_access"},
    "consumer": {"watermark_core", "pulsar_access"},
    "broker_ext": {"watermark_core", "pulsar_access"},
    "spark_sink": {"watermark_core", "pulsar_access", "consumer", "producer"},
}
"""Product packages and the project packages each may import (besides itself)."""

PROJECT = set(ALLOWED) | {"devtools", "demo", "bench", "tests"}


def project_imports(package: str) -> dict[str, set[str]]:
    """For each module file of `package`, the project packages it imports (at any depth in the file)."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(ROOT))] = (names & PROJECT) - {package}
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_package_imports_only_what_is_below_it(package: str) -> None:
    imports = project_imports(package)
    assert imports, f"{package} has no modules"
    wrong = {module: sorted(names - ALLOWED[package]) for module, names in imports.items() if names - ALLOWED[package]}
    assert wrong == {}, f"imports across the layout (docs/ARCHITECTURE.md): {wrong}"


def module_imports(package: str) -> dict[str, set[str]]:
    """For each module of `package`, the modules of the same package it imports at its top level."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).glob("*.py")):
        names: set[str] = set()
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(f"{package}."):
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names if alias.name.startswith(f"{package}."))
        found[f"{package}.{path.stem}"] = names
    return found


def assert_no_circle(graph: dict[str, set[str]]) -> None:
    """Every module of `graph` (module -> the modules it imports) reaches itself through no chain of imports."""
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"an import circle: {' -> '.join((*path, module))}"
        if module not in done:
            for name in graph.get(module, ()):
                visit(name, (*path, module))
            done.add(module)

    for module in graph:
        visit(module, ())


def test_the_spark_modules_import_one_another_without_a_circle() -> None:
    graph = module_imports("spark_sink")
    assert_no_circle(graph)
    assert "spark_sink.rows" not in set().union(*graph.values()), "rows (pyarrow) is imported by source.read alone"


def test_the_spark_source_on_the_driver_loads_no_pyarrow() -> None:
    """The driver's processes import the source to plan batches; pyarrow (~150 ms) is the executors' alone."""
    import subprocess
    import sys

    pytest.importorskip("pyspark")
    code = "import sys, spark_sink; spark_sink.data_source(); print('pyarrow' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_the_consumer_modules_import_one_another_without_a_circle() -> None:
    """Type hints count too (`if TYPE_CHECKING:` imports): listener.py types the consumer `Any`, so the listener
    interface (its `Listener` protocol and `WatermarkListener`) has one home that the dispatcher and the consumer
    import (issue 48)."""
    graph: dict[str, set[str]] = {}
    for path in sorted((ROOT / "consumer").glob("*.py")):
        names = {
            node.module
            for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("consumer.")
        }
        graph[f"consumer.{path.stem}"] = names - {f"consumer.{path.stem}"}
    assert_no_circle({module: names for module, names in graph.items() if module != "consumer.__init__"})
    assert "consumer.trust" in graph, "the trust rule lives in consumer/ (its one user is consumer/engine.py)"


def test_nothing_in_consumer_but_the_package_imports_the_consumer_class() -> None:
    """`watermark_consumer.py` is the consumer's shell at the top: the rooms under it (the feed, the dispatcher, the
    listener interface) are given what they call, never import it, hints included (issue 48)."""
    importers = sorted(
        f"consumer.{path.stem}"
        for path in (ROOT / "consumer").glob("*.py")
        if path.stem not in ("__init__", "watermark_consumer")
        and any(
            isinstance(node, ast.ImportFrom) and node.module == "consumer.watermark_consumer"
            for node in ast.walk(ast.parse(path.read_text(), str(path)))
        )
    )
    assert importers == []


@pytest.mark.parametrize("package", [*sorted(ALLOWED), "devtools", "bench"])
def test_no_module_imports_another_modules_private_names(package: str) -> None:
    """A room that calls another's private names is two rooms pretending to be one (STYLE.md, the shell's rooms;
    issue 48: devtools' JVM options had been shared through a private name)."""
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PROJECT:
                found += [f"{path.relative_to(ROOT)}: {node.module}.{a.name}" for a in node.names if a.name[0] == "_"]
    assert found == []
