"""The admin pages: operators see the log, the producers and every transaction's life, and can
abort a hanging transaction. A FastAPI sub-application mounted at ``/admin``, rendered on the
server (Jinja2, inline SVG, no JavaScript), calling the same services as the API."""

from __future__ import annotations

from fastapi import FastAPI

from app.services import Broker

PREFIX = "/admin"


def mount(app: FastAPI, broker: Broker) -> None:
    from api.admin.auth import Authorizer, PrincipalAuthorizer, TokenAuthorizer
    from api.admin.site import create_admin
    from app.services import security

    acls = getattr(app.state, "authorizer", None)
    authorizer: Authorizer
    if acls is not None:  # TXLOG_AUTH=token: principals sign in, their ACLs decide
        authorizer = PrincipalAuthorizer(acls, security.session_key(broker.db))
    else:
        authorizer = TokenAuthorizer(broker.settings.admin_token)
    app.mount(PREFIX, create_admin(broker, authorizer), name="admin")
