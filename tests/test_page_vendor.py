"""The page's third-party modules (src/tether/web/vendor) are exact copies of the npm packages
pinned in package.json, so they stay "from a maintained package" and an upgrade is a pin
change plus a copy. Needs `npm ci` (the CI script runs it)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VENDOR = ROOT / "src" / "tether" / "web" / "vendor"
ROW = re.compile(r"^\| `([^`]+)` \| `([^`]+)` ([0-9.]+) \| `([^`]+)` \|", re.M)


def vendored() -> list[tuple[str, str, str, str]]:
    return ROW.findall((VENDOR / "README.md").read_text())


def test_every_vendored_file_is_listed() -> None:
    listed = {row[0] for row in vendored()}
    shipped = {p.name for p in VENDOR.glob("*.js")}
    assert listed == shipped and listed


@pytest.mark.parametrize(("name", "package", "version", "source"), vendored())
def test_vendored_file_is_the_pinned_package_file(
    name: str, package: str, version: str, source: str
) -> None:
    pins = json.loads((ROOT / "package.json").read_text())["devDependencies"]
    assert pins[package] == version, f"{name}: package.json pins {package} {pins[package]}"
    installed = ROOT / "node_modules" / package
    assert installed.is_dir(), "run `npm ci --no-audit --no-fund` first"
    assert json.loads((installed / "package.json").read_text())["version"] == version
    assert (VENDOR / name).read_bytes() == (installed / source).read_bytes()
    licences = {p.read_bytes() for p in (VENDOR / "licenses").iterdir()}
    assert (installed / "LICENSE").read_bytes() in licences, f"{package}'s licence is not shipped"
