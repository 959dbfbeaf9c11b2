FROM python:3.11-slim
# pgrep, for the beat and ack-bridge health checks in docker-compose.yml (slim leaves procps out)
RUN apt-get update && apt-get install -y --no-install-recommends procps \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md celeryconfig.py ./
COPY fsm_celery ./fsm_celery
COPY definitions ./definitions
RUN pip install --no-cache-dir ".[mcp,otel]"
CMD ["fsm-celery", "--help"]
