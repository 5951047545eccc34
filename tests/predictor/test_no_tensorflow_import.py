"""Importing the predictor's pure parts (and its app) does not load TensorFlow: the web
process, beat and GPU workers install the app and must stay free of it."""

import os
import subprocess
import sys
from pathlib import Path

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
