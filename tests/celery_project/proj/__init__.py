from proj.celery import app

__all__ = ["app"]
