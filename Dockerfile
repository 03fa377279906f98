# One image for every dtask service (migrate, worker, beat, flower).
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml README.md celeryconfig.py alembic.ini ./
COPY dtask ./dtask
COPY migrations ./migrations
# Editable, so `migrations/` stays next to the package where dtask finds it.
RUN pip install --no-cache-dir -e . && useradd --create-home dtask
USER dtask
ENTRYPOINT ["dtask"]
CMD ["--help"]
