FROM python:3.11-slim
WORKDIR /srv/txlog
COPY pyproject.toml setup.py README.md ./
COPY app ./app
COPY api ./api
COPY spark ./spark
COPY migrations ./migrations
COPY txlog ./txlog
# gcc for the C part (app/_native.c), removed once it is built
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install --no-cache-dir . \
    && apt-get purge -y gcc libc6-dev && apt-get autoremove -y && rm -rf /var/lib/apt/lists/*
EXPOSE 8080
# Listening beyond loopback needs authentication: every /v1 request carries a principal's token.
# TXLOG_ADMIN_TOKEN (if set) is the principal admin; more with `txlog principals create`.
ENV TXLOG_AUTH=token
CMD ["txlog", "serve", "--host", "0.0.0.0", "--port", "8080", "--workers", "2"]
