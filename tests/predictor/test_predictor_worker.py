"""The predictor worker as `make run` starts it: a forecast sent to the `predictor` queue (by
its route, as beat sends it) is made there, recorded and applied to the control state."""

from __future__ import annotations

import os

import pytest
from django.utils import timezone

from clockq.bus import heartbeat
from clockq.bus.client import client as broker
from clockq.celery import app
from clockq.control_state.models import ControlState
from clockq.forecasting.models import Forecast, MetricSample
from clockq.stack.roles import predictor_worker_argv
from tests.harness import ROOT, Service, wait_for
from tests.helpers import database_url

pytestmark = pytest.mark.integration


def test_a_forecast_sent_by_its_route_runs_on_the_predictor_worker(transactional_db, redis_server, tmp_path):
    MetricSample.objects.create(at=timezone.now().replace(microsecond=0), load_index=0.2, gpus=1)
    heartbeat.announce(broker(), {"hostname": "gpu0@hostA", "gpu": 0, "host": "hostA", "pid": 1, "started": 0.0})
    env = {**os.environ, "DATABASE_URL": database_url(), "REDIS_URL": redis_server.url}
    env["CLOCKQ_MODEL_DIR"] = str(tmp_path / "models")
    worker = Service("predictor worker", predictor_worker_argv(host="test"), env, ROOT, tmp_path / "predictor.log")
    worker.start()
    try:
        assert app.amqp.router.route({}, "clockq.forecast")["queue"].name == "predictor"
        app.send_task("clockq.forecast")  # no queue given: the route decides, as for beat's ticks
        wait_for(lambda: Forecast.objects.exists(), 60, interval=0.2, what="a forecast")
        row = Forecast.objects.get()
        assert row.model == "persistence" and row.value == pytest.approx(0.2)
        wait_for(lambda: ControlState.objects.filter(forecast=0.2).exists(), 10, what="the control state")
        assert ControlState.objects.get().prefetch_on  # 20% < 30%
    finally:
        worker.stop(grace_s=20)
        print(worker.log_text()[-4000:])
