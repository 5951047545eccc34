"""python manage.py ensureadmin: make sure the `admin` superuser exists and print its password."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from clockq.env import persistent_secret

ADMIN_USERNAME = "admin"


def admin_password() -> tuple[str, str]:
    """The password to use, and where it came from."""
    if settings.CLOCKQ_ADMIN_PASSWORD:
        return settings.CLOCKQ_ADMIN_PASSWORD, "CLOCKQ_ADMIN_PASSWORD"
    path = settings.VAR_DIR / "admin-password"
    return persistent_secret(path, nbytes=12), str(path)


class Command(BaseCommand):
    help = "Create the admin superuser (password from CLOCKQ_ADMIN_PASSWORD, or generated once and kept in var/)."

    def handle(self, *args, **options):
        password, source = admin_password()
        users = get_user_model()
        user = users.objects.filter(username=ADMIN_USERNAME).first()
        if user is None:
            users.objects.create_superuser(ADMIN_USERNAME, "", password)
            self.stdout.write(f"created user {ADMIN_USERNAME!r} with the password from {source}")
        elif settings.CLOCKQ_ADMIN_PASSWORD:
            # An explicit password is the operator's wish: apply it on every start.
            user.set_password(password)
            user.is_staff = user.is_superuser = True
            user.save()
            self.stdout.write(f"set the password of {ADMIN_USERNAME!r} from CLOCKQ_ADMIN_PASSWORD")
        else:
            self.stdout.write(f"user {ADMIN_USERNAME!r} exists; its password is unchanged")
