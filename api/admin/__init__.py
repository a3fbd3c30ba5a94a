"""The admin pages: operators see the log, the producers and every transaction's life, and can
abort a hanging transaction. A FastAPI sub-application mounted at ``/admin``, rendered on the
server (Jinja2, inline SVG, no JavaScript), calling the same services as the API."""

from __future__ import annotations

from fastapi import FastAPI

from app.services import Broker

PREFIX = "/admin"


def mount(app: FastAPI, broker: Broker) -> None:
    from api.admin.auth import TokenAuthorizer
    from api.admin.site import create_admin

    app.mount(PREFIX, create_admin(broker, TokenAuthorizer(broker.settings.admin_token)), name="admin")
