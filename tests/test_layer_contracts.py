"""The import contracts in pyproject.toml catch what they promise to: in a copy of the tree, one
bad import is planted for each contract, and import-linter must report every contract broken,
each by its own plant."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.harness import ROOT

PACKAGES = ("clockq", "webapp", "workers", "control", "predictor", "clockq_cli", "bench")

# contract name (its first words) -> (file to plant the import in, the import, module it is charged to)
PLANTS = {
    "Clients over one core": ("workers/planted.py", "import webapp.views", "workers.planted"),
    "The rest of clockq imports no client": ("clockq/stack/planted.py", "import control.tasks", "clockq.stack.planted"),
    "The supervisor's home imports no role": (
        "clockq/supervision/planted.py",
        "import clockq.stack.roles",
        "clockq.supervision.planted",
    ),
    "The settings import nothing of the launcher": ("clockq/env.py", "import clockq.stack.ports", "clockq.env"),
    "The control state imports nothing of the jobs": (
        "clockq/control_state/planted.py",
        "import clockq.jobs.order",
        "clockq.control_state.planted",
    ),
    "The policy is pure": ("clockq/policy/planted.py", "import django.db", "clockq.policy.planted"),
    "The trace replay imports from clockq only clockq.policy": (
        "clockq/replay/planted.py",
        "import clockq.settings",
        "clockq.replay.planted",
    ),
    "Only workloads and the predictor import TensorFlow": ("webapp/planted.py", "import tensorflow", "webapp.planted"),
    "The predictor's series code is pure": ("predictor/series.py", "import keras", "predictor.series"),
    "Only workers import NVML": ("control/planted.py", "import pynvml", "control.planted"),
    "The CLI speaks HTTP only": ("clockq_cli/planted.py", "import clockq.policy.states", "clockq_cli.planted"),
    "No package of the server imports the CLI": (
        "control/planted_cli.py",
        "import clockq_cli.config",
        "control.planted_cli",
    ),
    "The benchmarks never import the tests": ("bench/planted.py", "import tests.harness", "bench.planted"),
}


REPLAY = "The trace replay imports from clockq only clockq.policy"


def contracts() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return [c["name"] for c in config["tool"]["importlinter"]["contracts"]]


def test_every_contract_has_a_plant():
    names = contracts()
    assert len(names) == len(PLANTS)
    for name in names:
        assert any(name.startswith(start) for start in PLANTS), f"no bad import planted for {name!r}"


def test_each_planted_import_breaks_its_contract(tmp_path):
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    for path, line, _module in PLANTS.values():
        with open(tmp_path / path, "a") as f:
            f.write(f"\n{line}  # planted\n")

    lint = Path(sys.executable).with_name("lint-imports")
    run = subprocess.run([lint, "--no-cache"], cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)}, capture_output=True)
    report = run.stdout.decode()
    assert run.returncode == 1, report
    broken = report.split("Broken contracts", 1)[1]
    # Each contract's part of the report runs to the next contract's name: a contract that more than
    # one plant breaks (the layers, by the control state's plant too) lists each apart.
    starts = sorted((broken.index(start), start) for start in PLANTS if start in broken)
    ends = [at for at, _start in starts[1:]] + [len(broken)]
    sections = {start: broken[at:end] for (at, start), end in zip(starts, ends, strict=True)}
    for start, (_path, line, module) in PLANTS.items():
        section = sections.get(start, "")
        assert module in section and line.split()[-1].split(".")[0] in section, f"{start!r} missed {line!r}:\n{report}"
    assert "0 kept" in report, report


def test_the_replay_contract_names_every_module_of_clockq_but_the_policy():
    # Given the contract that keeps the simulator to clockq.policy (a forbidden contract: it
    # lists what the replay may not import, so a module added to clockq must be added to it)
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contract = next(c for c in config["tool"]["importlinter"]["contracts"] if c["name"].startswith(REPLAY))
    forbidden = {m for m in contract["forbidden_modules"] if m.startswith("clockq.")}
    # Then it forbids every module and package directly under clockq but the policy and the replay
    children = {
        p.stem if p.is_file() else p.name
        for p in (ROOT / "clockq").iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()
    }
    assert forbidden == {f"clockq.{c}" for c in children - {"policy", "replay"}}
