"""Importing the predictor's pure parts (and its app) does not load TensorFlow: the web
process, beat and GPU workers install the app and must stay free of it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_series_evaluation_and_forecasters_do_not_import_tensorflow():
    code = (
        "import sys\n"
        "import django\n"
        "django.setup()  # every installed app, this one included\n"
        "import predictor, predictor.apps, predictor.series, predictor.evaluation, predictor.forecasters\n"
        "import predictor.management.commands.evaluate_predictor\n"
        "loaded = sorted(m for m in ('tensorflow', 'keras') if m in sys.modules)\n"
        "print(loaded)\n"
        "sys.exit(1 if loaded else 0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "clockq.settings"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


# What each process imports at start: the web process (WSGI application and every URL's views,
# what runserver and gunicorn load), celery beat (the app, its autodiscovered tasks and the
# database scheduler), a GPU worker (the same app and tasks, the slice runner, the launcher).
# Task autodiscovery imports predictor.tasks in all of them.
PROCESSES = {
    "web": (
        "from clockq.wsgi import application\n"
        "import clockq.urls, webapp.views, webapp.dashboard, webapp.health, webapp.admin\n"
        "from django.urls import get_resolver\n"
        "get_resolver().url_patterns\n"
    ),
    "beat": (
        "from clockq.celery import app\n"
        "app.loader.import_default_modules()\n"
        "import celery.apps.beat, django_celery_beat.schedulers\n"
    ),
    "gpu worker": (
        "from clockq.celery import app\n"
        "app.loader.import_default_modules()\n"
        "import workers.tasks, workers.slice_runner, control.tasks, predictor.tasks, predictor.live\n"
        "import workers.management.commands.gpuworkers\n"
        "assert 'clockq.forecast' in app.tasks and 'clockq.train_predictor' in app.tasks\n"
    ),
}


@pytest.mark.parametrize("process", sorted(PROCESSES))
def test_the_web_beat_and_gpu_worker_processes_do_not_import_tensorflow(process):
    code = (
        "import sys\n"
        "import django\n"
        "django.setup()\n"
        + PROCESSES[process]
        + "loaded = sorted(m for m in ('tensorflow', 'keras') if m in sys.modules)\n"
        "print(loaded)\n"
        "sys.exit(1 if loaded else 0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "clockq.settings"},
    )  # fmt: skip
    assert done.returncode == 0, f"{process}: " + done.stdout + done.stderr


def _maps_mention_tensorflow(pid: int) -> bool:
    try:
        return "tensorflow" in Path(f"/proc/{pid}/maps").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.integration
def test_running_gpu_workers_have_not_loaded_tensorflow(start_workers):
    """Real GPU workers (`manage.py gpuworkers`, simulated GPUs), once ready: neither the
    launcher nor any worker process (nor its pool children) has TensorFlow's libraries mapped."""
    workers = start_workers(gpus=2)
    pids = [workers.proc.pid, *workers.worker_pids()]
    children = subprocess.run(["pgrep", "-P", ",".join(map(str, pids))], capture_output=True, text=True).stdout
    pids += [int(p) for p in children.split()]
    assert len(pids) >= 3
    assert Path(f"/proc/{pids[0]}/maps").is_file()
    assert [pid for pid in pids if _maps_mention_tensorflow(pid)] == []


def test_the_maps_check_sees_tensorflow_where_it_is_loaded():
    """The check above is not vacuous: a process that imports TensorFlow maps its libraries."""
    code = "import tensorflow, sys; sys.exit(0 if 'tensorflow' in open('/proc/self/maps').read() else 1)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
