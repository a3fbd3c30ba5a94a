FROM python:3.11-slim
WORKDIR /srv/txlog
COPY pyproject.toml README.md ./
COPY app ./app
COPY api ./api
COPY spark ./spark
COPY migrations ./migrations
COPY txlog ./txlog
RUN pip install --no-cache-dir .
EXPOSE 8080
CMD ["txlog", "serve", "--host", "0.0.0.0", "--port", "8080", "--workers", "2"]
