"""The load predictor's storage: the load history it learns from, its trained models, its forecasts."""

from __future__ import annotations

from django.db import models


class MetricSample(models.Model):
    """The cluster's load at one moment, recorded by a beat task (clockq/forecasting/load_history.py)
    every CLOCKQ_LOAD_SAMPLE_EVERY_S: the history the load predictor trains on. Shares are 0..1;
    a reading no host gave is empty."""

    at = models.DateTimeField(unique=True, help_text="When it was taken, to the second.")
    gpu_util = models.FloatField(null=True, blank=True, help_text="Mean SM busy over the GPUs that report it.")
    cpu = models.FloatField(null=True, blank=True, help_text="Mean CPU load over the GPU hosts.")
    memory = models.FloatField(null=True, blank=True, help_text="Mean memory use over the GPU hosts.")
    queue_depth = models.JSONField(default=dict, blank=True, help_text="Queued jobs by current tier: {tier: n}.")
    held = models.PositiveIntegerField(default=0, help_text="Jobs held for admission (not counted as demand).")
    running_gpus = models.PositiveIntegerField(default=0, help_text="Busy GPUs: jobs running.")
    waiting_gpus = models.PositiveIntegerField(default=0, help_text="GPUs that queued jobs ask for.")
    gpus = models.PositiveIntegerField(default=0, help_text="Capacity: GPU workers alive.")
    load_index = models.FloatField(
        null=True, blank=True, help_text="(running + waiting GPUs) / GPUs, at most 2 (clockq/policy/load.py)."
    )
    hosts = models.JSONField(
        default=dict, blank=True, help_text="Per host: {host: {gpus, gpu_util, cpu, memory, busy}}."
    )

    class Meta:
        db_table = "jobs_metricsample"  # the table it had in clockq.jobs
        ordering = ["-at"]

    def __str__(self) -> str:
        index = "-" if self.load_index is None else f"{self.load_index:.2f}"
        return f"load {index} at {self.at:%Y-%m-%d %H:%M:%S}"


class ModelVersion(models.Model):
    """One model trained by a run of the load predictor's training (predictor/live.py): an
    LSTM or a linear model, its saved file, its validation MAE next to persistence's and
    linear's on the same held-out part, and what the run chose (`chosen`: persistence, linear or
    lstm, by predictor.evaluation.select_champion). Each run writes one row per trained model;
    at most one row in the table `is_champion`, the one that serves. When a run chooses
    persistence, no row is the champion and the forecast is persistence."""

    KINDS = [("lstm", "LSTM"), ("linear", "linear")]

    created_at = models.DateTimeField(auto_now_add=True)
    kind = models.CharField(max_length=10, choices=KINDS, default="lstm")
    path = models.CharField(max_length=500, blank=True, default="", help_text="The saved .keras file (empty: none).")
    train_windows = models.PositiveIntegerField(default=0)
    validation_windows = models.PositiveIntegerField(default=0)
    test_windows = models.PositiveIntegerField(default=0)
    samples = models.PositiveIntegerField(default=0, help_text="Load samples the run read.")
    validation_mae = models.FloatField(null=True, blank=True, help_text="This model's validation MAE.")
    persistence_mae = models.FloatField(null=True, blank=True)
    linear_mae = models.FloatField(null=True, blank=True)
    test_metrics = models.JSONField(default=dict, blank=True, help_text="{model: {mae, rmse, bucket_accuracy}}.")
    chosen = models.CharField(
        max_length=12, default="persistence", help_text="What this run chose: persistence, linear or lstm."
    )
    is_champion = models.BooleanField(default=False, help_text="This model serves the forecasts.")
    training_seconds = models.FloatField(default=0.0)
    notes = models.TextField(blank=True, default="")

    class Meta:
        db_table = "jobs_modelversion"  # the table it had in clockq.jobs
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.kind} model {self.pk}" + (" (champion)" if self.is_champion else "")


class Forecast(models.Model):
    """One forecast of the load index `horizon_s` ahead, made at `at` from the samples up to
    `input_at`, by `model` (persistence, linear or lstm, with the ModelVersion that served)."""

    at = models.DateTimeField()
    horizon_s = models.PositiveIntegerField()
    value = models.FloatField(help_text="The forecast load index.")
    model = models.CharField(max_length=12)
    version = models.ForeignKey(ModelVersion, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    reason = models.TextField(blank=True, default="")
    input_at = models.DateTimeField(null=True, blank=True, help_text="The newest load sample it read.")
    latency_ms = models.FloatField(null=True, blank=True)

    class Meta:
        db_table = "jobs_forecast"  # the table it had in clockq.jobs
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["at"])]

    def __str__(self) -> str:
        return f"forecast {self.value:.2f} by {self.model} at {self.at:%Y-%m-%d %H:%M:%S}"
