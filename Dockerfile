# One image for every dtask service (migrate, worker, beat, flower, api), from the wheel: the
# migrations ship inside it, and the embedded PostgreSQL/Redis (dtask[local]) stay out.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY dtask ./dtask
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir "$(ls /wheels/dtask-*.whl)[flower,api]" && rm -rf /wheels \
    && useradd --create-home dtask
USER dtask
WORKDIR /home/dtask
ENTRYPOINT ["dtask"]
CMD ["--help"]
