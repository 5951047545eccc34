"""`clockq` against a live server with a real database and real tokens: login, submit, list,
show, cancel, queues, and every failure an operator meets (server down, bad token, no such
job, a refused job file) as one line and its own exit code."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import stat
import threading

import pytest

from clockq.jobs.models import Job
from tests.clockq_cli.conftest import no_traceback
from tests.helpers import submit

pytestmark = pytest.mark.django_db(transaction=True)

SWEEP = """\
- name: sweep-1
  tier: BK
  workload: synthetic
  params: {steps: 5, step_ms: 1}
- name: sweep-2
  tier: SP
  workload: synthetic
  deadline: 2099-01-01T00:00:00Z
"""


def test_login_keeps_the_url_and_token_in_a_file_only_its_owner_reads(clockq):
    # Given no CLOCKQ_URL or CLOCKQ_TOKEN in the environment, only what `login` keeps
    logged_out = {"CLOCKQ_URL": None, "CLOCKQ_TOKEN": None}
    refused = clockq("jobs", **logged_out)
    assert refused.code == 4 and "not logged in" in refused.err
    no_traceback(refused)

    # When alice logs in with her token on stdin
    done = clockq("login", clockq.url + "/", stdin=clockq.token + "\n", **logged_out)

    # Then it is kept readable by her alone, and the next commands use it
    assert done.code == 0, done.err
    path = clockq.config_home / "clockq" / "login.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert json.loads(path.read_text()) == {"url": clockq.url, "token": clockq.token}
    assert clockq("jobs", "--json", **logged_out).json() == {"count": 0, "jobs": []}
    # And the kept token goes to no other server than the one it was made for
    elsewhere = clockq("jobs", CLOCKQ_URL="http://127.0.0.1:9", CLOCKQ_TOKEN=None)
    assert elsewhere.code == 4 and "no token for http://127.0.0.1:9" in elsewhere.err
    # And logout forgets it
    assert clockq("logout").code == 0 and not path.exists()


def test_login_with_a_wrong_token_keeps_nothing(clockq):
    done = clockq("login", clockq.url, stdin="not-a-token\n", CLOCKQ_URL=None, CLOCKQ_TOKEN=None)
    assert done.code == 4 and "refused the token" in done.err
    no_traceback(done)
    assert not (clockq.config_home / "clockq" / "login.json").exists()


def test_a_server_that_is_not_there_is_one_line_and_exit_3(clockq):
    # A port bound but not listening: connecting to it is refused at once.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        done = clockq("queues", CLOCKQ_URL=url)
    assert done.code == 3 and f"cannot reach {url}: Connection refused" in done.err
    no_traceback(done)


def test_a_revoked_token_is_one_line_and_exit_4(clockq):
    from knox.models import AuthToken

    AuthToken.objects.all().delete()
    for args in (["jobs"], ["show", "1"], ["cancel", "1"], ["queues"], ["gpus"]):
        done = clockq(*args)
        assert done.code == 4 and "refused the token" in done.err, (args, done.err)
        no_traceback(done)


def test_submit_sends_a_file_as_one_batch_and_jobs_lists_it(clockq, tmp_path):
    # Given a YAML file of two jobs
    job_file = tmp_path / "sweep.yaml"
    job_file.write_text(SWEEP)

    # When alice submits it
    done = clockq("submit", str(job_file), "--json")

    # Then both are queued, in order, and listed as hers (the table too)
    assert done.code == 0, done.err
    created = done.json()
    assert [(j["name"], j["tier"], j["state"]) for j in created] == [
        ("sweep-1", "BK", "queued"),
        ("sweep-2", "SP", "queued"),
    ]
    assert created[1]["deadline"].startswith("2099-01-01")  # YAML's datetime went as ISO text
    listed = clockq("jobs", "--json").json()
    assert listed["count"] == 2 and [j["id"] for j in listed["jobs"]] == [created[1]["id"], created[0]["id"]]
    table = clockq("jobs")
    assert table.code == 0 and "sweep-1" in table.out and "queued" in table.out and "alice" in table.out


def test_submit_with_tier_puts_every_job_in_that_tier_and_reads_json_from_stdin(clockq):
    body = json.dumps([{"name": "a", "tier": "BK", "workload": "synthetic"}, {"name": "b", "workload": "synthetic"}])
    done = clockq("submit", "-", "--tier", "HP", "--json", stdin=body)
    assert done.code == 0, done.err
    assert [j["tier"] for j in done.json()] == ["HP", "HP"]


def synthetic(name: str, tier: str = "SP", **fields) -> dict:
    return {"name": name, "tier": tier, "workload": "synthetic", **fields}


def test_submit_with_gpus_sets_every_job_and_jobs_and_show_give_the_count(clockq):
    # Given a batch whose first job asks for GPUs of its own and whose second says nothing
    body = json.dumps([synthetic("a", gpus=3), synthetic("b", "BK")])

    # When alice submits it with --gpus 1 (what a cluster of one-GPU workers runs)
    done = clockq("submit", "-", "--gpus", "1", "--json", stdin=body)

    # Then --gpus won over the file's, as --tier does, and the answers carry the count
    assert done.code == 0, done.err
    created = done.json()
    assert [j["gpus"] for j in created] == [1, 1]
    assert Job.objects.filter(gpus=1).count() == 2
    table = clockq("jobs")
    assert table.code == 0 and "GPUS" in table.out, table.err
    shown = clockq("show", str(created[0]["id"]))
    assert shown.code == 0 and re.search(r"^gpus +1 *$", shown.out, re.MULTILINE), shown.out


@pytest.mark.parametrize("gpus", [10_000, 0, True])
def test_a_job_file_asking_for_gpus_the_server_refuses_submits_nothing_and_names_the_field(clockq, tmp_path, gpus):
    # The CLI sends the file's gpus as it is: the server alone knows the cluster's largest
    job_file = tmp_path / "gang.json"
    job_file.write_text(json.dumps([synthetic("fine"), synthetic("gang", gpus=gpus)]))
    done = clockq("submit", str(job_file))
    assert done.code == 1 and "entry 1 (gang): gpus: " in done.err, done.err
    no_traceback(done)
    assert Job.objects.count() == 0


def test_submit_gpus_beyond_the_cluster_is_refused_with_the_servers_words(clockq):
    done = clockq("submit", "-", "--gpus", "10000", stdin=json.dumps(synthetic("big")))
    assert done.code == 1 and "entry 0 (big): gpus: " in done.err, done.err
    no_traceback(done)
    assert Job.objects.count() == 0


def test_a_refused_job_file_submits_nothing_and_names_the_entry_and_field(clockq, tmp_path):
    job_file = tmp_path / "bad.yaml"
    job_file.write_text(SWEEP + "- name: too-long\n  tier: SP\n  workload: synthetic\n  params: {steps: -5}\n")
    done = clockq("submit", str(job_file))
    assert done.code == 1
    assert "entry 2 (too-long): params: steps: must be between" in done.err
    no_traceback(done)
    assert Job.objects.count() == 0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("name: [unclosed", "does not parse"),
        ("[]", "lists no job"),
        ("- just a string", "entry 0 of"),
    ],
)
def test_a_job_file_that_is_not_jobs_is_a_usage_error(clockq, tmp_path, content, message):
    job_file = tmp_path / "jobs.yaml"
    job_file.write_text(content)
    done = clockq("submit", str(job_file))
    assert done.code == 2 and message in done.err
    no_traceback(done)
    missing = clockq("submit", str(tmp_path / "missing.yaml"))
    assert missing.code == 2 and "No such file or directory" in missing.err


def test_jobs_filters_by_state_tier_and_user(clockq_as_carol, alice, bob):
    # Given alice's SP and BK jobs, bob's BK job, and alice's cancelled HP job
    submit(alice, "SP", name="a-sp")
    submit(alice, "BK", name="a-bk")
    submit(bob, "BK", name="b-bk")
    Job.objects.filter(pk=submit(alice, "HP", name="a-hp").pk).update(state="cancelled")

    def names(*args):
        done = clockq_as_carol("jobs", "--json", *args)
        assert done.code == 0, done.err
        return sorted(j["name"] for j in done.json()["jobs"])

    # Then carol (staff) lists what each filter leaves; ended jobs only when asked
    assert names() == ["a-bk", "a-sp", "b-bk"]
    assert names("--all") == ["a-bk", "a-hp", "a-sp", "b-bk"]
    assert names("--state", "cancelled") == ["a-hp"]
    assert names("--state", "cancelled", "--state", "queued", "--tier", "BK") == ["a-bk", "b-bk"]
    assert names("--user", "bob") == ["b-bk"]
    assert names("--all", "--user", "alice", "--tier", "HP") == ["a-hp"]
    limited = clockq_as_carol("jobs", "--limit", "2", "--json").json()
    assert limited["count"] == 3 and len(limited["jobs"]) == 2
    assert clockq_as_carol("jobs", "--state", "queued", "--all").code == 2


def test_show_gives_a_job_with_its_events_and_no_result_yet(clockq, alice):
    job = submit(alice, "SP", name="inspect-me")
    shown = clockq("show", str(job.pk), "--json")
    assert shown.code == 0, shown.err
    body = shown.json()
    assert body["job"]["name"] == "inspect-me" and body["job"]["state"] == "queued"
    assert [e["reason"] for e in body["job"]["events"]] == ["submitted to SP"]
    assert body["job"]["slice_history"] == [] and body["result"] is None
    assert body["metrics"]["job"] == job.pk
    table = clockq("show", str(job.pk))
    assert table.code == 0 and "inspect-me" in table.out and "submitted to SP" in table.out


def test_a_job_that_is_not_there_or_not_yours_is_exit_5(clockq, bob):
    theirs = submit(bob, name="bobs")
    for args in (["show", "999"], ["show", str(theirs.pk)], ["result", str(theirs.pk)]):
        done = clockq(*args)
        assert done.code == 5, (args, done.err)
        no_traceback(done)


def test_result_of_a_job_without_one_says_its_state(clockq, alice):
    job = submit(alice, name="not-yet")
    done = clockq("result", str(job.pk))
    assert done.code == 5 and f"job {job.pk} is queued and has no result" in done.err


def test_cancel_tries_every_job_and_exits_with_the_worst(clockq, alice, bob):
    # Given one queued job of alice's, one she has cancelled, and bob's
    queued = submit(alice, name="q")
    ended = submit(alice, name="e")
    assert clockq("cancel", str(ended.pk)).code == 0
    theirs = submit(bob, name="b")

    # When alice cancels all three and one that does not exist
    done = clockq("cancel", str(queued.pk), str(ended.pk), str(theirs.pk), "999", "--json")

    # Then her queued job is cancelled, the others are reported, bob's is untouched, and exit 5
    assert done.code == 5
    outcomes = {o["id"]: o for o in done.json()}
    assert outcomes[queued.pk]["cancelled"] and outcomes[queued.pk]["state"] == "cancelled"
    assert not outcomes[ended.pk]["cancelled"] and "already cancelled" in outcomes[ended.pk]["error"]
    assert not outcomes[theirs.pk]["cancelled"] and not outcomes[999]["cancelled"]
    assert Job.objects.get(pk=theirs.pk).state == "queued"
    # And with nothing missing, the already-ended job alone makes it exit 1
    assert clockq("cancel", str(ended.pk)).code == 1


def test_queues_and_gpus_read_the_cluster(clockq, alice):
    submit(alice, "RT")
    submit(alice, "BK")
    queues = clockq("queues", "--json")
    assert queues.code == 0, queues.err
    waiting = {t["tier"]: t["waiting"] for t in queues.json()["tiers"]}
    assert waiting == {"RT": 1, "HP": 0, "SP": 0, "BP": 0, "BK": 1}
    assert queues.json()["workers"] == []
    gpus = clockq("gpus", "--json")
    assert gpus.code == 0 and gpus.json()["gpus"] == []
    for table in (clockq("queues"), clockq("gpus")):
        assert table.code == 0 and table.err == "", table.err


def test_jobs_watch_shows_a_new_job_and_ctrl_c_ends_it_cleanly(clockq, alice):
    # Given `clockq jobs --watch --json` running, refreshing every half second
    watch = clockq.popen("jobs", "--watch", "--interval", "0.5", "--json")
    refreshes: queue.Queue[dict] = queue.Queue()
    threading.Thread(target=lambda: [refreshes.put(json.loads(line)) for line in watch.stdout], daemon=True).start()
    try:
        assert refreshes.get(timeout=30)["jobs"] == []
        # When alice submits a job
        job = submit(alice, name="watched")
        # Then a later refresh lists it
        while not any(j["id"] == job.pk for j in refreshes.get(timeout=30)["jobs"]):
            pass
        # And Ctrl-C ends the watch with exit 0
        watch.send_signal(signal.SIGINT)
        assert watch.wait(timeout=30) == 0, watch.stderr.read()
    finally:
        watch.kill()
        watch.wait()


def test_ctrl_c_stops_waiting_not_the_jobs_with_exit_130(clockq, tmp_path):
    # Given `submit --wait` on a job that nothing runs (no GPU worker)
    job_file = tmp_path / "job.yaml"
    job_file.write_text("name: waits\ntier: SP\nworkload: synthetic\n")
    waiting = clockq.popen("submit", str(job_file), "--wait")
    try:
        assert "waiting for the end" in waiting.stderr.readline()
        # When the operator presses Ctrl-C
        waiting.send_signal(signal.SIGINT)
        # Then it stops waiting with exit 130, saying the job goes on, and the job is still queued
        assert waiting.wait(timeout=30) == 130
        rest = waiting.stderr.read()
        assert "stopped waiting; jobs" in rest and "go on" in rest and "Traceback" not in rest
    finally:
        waiting.kill()
        waiting.wait()
    assert Job.objects.get().state == "queued"


def test_a_watch_outlives_a_server_it_cannot_reach_for_a_while(clockq):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        watch = clockq.popen(
            "jobs", "--watch", "--interval", "0.5", CLOCKQ_URL=f"http://127.0.0.1:{closed.getsockname()[1]}"
        )
        try:
            for _ in range(2):  # it says so, and tries again
                assert "Connection refused; trying again in 0.5 s" in watch.stderr.readline()
            watch.send_signal(signal.SIGINT)
            assert watch.wait(timeout=30) == 0
        finally:
            watch.kill()
            watch.wait()


def test_a_reader_that_stops_early_ends_the_output_quietly(clockq):
    # Given a watch whose reader takes one refresh and goes (`| head -1`)
    watch = clockq.popen("jobs", "--watch", "--interval", "0.5", "--json")
    try:
        assert json.loads(watch.stdout.readline())["jobs"] == []
        watch.stdout.close()
        # Then the next refresh ends it, with no traceback and no "Exception ignored"
        assert watch.wait(timeout=30) == 1
        assert watch.stderr.read() == ""
    finally:
        watch.kill()
        watch.wait()


def test_on_a_terminal_watch_redraws_one_table_in_place(clockq, alice):
    import pty
    import subprocess

    # Given a watch whose output is a terminal (a pseudo-terminal here)
    submit(alice, name="on-screen")
    main, replica = pty.openpty()
    watch = subprocess.Popen(
        [*clockq.command(), "jobs", "--watch", "--interval", "0.5"],
        cwd=clockq.cwd,
        env=clockq.env(TERM="xterm"),
        stdin=subprocess.DEVNULL,
        stdout=replica,
        stderr=subprocess.PIPE,
    )
    os.close(replica)
    try:
        seen = b""
        # Then the table appears, and at the next refresh is drawn again over itself (the cursor
        # goes back up), not below it
        while seen.count(b"on-screen") < 2:
            seen += os.read(main, 65536)
        assert b"\x1b[1A" in seen.split(b"on-screen", 1)[1]
        watch.send_signal(signal.SIGINT)
        assert watch.wait(timeout=30) == 0, watch.stderr.read()
    finally:
        watch.kill()
        watch.wait()
        os.close(main)
