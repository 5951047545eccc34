"""python manage.py createtoken USERNAME: make an API token for a user and print it once."""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from knox.models import AuthToken


class Command(BaseCommand):
    help = "Create an API token for USERNAME and print it. It is stored hashed: save it now."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--days", type=int, default=None, help="lifetime in days (default: the setting)")

    def handle(self, *args, username: str, days: int | None, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user named {username!r}")
        if days is not None and not 1 <= days <= 3650:
            raise CommandError("--days must be between 1 and 3650")
        kwargs = {} if days is None else {"expiry": timedelta(days=days)}
        _instance, token = AuthToken.objects.create(user=user, **kwargs)
        self.stdout.write(token)
