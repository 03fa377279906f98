from django.db import models


class Report(models.Model):
    """A row the team's own task writes when it finishes (and a template's children too)."""

    name = models.CharField(max_length=100)
    value = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
