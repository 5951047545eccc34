from django.apps import AppConfig


class PredictorConfig(AppConfig):
    name = "predictor"
    label = "predictor"
    verbose_name = "clockq load predictor"
