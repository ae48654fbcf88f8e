# syntax=docker/dockerfile:1
# The llmobs sidecar (and the simulated engine: `llmobs sim`), non-root, health-checked.
#   docker build -t llmobs:0.1.0 .
#   docker run --rm -p 8080:8080 -p 9464:9464 -e LLMOBS_UPSTREAM=http://engine:8000 llmobs:0.1.0
# tests/deploy/test_deploy.py lints this file (pinned base, non-root USER, HEALTHCHECK, no remote
# ADD); .ci/pristine.py installs what it copies as it does and runs its commands and healthcheck.
FROM python:3.11.13-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY llmobs ./llmobs
# uvloop and orjson come with it: they cut the sidecar's CPU per token (docs/benchmarks.md).
RUN pip install . \
    && rm -rf /src \
    && groupadd --system --gid 10001 llmobs \
    && useradd --system --uid 10001 --gid llmobs --no-create-home --shell /usr/sbin/nologin llmobs

WORKDIR /
USER 10001:10001
EXPOSE 8080 9464

# /healthz on the metrics port answers while the sidecar runs (Kubernetes uses its own probes).
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('LLMOBS_METRICS_PORT', '9464'), timeout=2)"]

ENTRYPOINT ["llmobs"]
CMD ["serve"]
