from django.apps import AppConfig


class ControlStateConfig(AppConfig):
    name = "clockq.control_state"
    label = "control_state"
    verbose_name = "clockq control state"
