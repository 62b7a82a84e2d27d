# agent-cache gateway image: `agent-cache serve` as a non-root user.
#
#   docker build -t agent-cache:0.1.0 .
#   docker run --rm -p 8000:8000 agent-cache:0.1.0 --host 0.0.0.0 --workers http://gpu-1:30000
#
# Nothing secret is baked in: the API keys file, the Redis URL (with its
# password) and the workers' key come at run time (docs/deploying.md).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: the package and its dependencies in a virtual environment -------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/agent-cache
WORKDIR /src
# only what the wheel needs (.dockerignore keeps the rest out of the context)
COPY pyproject.toml README.md ./
COPY agent_cache ./agent_cache
# with the otel extra: tracing is then switched on by OTEL_* at run time (docs/gateway.md)
RUN /opt/agent-cache/bin/pip install ".[otel]" \
    && /opt/agent-cache/bin/python -c "import agent_cache.gateway, agent_cache.cli, agent_cache.telemetry.otel"

# --- runtime: the same base, the environment, no compiler, no sources ---------------
FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --system --gid 10001 agent-cache \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin agent-cache
COPY --from=build /opt/agent-cache /opt/agent-cache
# TIKTOKEN_CACHE_DIR empty: the bundled encoding is read in place, nothing is written
# (the image runs with a read-only root filesystem)
ENV PATH=/opt/agent-cache/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TIKTOKEN_CACHE_DIR=""
# numeric, so Kubernetes' runAsNonRoot can verify it
USER 10001:10001
EXPOSE 8000
ENTRYPOINT ["agent-cache", "serve"]
# the defaults listen on loopback only: in a container, every interface
CMD ["--host", "0.0.0.0", "--port", "8000"]
