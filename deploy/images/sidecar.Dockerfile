# syntax=docker/dockerfile:1
# The sidecar alone: the canary package without the control plane's dependencies.
#   docker build -f deploy/images/sidecar.Dockerfile -t canary-sidecar:0.1.0 .
FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# a C compiler: the proxy's per-request modules are compiled (mypyc, setup.py); only
# this stage has it, the run stage gets the built virtualenv
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install --yes --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/canary
WORKDIR /src
# at the project's pins (constraints.txt, decision 0054): the versions CI tested
COPY constraints.txt deploy/images/sidecar-requirements.txt ./
RUN /opt/canary/bin/pip install --constraint constraints.txt -r sidecar-requirements.txt
COPY pyproject.toml setup.py README.md ./
COPY controlplane controlplane
COPY sidecar sidecar
COPY migrations migrations
# --no-deps: the package's own dependencies are the control plane's; the sidecar's are
# above. CANARY_REQUIRE_COMPILED: a failed compile fails the image instead of leaving a
# pure-Python proxy, and the last line checks the compiled modules are the ones loaded.
RUN CANARY_REQUIRE_COMPILED=1 /opt/canary/bin/pip install --no-deps . \
 && /opt/canary/bin/python -I -c "import sidecar.compiled as c; assert c.IN_USE[0], c.IN_USE" \
 && /opt/canary/bin/python -m pip uninstall --yes --quiet pip setuptools

FROM python:3.11-slim-bookworm
RUN groupadd --system --gid 10001 canary \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin canary
COPY --from=build /opt/canary /opt/canary
ENV PATH=/opt/canary/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 10001:10001
# 15080: the proxy; 15081: /healthz, /readyz, /metrics (the ports `canary inject` uses)
EXPOSE 15080 15081
ENTRYPOINT ["canary", "sidecar"]
CMD ["--help"]
