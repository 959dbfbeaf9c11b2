"""`python -m fsm_celery` runs the command line."""

from fsm_celery.cli import main

main()
