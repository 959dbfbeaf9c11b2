"""The Celery side: the app and thin tasks that take ids and call the engine."""
