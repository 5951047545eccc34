from django.apps import AppConfig


class KpisConfig(AppConfig):
    name = "clockq.kpis"
    label = "kpis"
    verbose_name = "clockq KPIs"
