# syntax=docker/dockerfile:1
# Stage 1 builds wheels for se-exporter and its dependencies; stage 2 installs only those wheels,
# so the runtime image carries no compiler, no pip cache and no source tree.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY se_exporter ./se_exporter
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
LABEL org.opencontainers.image.title="se-exporter" \
      org.opencontainers.image.description="Read-only sidecar exposing Azure Scheduled Events as Prometheus metrics" \
      org.opencontainers.image.licenses="MIT"
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index /wheels/*.whl && rm -rf /wheels \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin se-exporter \
    && install -d -o 10001 -g 10001 -m 0750 /var/lib/se-exporter
USER 10001:10001
EXPOSE 10169
# State (open lifecycles, forwarding sequence, spool) is the only thing written: mount a volume there and the
# root filesystem can be read-only (docker run --read-only -v se-exporter:/var/lib/se-exporter ...).
VOLUME ["/var/lib/se-exporter"]
# Listens on all interfaces inside the container; publish the port only where Prometheus can reach it.
ENV SE_EXPORTER_LISTEN=:10169 SE_EXPORTER_STATE_DIR=/var/lib/se-exporter PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:10169/healthz', timeout=2)"]
# Exec form: se-exporter runs as PID 1 and receives SIGTERM itself, so it flushes and stops cleanly.
ENTRYPOINT ["se-exporter"]
CMD ["run"]
