"""The installed package is one import namespace, ``unlearn``: nothing generic in site-packages."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PRODUCT = ("ledger", "schemas", "infra", "features", "runtime", "common", "streams", "services")


def _config() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_product_package_is_listed_and_mapped() -> None:
    cfg = _config()
    on_disk = sorted(
        "unlearn." + ".".join(p.parent.relative_to(REPO).parts)
        for top in PRODUCT for p in (REPO / top).rglob("__init__.py")
    )
    assert sorted(cfg["packages"]) == on_disk
    assert cfg["package-dir"] == {f"unlearn.{top}": top for top in PRODUCT}


def test_the_wheel_holds_only_the_unlearn_namespace(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path), str(REPO)], check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("*.whl")
    tops = {name.split("/", 1)[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"unlearn"}
    names = zipfile.ZipFile(wheel).namelist()
    assert "unlearn/schemas/request.v1.schema.json" in names  # package data travels too
    assert not any(n.startswith(("unlearn/research", "unlearn/bench", "unlearn/tests")) for n in names)
