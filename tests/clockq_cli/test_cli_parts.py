"""The CLI's parts that need no server: job files, the login file and where a token may go,
the API's refusals in words, and what the `clockq` command is made of."""

from __future__ import annotations

import io
import json
import re
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from clockq_cli import config
from clockq_cli.client import describe_refusal
from clockq_cli.exits import CliError, ExitCode
from clockq_cli.jobfile import entry_labels, read_jobs
from tests.clockq_cli.conftest import Clockq
from tests.harness import ROOT


def jobs_from(text: str, name: str = "jobs.yaml", **kwargs):
    return read_jobs(io.StringIO(text), name, **kwargs)


def test_a_job_file_holds_one_job_or_a_list_in_yaml_or_json():
    one = jobs_from("name: a\ntier: SP\nworkload: synthetic\ndeadline: 2099-01-01T10:00:00Z\n")
    assert one == [{"name": "a", "tier": "SP", "workload": "synthetic", "deadline": "2099-01-01T10:00:00+00:00"}]
    listed = jobs_from(json.dumps([{"name": "a"}, {"name": "b", "tier": "BK"}]), "jobs.json", tier="HP")
    assert [j["tier"] for j in listed] == ["HP", "HP"]
    assert entry_labels([{"name": "a"}, {}]) == {"0": "entry 0 (a)", "1": "entry 1"}


def test_gpus_from_the_command_line_goes_to_every_job_and_the_files_own_goes_as_it_is():
    text = "- {name: a, gpus: 4}\n- {name: b}\n- {name: c, gpus: true}\n"
    # --gpus wins over the file, as --tier does: this is the body the batch is sent as
    assert [job["gpus"] for job in jobs_from(text, gpus=2)] == [2, 2, 2]
    assert jobs_from(text, gpus=2, tier="BK")[1] == {"name": "b", "gpus": 2, "tier": "BK"}
    # Without it, each job goes as the file gives it: no gpus is the server's default of 1, and
    # a value the server would refuse (true is no count) is the server's to name, not guessed here
    assert jobs_from(text) == [{"name": "a", "gpus": 4}, {"name": "b"}, {"name": "c", "gpus": True}]


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5"])
def test_submit_gpus_is_a_whole_number_from_1_before_anything_is_sent(tmp_path, value):
    # Port 9 (discard) on this machine: nothing listens, and a usage error never asks it
    cli = Clockq(url="http://127.0.0.1:9", token="t", config_home=tmp_path / "config", cwd=tmp_path)
    done = cli("submit", "-", "--gpus", value, stdin='{"name": "a"}')
    assert done.code == 2 and "Invalid value for '--gpus'" in done.err, done.err
    assert "cannot reach" not in done.err


@pytest.mark.parametrize(
    ("text", "name", "message"),
    [
        ("{not json", "jobs.json", "does not parse"),
        ("a: [1,\n", "jobs.yaml", "at line"),
        ("", "jobs.yaml", "is not a job"),
        ("[]", "jobs.yaml", "lists no job"),
        ("- {name: a}\n- 3\n", "jobs.yaml", "entry 1 of jobs.yaml is not a job"),
    ],
)
def test_a_file_that_is_not_jobs_is_a_usage_error(text, name, message):
    with pytest.raises(CliError, match=message) as refused:
        jobs_from(text, name)
    assert refused.value.exit_code == ExitCode.USAGE


def test_the_apis_refusals_read_as_one_line_naming_entries_and_fields():
    batch = {
        "detail": "Nothing was submitted: some entries are refused.",
        "errors": {"1": {"params": [{"message": "steps: must be between 1 and 10", "code": "invalid"}]}},
    }
    assert describe_refusal(batch, labels={"1": "entry 1 (b)"}) == (
        "Nothing was submitted: some entries are refused. | entry 1 (b): params: steps: must be between 1 and 10"
    )
    assert describe_refusal({"name": ["must be a string"], "tier": ["x", "y"]}) == "name: must be a string | tier: x; y"
    assert describe_refusal({}) == "no reason given"


@pytest.fixture
def config_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    return tmp_path / "clockq"


