# syntax=docker/dockerfile:1
# Stage 1 downloads the locked wheels (requirements/runtime.txt, every file checked against its hash) and builds
# se-exporter's own; stage 2 installs only those, read through a bind mount of stage 1 (no layer keeps them), with
# hashes required and no index, so the runtime image carries no compiler, no pip cache, no wheels and no source
# tree. Stage 3 writes the SBOM of what stage 2 installed (cyclonedx-py, from requirements/sbom.txt, run in a
# virtualenv of its own that the image never gets); the image carries only the SBOM file. Build it with
# `make image` (docker, or buildah where no daemon runs).
# BASE: any Debian-based image with python and pip on PATH where pip may install; the suite passes a stand-in
# built from Debian's packages (no image registry is reachable there). Users change nothing.
ARG BASE=python:3.11-slim

FROM ${BASE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY requirements/runtime.txt requirements/sbom.txt ./requirements/
COPY se_exporter ./se_exporter
# The host's package index settings and CA bundle arrive as build secrets (make image reads them from the host's
# pip configuration): mounted for this step only, stored in no layer. Without them pip uses its defaults.
RUN --mount=type=secret,id=pip.conf --mount=type=secret,id=ca-bundle \
    PIP_CONFIG_FILE=/run/secrets/pip.conf pip download --no-cache-dir --require-hashes --only-binary=:all: \
      --dest /wheels/locked -r requirements/runtime.txt \
    && PIP_CONFIG_FILE=/run/secrets/pip.conf pip wheel --no-cache-dir --no-deps --wheel-dir /wheels/own . \
    && PIP_CONFIG_FILE=/run/secrets/pip.conf pip download --no-cache-dir --require-hashes --only-binary=:all: \
      --dest /wheels/sbom-tool -r requirements/sbom.txt

FROM ${BASE} AS runtime
LABEL org.opencontainers.image.title="se-exporter" \
      org.opencontainers.image.description="Read-only sidecar exposing Azure Scheduled Events as Prometheus metrics" \
      org.opencontainers.image.licenses="MIT" \
      org.opencontainers.image.sbom="/usr/share/doc/se-exporter/sbom.cdx.json"
# The locked dependencies with hashes required and no index; then se-exporter's own wheel, built above from this
# checkout, alone (--no-deps: nothing else can come with it).
RUN --mount=type=bind,from=build,source=/wheels,target=/tmp/wheels \
    --mount=type=bind,from=build,source=/src/requirements,target=/tmp/requirements \
    pip install --no-cache-dir --no-index --find-links /tmp/wheels/locked --require-hashes \
      -r /tmp/requirements/runtime.txt \
    && pip install --no-cache-dir --no-index --no-deps /tmp/wheels/own/*.whl \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin se-exporter \
    && install -d -o 10001 -g 10001 -m 0750 /var/lib/se-exporter

FROM runtime AS sbom
COPY scripts/sbom.py /tmp/sbom.py
RUN --mount=type=bind,from=build,source=/wheels,target=/tmp/wheels \
    --mount=type=bind,from=build,source=/src/requirements,target=/tmp/requirements \
    python -m venv /tmp/sbom-tool \
    && /tmp/sbom-tool/bin/pip install --no-cache-dir --no-index --find-links /tmp/wheels/sbom-tool \
      --require-hashes -r /tmp/requirements/sbom.txt \
    && /tmp/sbom-tool/bin/cyclonedx-py environment --output-reproducible --of JSON -o /tmp/sbom.cdx.json \
      "$(command -v python)" \
    && python /tmp/sbom.py add-hashes /tmp/sbom.cdx.json /tmp/wheels/locked \
    && python /tmp/sbom.py add-hashes /tmp/sbom.cdx.json /tmp/wheels/own

FROM runtime
# What is installed in this image, as CycloneDX JSON (the label org.opencontainers.image.sbom names it).
COPY --from=sbom /tmp/sbom.cdx.json /usr/share/doc/se-exporter/sbom.cdx.json
USER 10001:10001
EXPOSE 10169
# State (open lifecycles, forwarding sequence, spool) is the only thing written: mount a volume there and the
# root filesystem can be read-only (docker run --read-only -v se-exporter:/var/lib/se-exporter ...).
VOLUME ["/var/lib/se-exporter"]
# Listens on all interfaces inside the container; publish the port only where Prometheus can reach it. Change the
# address with SE_EXPORTER_LISTEN (not --listen): the HEALTHCHECK reads it.
ENV SE_EXPORTER_LISTEN=:10169 SE_EXPORTER_STATE_DIR=/var/lib/se-exporter PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# Asks /healthz where SE_EXPORTER_LISTEN says (a wildcard address is asked on loopback), never through a proxy.
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s \
  CMD ["python", "-c", "import os, urllib.request as u; h, _, p = os.environ['SE_EXPORTER_LISTEN'].rpartition(':'); h = {'': '127.0.0.1', '0.0.0.0': '127.0.0.1', '[::]': '[::1]'}.get(h, h); u.build_opener(u.ProxyHandler({})).open(f'http://{h}:{p}/healthz', timeout=2)"]
# Exec form: se-exporter runs as PID 1 and receives SIGTERM itself, so it flushes and stops cleanly.
ENTRYPOINT ["se-exporter"]
CMD ["run"]
