# syntax=docker/dockerfile:1
# The control plane (canary serve, canary db upgrade) and the collectors.
#   docker build -f deploy/images/control-plane.Dockerfile -t canary-control-plane:0.1.0 .
# Build stage: a virtualenv with the package and every dependency (pip compiles them to
# bytecode as it installs, so a read-only root costs nothing at start); pip itself is
# removed from it at the end.
FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/canary
WORKDIR /src
# the project's pins (constraints.txt, decision 0054): the image holds the versions CI tested
COPY constraints.txt pyproject.toml README.md ./
COPY controlplane controlplane
COPY sidecar sidecar
COPY migrations migrations
RUN /opt/canary/bin/pip install --constraint constraints.txt . \
 && /opt/canary/bin/python -m pip uninstall --yes --quiet pip setuptools

# Run stage: the slim Python and the virtualenv, nothing else (no compiler, no pip cache).
FROM python:3.11-slim-bookworm
RUN groupadd --system --gid 10001 canary \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin canary
COPY --from=build /opt/canary /opt/canary
ENV PATH=/opt/canary/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 10001:10001
# 8443: the API (canary serve); 9101: its --admin /healthz, /metrics (the chart's);
# 9100: a collector's /healthz, /readyz, /metrics
EXPOSE 8443 9101 9100
ENTRYPOINT ["canary"]
CMD ["serve", "--listen", "0.0.0.0:8443"]
