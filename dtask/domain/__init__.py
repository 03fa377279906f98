"""Pure domain: templates, parameters, splitting, run states, schedules, the child context.

Imports nothing of dtask but ``dtask.exceptions``, and neither Celery nor SQLAlchemy.
"""
