from django.apps import AppConfig


class ControlConfig(AppConfig):
    name = "control"
    label = "control"
    verbose_name = "clockq control plane"
