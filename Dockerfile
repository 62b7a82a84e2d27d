# agent-cache gateway image: `agent-cache serve` as a non-root user, without the LangChain stack.
#
#   IMAGE=registry.example.com/agent-cache:0.1.0
#   docker build -t "$IMAGE" .
#   docker run --rm -p 8000:8000 "$IMAGE" --host 0.0.0.0 --workers http://gpu-1:30000
#
# Nothing secret is baked in: the API keys file, the Redis URL (with its
# password) and the workers' key come at run time (docs/deploying.md).
#
# Kubernetes probes /health and /ready itself (deploy/kubernetes/gateway.yaml) and ignores
# HEALTHCHECK; a fixed port here would be wrong for any other --port:
# checkov:skip=CKV_DOCKER_2: the orchestrator's probes are the health check
# checkov cannot read the tag through the build argument below; it is a versioned tag:
# checkov:skip=CKV_DOCKER_7: PYTHON_IMAGE names python 3.11; pin a digest with --build-arg

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: the dependencies, then the package, in a virtual environment without pip ----
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# no pip in the environment the runtime gets: the base image's pip installs into it
RUN python -m venv --without-pip /opt/agent-cache
WORKDIR /src
# the dependencies first, pinned and hashed: this layer is rebuilt only when the lock changes,
# not on every change to the sources (deploy/docker/gateway-requirements.in says what is in it)
COPY deploy/docker/gateway-requirements.txt ./
RUN pip --python /opt/agent-cache/bin/python install --no-deps --require-hashes -r gateway-requirements.txt
# then the package alone: --no-deps keeps its LangChain dependencies (for ChatSGLang, which the
# gateway does not run) out of the image
COPY pyproject.toml README.md ./
COPY agent_cache ./agent_cache
RUN pip --python /opt/agent-cache/bin/python install --no-deps . \
    && /opt/agent-cache/bin/python -c "import agent_cache.gateway, agent_cache.cli, agent_cache.telemetry.otel" \
    && ! /opt/agent-cache/bin/python -c "import langchain_core" 2>/dev/null

# --- runtime: the same base, the environment, no compiler, no sources, no pip ------------
FROM ${PYTHON_IMAGE} AS runtime
# the base image's own installers are not needed to run, only to be misused
RUN python -m pip uninstall --yes --no-cache-dir pip setuptools wheel \
    && groupadd --system --gid 10001 agent-cache \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin agent-cache
COPY --from=build /opt/agent-cache /opt/agent-cache
# TIKTOKEN_CACHE_DIR empty: the bundled encoding is read in place, nothing is written
# (the image runs with a read-only root filesystem). hadolint reads "TOKEN" in its name as a secret:
# hadolint ignore=DL3064
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
