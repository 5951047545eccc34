from django.apps import AppConfig


class ForecastingConfig(AppConfig):
    name = "clockq.forecasting"
    label = "forecasting"
    verbose_name = "clockq load forecasts"