def test_the_environment_overrides_the_login_file_and_the_files_token_stays_with_its_url(config_home):
    config.save(config.Login("https://clockq.example", "saved-token"))
    assert config.resolve({}) == config.Login("https://clockq.example", "saved-token")
    assert config.resolve({"CLOCKQ_TOKEN": "env-token"}).token == "env-token"
    assert config.resolve({"CLOCKQ_URL": "https://clockq.example/"}).token == "saved-token"
    with pytest.raises(CliError, match=r"no token for https://other\.example") as refused:
        config.resolve({"CLOCKQ_URL": "https://other.example"})
    assert refused.value.exit_code == ExitCode.AUTH
    assert config.resolve({"CLOCKQ_URL": "https://other.example", "CLOCKQ_TOKEN": "t"}).url == "https://other.example"


def test_the_login_file_is_written_for_its_owner_only(config_home, capsys):
    path = config.save(config.Login("http://localhost:8000", "secret"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(config_home.stat().st_mode) == 0o700
    assert [p.name for p in config_home.iterdir()] == ["login.json"]  # no temporary file left
    path.chmod(0o644)
    config.read_saved()
    assert "others may read your token" in capsys.readouterr().err
    path.write_text("{broken")
    with pytest.raises(CliError, match="not a login file"):
        config.read_saved()


@pytest.mark.parametrize("url", ["localhost:8000", "ftp://host", "http://", "http://host/?a=1"])
def test_a_server_url_must_be_http_with_a_host(url):
    with pytest.raises(CliError) as refused:
        config.normal_url(url)
    assert refused.value.exit_code == ExitCode.USAGE


def test_the_cli_loads_nothing_of_the_server():
    # The import contracts check the code; this checks what actually loads, the libraries too.
    probe = (
        "import sys, clockq_cli.main; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'django', 'rest_framework', 'celery', 'redis', 'clockq', 'webapp', 'workers', 'control', 'predictor'}))"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_make_installs_the_clockq_command_into_the_venv():
    # Given the console script that pyproject.toml declares
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"clockq": "clockq_cli.main:main"}
    venv = Path(sys.executable).parent.parent
    stamp = venv / ".installed"  # the Makefile's: it installs the package last
    if not stamp.exists() or stamp.stat().st_mtime < (ROOT / "pyproject.toml").stat().st_mtime:
        pytest.skip(f"{venv} was not made by `make venv` since pyproject.toml changed: run `make venv`")
    # Then `make venv` put it beside the interpreter, and it runs
    done = subprocess.run([venv / "bin" / "clockq", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "Exit codes" in done.stdout


def test_show_gives_staff_the_whole_traceback_and_others_the_last_line():
    from rich.console import Console

    from clockq_cli import render

    job = {"id": 7, "name": "j", "state": "failed", "owner": "alice", "tier": "SP", "original_tier": "SP"}
    job["workload"] = "synthetic"
    line = "ValueError: bad batch"
    trace = f'Traceback (most recent call last):\n  File "…/train.py", line 3, in step\n{line}'

    def shown(**fields) -> str:
        console = Console(file=io.StringIO(), width=200)
        console.print(render.job_detail({**job, **fields}, None, None))
        return console.file.getvalue()

    assert line in shown(last_error=line, last_error_traceback=None)
    assert "Traceback" not in shown(last_error=line, last_error_traceback=None)
    assert "Traceback" in shown(last_error=line, last_error_traceback=trace)


def test_jobs_and_show_give_each_jobs_gpus_and_an_older_servers_answer_counts_as_1():
    from rich.console import Console

    from clockq_cli import render

    job = {"id": 7, "name": "j", "state": "queued", "owner": "alice", "tier": "SP", "workload": "synthetic"}
    gang, older = {**job, "gpus": 4}, dict(job)  # a server older than multi-GPU jobs sends no gpus

    table = render.jobs_table([gang, older, {**job, "gpus": None}])
    (column,) = [c for c in table.columns if c.header == "GPUS"]
    assert list(column.cells) == ["4", "1", "1"]

    def shown(job: dict) -> str:
        console = Console(file=io.StringIO(), width=200)
        console.print(render.job_detail(job, None, None))
        return console.file.getvalue()

    assert re.search(r"^gpus +4 *$", shown(gang), re.MULTILINE), shown(gang)
    assert re.search(r"^gpus +1 *$", shown(older), re.MULTILINE), shown(older)
