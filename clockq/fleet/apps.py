from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "clockq.fleet"
    label = "fleet"
    verbose_name = "clockq hosts and GPU workers"
