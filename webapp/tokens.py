"""API tokens: each user makes, rotates and revokes their own. Stored hashed (django-rest-knox), so a
token is shown once, when it is made, and the database never holds it in clear."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST
from knox.models import AuthToken

MAX_TOKENS_PER_USER = 20


def _drop_expired(user) -> None:
    """Expired tokens no longer work (webapp/auth.py refuses them); they go here, so they
    neither clutter the list nor count towards the limit."""
    AuthToken.objects.filter(user=user, expiry__lt=timezone.now()).delete()


@login_required
def token_list(request, new_token: str | None = None):
    _drop_expired(request.user)
    tokens = AuthToken.objects.filter(user=request.user).order_by("-created")
    return render(request, "webapp/tokens.html", {"tokens": tokens, "new_token": new_token})


@login_required
@require_POST
def token_create(request):
    _drop_expired(request.user)
    if AuthToken.objects.filter(user=request.user).count() >= MAX_TOKENS_PER_USER:
        messages.error(request, f"You already have {MAX_TOKENS_PER_USER} tokens; revoke one first.")
        return redirect("token-list")
    _instance, token = AuthToken.objects.create(user=request.user)
    # Shown in this response only: not in a redirect, a session or a message, which are stored.
    return token_list(request, new_token=token)


@login_required
@require_POST
def token_revoke(request, token_key: str):
    get_object_or_404(AuthToken, user=request.user, token_key=token_key).delete()
    messages.success(request, f"Token {token_key}… revoked.")
    return redirect("token-list")


@login_required
@require_POST
def token_rotate(request, token_key: str):
    """Replace a token in one step: the old one stops working and a new one is shown, once."""
    with transaction.atomic():
        old = get_object_or_404(AuthToken.objects.select_for_update(), user=request.user, token_key=token_key)
        old.delete()
        _instance, token = AuthToken.objects.create(user=request.user)  # the usual lifetime, from now
    messages.success(request, f"Token {token_key}… revoked; the new one is below.")
    return token_list(request, new_token=token)
