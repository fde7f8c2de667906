"""The shared client test vectors (clients/vectors/) are what the Python reference produces.

The Java client's tests read clients/vectors/*.json; this test regenerates every file with
clients/vectors/generate.py (the reference code on fixed inputs, keys and nonces) and requires
the committed bytes to be identical, so the vectors cannot drift from the reference: a change to
a format shows up here, and the committed files must be regenerated (and the Java client checked).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

VECTORS = Path(__file__).resolve().parents[2] / "clients" / "vectors"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("clients_vectors_generate", VECTORS / "generate.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


GEN = _generator()


@pytest.mark.parametrize("name", GEN.FILES)
def test_committed_vectors_are_what_the_reference_generates(name: str) -> None:
    committed = (VECTORS / name).read_bytes()
    fresh = GEN.render(name)
    assert fresh == committed, (f"clients/vectors/{name} differs from what the Python reference generates now: "
                                "run `.venv/bin/python clients/vectors/generate.py` and run the Java tests "
                                "(`make java-test`)")


def test_generation_is_deterministic() -> None:
    assert GEN.render("transit.json") == GEN.render("transit.json")
    assert GEN.render("predict.json") == GEN.render("predict.json")


def test_vectors_cover_every_head_flag() -> None:
    """Every flag bit the decoder knows appears in a valid vector, and every malformed kind is
    refused by the reference (the generator asserts that; here: the files say so)."""
    heads = json.loads((VECTORS / "heads.json").read_text())
    seen = 0
    for case in heads["cases"]:
        seen |= case["flags"]
    assert seen == 0x3F
    bad = json.loads((VECTORS / "heads_malformed.json").read_text())
    assert {c["kind"] for c in bad["cases"]} >= {"truncated", "checksum", "unknown version", "unknown flags",
                                                 "magic", "weights", "padding"}
