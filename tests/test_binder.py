"""binder/ stays consistent with the requirements users install (this machine cannot reach Binder)."""

import re
import sys
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
REQUIRES_PYTHON = SpecifierSet(re.search(r'requires-python = "([^"]+)"', (ROOT / "pyproject.toml").read_text())[1])


def requirement_lines(path: Path) -> list[str]:
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def test_binder_requirements_take_a_cpu_torch_and_the_kits_requirements():
    lines = requirement_lines(ROOT / "binder" / "requirements.txt")
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in lines
    assert "-r ../requirements.txt" in lines
    torch_pins = [line for line in lines if line.startswith("torch")]
    assert len(torch_pins) == 1
    binder_torch = SpecifierSet(torch_pins[0].removeprefix("torch"))
    user_torch = [line for line in requirement_lines(ROOT / "requirements.txt") if line.startswith("torch")]
    user_range = SpecifierSet(user_torch[0].removeprefix("torch"))
    pinned = Version(next(iter(binder_torch)).version.removesuffix(".*"))
    assert pinned in user_range, f"binder's {binder_torch} is outside requirements.txt's {user_range}"


def test_binder_python_is_supported_and_not_the_default_310():
    match = re.fullmatch(r"python-(\d+)\.(\d+)", (ROOT / "binder" / "runtime.txt").read_text().strip())
    assert match, "runtime.txt must read like python-3.11"
    version = Version(".".join(match.groups()))
    assert version in REQUIRES_PYTHON
    assert version >= Version("3.11")


def test_post_build_installs_the_package_without_an_extension_build():
    script = (ROOT / "binder" / "postBuild").read_text()
    assert "pip install --no-deps" in script and " -e ." in script
    assert "jupyter lab build" not in script


def test_readme_links_binder_to_lesson_one():
    readme = (ROOT / "README.md").read_text()
    assert "mybinder.org/v2/gh/" in readme and "urlpath=lab/tree/notebooks/01_start_here.ipynb" in readme


def test_python_version_of_this_run_is_supported():
    assert Version(".".join(map(str, sys.version_info[:3]))) in REQUIRES_PYTHON

