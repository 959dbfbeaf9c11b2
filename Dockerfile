FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md celeryconfig.py ./
COPY fsm_celery ./fsm_celery
COPY definitions ./definitions
RUN pip install --no-cache-dir .
ENV FSM_DEFINITIONS_PATH=/app/definitions
CMD ["fsm-celery", "--help"]
