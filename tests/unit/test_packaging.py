"""The shipped definitions have one copy, definitions/ at the top of the repository, and the
distributions carry it: the wheel inside the package (where an installed fsm_celery looks), the
sdist as it is (so that a wheel built from it has them too). Built through the backend's PEP 517
hooks, as pip builds them, in the test's process."""

from __future__ import annotations

import tarfile
import zipfile
from pathlib import Path

import pytest
from hatchling.build import build_sdist, build_wheel

from fsm_celery.core.loader import SHIPPED_DEFINITIONS

ROOT = Path(__file__).resolve().parents[2]
DEFINITIONS = {p.name: p.read_bytes() for p in (ROOT / "definitions").glob("*.yaml")}


def _wheel_definitions(
    source: Path, out: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, bytes]:
    """The definitions in a wheel built from source, by the file name under the package."""
    monkeypatch.chdir(source)
    with zipfile.ZipFile(out / build_wheel(str(out))) as wheel:
        names = wheel.namelist()
        assert not [n for n in names if n.startswith("definitions/")], "a top-level copy"
        folder = "fsm_celery/definitions/"
        return {n.removeprefix(folder): wheel.read(n) for n in names if n.startswith(folder)}


def test_a_checkout_reads_the_top_level_folder() -> None:
    assert SHIPPED_DEFINITIONS == ROOT / "definitions"
    assert sorted(DEFINITIONS) == [
        "cto_build_parallel.yaml",
        "cto_build_project.yaml",
        "cto_fix_bug.yaml",
        "cto_infrastructure_check.yaml",
        "research_fanout.yaml",
        "research_pipeline.yaml",
    ]


def test_the_wheel_carries_the_definitions_inside_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _wheel_definitions(ROOT, tmp_path, monkeypatch) == DEFINITIONS


def test_the_sdist_carries_them_and_a_wheel_built_from_it_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    with tarfile.open(tmp_path / build_sdist(str(tmp_path))) as sdist:
        sdist.extractall(tmp_path / "unpacked", filter="data")
    [source] = (tmp_path / "unpacked").iterdir()
    shipped = {p.name: p.read_bytes() for p in (source / "definitions").iterdir()}
    assert shipped == DEFINITIONS
    (tmp_path / "wheel").mkdir()
    assert _wheel_definitions(source, tmp_path / "wheel", monkeypatch) == DEFINITIONS
