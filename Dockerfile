FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY protocol ./protocol
COPY coordinator ./coordinator
COPY client ./client
COPY admin ./admin
COPY herd_cli.py ./
COPY tools ./tools
RUN pip install -q . \
    && useradd --system --uid 10001 --no-create-home herd \
    && mkdir -p /data \
    && chown herd /data

# A named volume mounted at /data starts with this directory's ownership.
VOLUME /data
USER herd
WORKDIR /data

# The image's settings are environment variables, not flags in CMD: flags win over HERD_*
# variables, so `docker run -e HERD_PORT=...` (or a Kubernetes env:) would be silently ignored.
# The HTTP endpoint (/healthz, /readyz, /metrics) listens on every interface so that probes and
# Prometheus can reach it; HERD_ADVERTISED_HOST must be set for clients outside the container.
ENV HERD_HOST=0.0.0.0 \
    HERD_PORT=9092 \
    HERD_DATA_DIR=/data \
    HERD_METRICS_HOST=0.0.0.0 \
    HERD_METRICS_PORT=9404
EXPOSE 9092 9404

# Exec form: herd is the process that receives SIGTERM (as PID 1 it handles it from its start).
CMD ["herd", "serve"]
