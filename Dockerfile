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
COPY tools ./tools
RUN pip install -q . \
    && useradd --system --uid 10001 --no-create-home herd \
    && mkdir -p /data \
    && chown herd /data

# A named volume mounted at /data starts with this directory's ownership.
VOLUME /data
USER herd
WORKDIR /data
EXPOSE 9092

# Exec form: herd is the process that receives SIGTERM.
CMD ["herd", "serve", "--host", "0.0.0.0", "--port", "9092", "--data-dir", "/data"]
