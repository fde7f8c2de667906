"""Layering, read from the source: which product folder may import which (docs/design.md, "Layout").

- the stages do not import each other: ``streams/featurizer`` never imports ``streams/ledger``
  and back; what both need lives in ``common`` (which imports neither);
- the runtime (``runtime``) knows Kafka but nothing of unlearning: it imports no stage,
  nothing of ``common``, ``services``, ``schemas``, ``ledger`` or ``features``;
- the SDK (``services/client``) and serving (``services/serving``) run without the stages, so
  they import neither stage (the runtime and ``common`` they may);
- the layers below the streams (``schemas``, ``infra``, ``ledger``, ``features``) import neither
  ``streams`` nor ``services``;
- only ``infra/kafka_client.py`` constructs a Kafka Producer, Consumer or AdminClient: every
  product client through ``runtime/clients.py`` (from the settings), the local brokers'
  launchers and ``kafka_init`` (before any product settings exist) with a raw config.

Every import counts: top-level, inside a function, under ``TYPE_CHECKING``, relative, and
``importlib.import_module("...")`` with a literal name.

Allowed on purpose: ``services/cli.py`` starts the stages, and the verifier
(``services/verifier``) re-runs the stages' own pure rules (the ledger's ``HeadRuntime`` and
``RowOpener``, the featurizer's remove-wins rule) so that an audit judges by the code that
decided, not by a copy of it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("common", "features", "infra", "ledger", "runtime", "schemas", "services", "streams")
"""Top-level folders installed as ``unlearn.<folder>`` (pyproject.toml)."""

RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("unlearn.streams.featurizer", ("unlearn.streams.ledger",)),
    ("unlearn.streams.ledger", ("unlearn.streams.featurizer",)),
    ("unlearn.runtime", ("unlearn.streams", "unlearn.common", "unlearn.services", "unlearn.schemas",
                         "unlearn.ledger", "unlearn.features")),
    ("unlearn.common", ("unlearn.streams", "unlearn.services")),
    ("unlearn.services.client", ("unlearn.streams.featurizer", "unlearn.streams.ledger")),
    ("unlearn.services.serving", ("unlearn.streams.featurizer", "unlearn.streams.ledger")),
    ("unlearn.schemas", ("unlearn.runtime", "unlearn.common", "unlearn.streams", "unlearn.services")),
    ("unlearn.infra", ("unlearn.runtime", "unlearn.common", "unlearn.streams", "unlearn.services")),
    ("unlearn.ledger", ("unlearn.runtime", "unlearn.common", "unlearn.streams", "unlearn.services")),
    ("unlearn.features", ("unlearn.runtime", "unlearn.common", "unlearn.streams", "unlearn.services")),
)
"""(importing package, packages it must not import)."""


def module_name(path: Path) -> str:
    """``streams/ledger/head_runtime.py`` -> ``unlearn.streams.ledger.head_runtime`` (a package's
    ``__init__.py`` -> the package)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["unlearn", *parts])


def imported_modules(source: str, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in ``source``, the code of ``module``."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield node.lineno, target
            for alias in node.names:  # ``from unlearn.streams import ledger`` names a module too
                yield node.lineno, f"{target}.{alias.name}"
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            yield node.lineno, node.args[0].value


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    """Each forbidden import of ``module`` as ``"<module>:<line> imports <name>"``."""
    found: dict[int, str] = {}  # line -> the first forbidden name on it
    for importer, forbidden in RULES:
        if not within(module, importer):
            continue
        for line, name in imported_modules(source, module, is_package):
            if any(within(name, f) for f in forbidden):
                found.setdefault(line, f"{module}:{line} imports {name}")
    return [found[line] for line in sorted(found)]


def product_files() -> list[Path]:
    return sorted(p for folder in PRODUCT for p in (ROOT / folder).rglob("*.py"))


def test_no_stage_imports_another_and_no_layer_imports_upwards() -> None:
    files = product_files()
    assert len(files) > 50, "the product folders were not found"
    found = [v for p in files for v in violations(p.read_text(encoding="utf-8"), module_name(p),
                                                 p.name == "__init__.py")]
    assert not found, "imports across layers:\n" + "\n".join(found)


@pytest.mark.parametrize(("source", "module"), [
    ("from unlearn.streams.ledger.checkpoint_rules import safe_floor", "unlearn.streams.featurizer.erasure"),
    ("import unlearn.streams.featurizer.routing", "unlearn.streams.ledger.head_runtime"),
    ("from ..ledger import unseal", "unlearn.streams.featurizer.erasure"),
    ("from .. import ledger", "unlearn.streams.featurizer.erasure"),
    ("def f():\n    from unlearn.streams.featurizer.routing import head_partition", "unlearn.services.client.sdk"),
    ("import importlib\nimportlib.import_module('unlearn.streams.ledger.worker')", "unlearn.services.serving.http"),
    ("from unlearn.services.client.sdk import UnlearnClient", "unlearn.runtime.topics"),
    ("from unlearn.schemas.sealed import SampleKey", "unlearn.runtime.topic_reader"),
    ("from unlearn.streams.featurizer.judge import judge_add", "unlearn.common.key_ring"),
])
def test_the_check_sees_each_kind_of_import(source: str, module: str) -> None:
    assert violations(source, module)


def test_the_check_lets_allowed_imports_pass() -> None:
    assert not violations("from unlearn.common.by_head import head_partition\nfrom . import router",
                          "unlearn.streams.featurizer.erasure")
    assert not violations("from unlearn.runtime import clients", "unlearn.services.client.sdk")
    assert not violations("from unlearn.streams.ledger.worker import run_ledger_worker", "unlearn.services.cli")


CLIENT_CLASSES = frozenset({"Producer", "Consumer", "AdminClient", "SerializingProducer", "DeserializingConsumer"})
CLIENT_MAKERS = ("infra/kafka_client.py",)
"""Where a Kafka client may be constructed: the one place, which ``runtime/clients.py``
calls with the settings' config and the local brokers' launchers and ``kafka_init`` (before any
product settings exist) with a raw one."""


def constructions(source: str) -> list[int]:
    """Lines of ``source`` that call a Kafka client class by name (``Producer(...)``,
    ``confluent_kafka.Consumer(...)``)."""
    return [node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) in CLIENT_CLASSES]


def test_only_the_runtime_constructs_kafka_clients() -> None:
    found = [f"{p.relative_to(ROOT)}:{line}" for p in product_files()
             if str(p.relative_to(ROOT)) not in CLIENT_MAKERS for line in constructions(p.read_text(encoding="utf-8"))]
    assert not found, "Kafka clients made outside infra/kafka_client.py:\n" + "\n".join(found)


def test_the_client_check_sees_a_construction() -> None:
    assert constructions("from confluent_kafka import Producer\np = Producer({})") == [2]
    assert constructions("import confluent_kafka\nc = confluent_kafka.Consumer({})") == [2]
    assert not constructions("from unlearn.runtime import clients\np = clients.producer(s)")
