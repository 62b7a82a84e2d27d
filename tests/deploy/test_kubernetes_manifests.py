"""deploy/kubernetes: every manifest against the Kubernetes JSON schemas (bundled by
kubernetes-validate, no network), the wiring between them (selectors, named ports, worker names,
Secrets), and the gateway's probes answered by a real gateway started with the manifest's own flags,
in front of simulated workers and a Redis started with the manifest's own configuration."""

from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import kubernetes_validate
import pytest
import redis
import yaml
from kubernetes_validate.utils import latest_version

from agent_cache.processes import Processes, wait_until
from agent_cache.cli import build_parser
from agent_cache.gateway.authz import worker_id
from agent_cache.sim import SimFleet
from tests.conftest import NO_REDIS, free_port

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "deploy" / "kubernetes"
# the oldest Kubernetes these manifests are written for, and the newest schemas bundled
VERSIONS = ("1.28", latest_version())


def _load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _manifest_files() -> list[Path]:
    return sorted(p for p in MANIFESTS.glob("*.yaml") if p.name != "kustomization.yaml")


def _resources() -> list[dict[str, Any]]:
    return [d for p in _manifest_files() for d in _load(p)]


def _one(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in _resources() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def _container(workload: dict[str, Any]) -> dict[str, Any]:
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return container


def _port_number(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container["ports"] if p["name"] == port]
    return number


def _serve_args(container: dict[str, Any]) -> Any:
    return build_parser().parse_args(["serve", *container["args"]])  # exits on a flag serve does not have


def _probes(container: dict[str, Any]) -> dict[str, tuple[str, int]]:
    return {kind: (container[kind]["httpGet"]["path"], _port_number(container, container[kind]["httpGet"]["port"]))
            for kind in ("livenessProbe", "readinessProbe", "startupProbe") if kind in container}


# --- schemas ----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", _manifest_files(), ids=lambda p: p.name)
def test_every_manifest_validates_against_the_kubernetes_schemas(path, version):
    docs = _load(path)
    assert docs, path
    for doc in docs:
        # strict: a misspelt or misplaced field is an error, not silently dropped by the API server
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_refuses_a_broken_manifest():
    broken = _one("Deployment", "agent-cache-gateway")
    broken = yaml.safe_load(yaml.safe_dump(broken))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/ready"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, latest_version(), strict=True)


def test_the_kustomization_lists_every_manifest_and_renders():
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(p.name for p in _manifest_files())
    (image,) = kustomization["images"]
    assert _container(_one("Deployment", "agent-cache-gateway"))["image"].split(":")[0] == image["name"]
    if shutil.which("kubectl") is None:
        pytest.skip("no kubectl binary to render the kustomization")
    out = subprocess.run(["kubectl", "kustomize", str(MANIFESTS)], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    rendered = [d for d in yaml.safe_load_all(out) if d]
    assert len(rendered) == len(_resources())
    for doc in rendered:
        kubernetes_validate.validate(doc, latest_version(), strict=True)
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == kustomization["namespace"], doc["metadata"]
    gateway = next(d for d in rendered if d["kind"] == "Deployment" and d["metadata"]["name"] == "agent-cache-gateway")
    assert _container(gateway)["image"] == f"{image['newName']}:{image['newTag']}"


# --- the gateway ------------------------------------------------------------------------------


def _labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_gateway_deployment_replicas_probes_drain_and_its_service_and_budget():
    deployment = _one("Deployment", "agent-cache-gateway")
    spec, pod = deployment["spec"], deployment["spec"]["template"]["spec"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert spec["replicas"] >= 2
    assert _labels_match(spec["selector"]["matchLabels"], labels)
    container = _container(deployment)
    args = _serve_args(container)
    assert args.host == "0.0.0.0"  # the default, 127.0.0.1, is unreachable from the kubelet and the Service
    assert _probes(container) == {"livenessProbe": ("/health", args.port), "readinessProbe": ("/ready", args.port),
                                  "startupProbe": ("/health", args.port)}

    # SIGTERM comes after preStop; both count against the grace period, which must also leave the
    # process time to write its pending releases once the drain ends
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pre_stop = float(command[1])
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + args.drain_timeout + 5, (
        pod["terminationGracePeriodSeconds"], pre_stop, args.drain_timeout)
    assert "--drain-timeout" in container["args"]  # stated, so the two numbers are read side by side

    service = _one("Service", "agent-cache-gateway")
    assert _labels_match(service["spec"]["selector"], labels)
    (port,) = service["spec"]["ports"]
    assert _port_number(container, port["targetPort"]) == args.port
    budget = _one("PodDisruptionBudget", "agent-cache-gateway")
    assert _labels_match(budget["spec"]["selector"]["matchLabels"], labels)
    assert budget["spec"].get("maxUnavailable", 0) < spec["replicas"] or budget["spec"].get("minAvailable", 0) >= 1
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0


def test_secrets_come_from_secret_objects_never_from_argv():
    deployment = _one("Deployment", "agent-cache-gateway")
    pod = deployment["spec"]["template"]["spec"]
    container = _container(deployment)
    args = _serve_args(container)
    assert args.redis is None  # the Redis URL carries a password: from the environment, not argv
    env = {e["name"]: e for e in container["env"]}
    assert env["AGENT_CACHE_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": "agent-cache-redis", "key": "url"}
    assert env["AGENT_CACHE_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "agent-cache-workers"
    assert all("value" not in e for e in container["env"])
    # the API keys file is a file of a mounted Secret
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    keys_dir = os.path.dirname(args.api_keys)
    assert mounts[keys_dir]["readOnly"] is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mounts[keys_dir]["name"]]
    assert volume["secret"]["secretName"] == "agent-cache-api-keys"
    for doc in _resources():
        text = yaml.safe_dump(doc)
        assert not re.search(r"rediss?(\+\w+)?://[^\s'\"]*:[^\s'\"@]+@", text), doc["metadata"]["name"]
        assert doc["kind"] != "Secret", "no Secret with a value is shipped"
        for workload in [doc] if doc["kind"] in ("Deployment", "StatefulSet") else []:
            argv = " ".join(str(a) for a in _container(workload).get("args", []) + _container(workload).get(
                "command", []))
            assert not re.search(r"--(requirepass|api-key|password)\b", argv), (doc["metadata"]["name"], argv)


# --- the workers and Redis ---------------------------------------------------------------------


def _launch_line_flags() -> dict[str, str | None]:
    """docs/deploying-sglang.md's "A launch line" as flag -> value (None for a switch)."""
    text = (ROOT / "docs" / "deploying-sglang.md").read_text()
    block = text.split("## A launch line", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return _flags(shlex.split(block.replace("\\\n", " "))[3:])  # after python -m sglang.launch_server


def _flags(argv: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for i, token in enumerate(argv):
        if token.startswith("--"):
            following = argv[i + 1] if i + 1 < len(argv) else None
            out[token] = following if following is not None and not following.startswith("--") else None
    return out


def test_sglang_workers_run_the_documented_flags_on_a_gpu_behind_a_headless_service():
    workers = _one("StatefulSet", "sglang")
    container = _container(workers)
    assert container["command"] == ["python3", "-m", "sglang.launch_server"]
    documented = _launch_line_flags()
    assert "--enable-cache-report" in documented
    assert _flags(container["args"]) == documented  # the flags docs/deploying-sglang.md recommends, as given there
    assert int(container["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    service = _one("Service", workers["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None"
    assert _labels_match(service["spec"]["selector"], workers["spec"]["template"]["metadata"]["labels"])
    (svc_port,) = service["spec"]["ports"]
    port = _port_number(container, svc_port["targetPort"])
    assert port == int(documented["--port"] or 0)
    assert {p for p, _ in _probes(container).values()} == {"/health"}

    # the gateway discovers the StatefulSet's ready pods through the headless Service's DNS name
    gateway = _serve_args(_container(_one("Deployment", "agent-cache-gateway")))
    assert gateway.workers_dns == [f"{service['metadata']['name']}:{port}"] and not gateway.workers
    assert not service["spec"].get("publishNotReadyAddresses")  # a pod is listed once its /health answers


def test_redis_is_a_single_instance_for_trying_with_the_production_note():
    text = (MANIFESTS / "redis.yaml").read_text()
    assert "Sentinel" in text and "managed Redis" in text and "docs/deploying-redis.md" in text
    deployment = _one("Deployment", "redis")
    assert deployment["spec"]["replicas"] == 1
    env = {e["name"]: e for e in _container(deployment)["env"]}
    assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "agent-cache-redis", "key": "password"}
    service = _one("Service", "redis")
    assert _labels_match(service["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"])


# --- what a security review reads -----------------------------------------------------------------


def _workloads() -> list[dict[str, Any]]:
    return [d for d in _resources() if d["kind"] in ("Deployment", "StatefulSet")]


def test_every_workload_runs_non_root_on_a_read_only_root_with_a_pinned_image():
    assert {w["metadata"]["name"] for w in _workloads()} == {"agent-cache-gateway", "redis", "sglang"}
    for workload in _workloads():
        name, pod = workload["metadata"]["name"], workload["spec"]["template"]["spec"]
        context = pod["securityContext"]
        assert context["runAsNonRoot"] is True and context["runAsUser"] >= 10000, name  # above host system UIDs
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}, name
        container = _container(workload)
        assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                                "capabilities": {"drop": ["ALL"]}}, name
        image = container["image"]
        repository, _, tag = image.rpartition(":")
        assert repository and "/" not in tag and tag not in ("", "latest"), (name, image)
        assert pod["automountServiceAccountToken"] is False, name
        assert "memory" in container["resources"]["limits"], name


def _policies() -> list[dict[str, Any]]:
    return [d for d in _resources() if d["kind"] == "NetworkPolicy"]


def test_every_pod_has_a_network_policy_and_the_gateway_metrics_port_admits_only_monitoring():
    for workload in _workloads():
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert [p for p in _policies() if _labels_match(p["spec"]["podSelector"]["matchLabels"], labels)], labels
    deployment = _one("Deployment", "agent-cache-gateway")
    container = _container(deployment)
    args = _serve_args(container)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    rules = [rule for p in _policies() if _labels_match(p["spec"]["podSelector"]["matchLabels"], labels)
             for rule in p["spec"]["ingress"]]

    def admitting(port: int) -> list[dict[str, Any]]:
        return [r for r in rules if port in [_port_number(container, p["port"]) for p in r.get("ports", [])]]

    assert [r for r in admitting(args.port) if "from" not in r]  # callers come from anywhere: keys decide
    metrics = admitting(args.metrics_port)
    assert metrics and all(r.get("from") for r in metrics)
    for rule in metrics:  # /metrics there needs no key and its series name the workers
        assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    assert not [r for r in rules if not r.get("ports")], "a rule without ports would open the metrics port too"


def test_each_scanner_exception_names_its_check_and_says_why():
    skips = [re.fullmatch(r"(CKV2?_K8S_\d+)=(.*)", v) for d in _resources()
             for k, v in d["metadata"].get("annotations", {}).items() if k.startswith("checkov.io/skip")]
    skips += list(re.finditer(r"checkov:skip=(CKV2?_DOCKER_\d+):(.*)", (ROOT / "Dockerfile").read_text()))
    assert skips
    for skip in skips:
        assert skip is not None and len(skip.group(2).split()) >= 5, skip  # a reason, not a bare id


# --- the real thing: the manifests' processes on loopback ----------------------------------------


@pytest.fixture
def manifest_redis() -> Iterator[str]:
    """Redis started with the manifest's own command and configuration (its port moved to a free one);
    yields the URL as the agent-cache-redis Secret's `url` key holds it."""
    if shutil.which("redis-server") is None:  # the manifest's script runs it by name
        pytest.skip(NO_REDIS)
    container = _container(_one("Deployment", "redis"))
    script = container["args"][0]
    port = free_port()
    assert "port 6379\n" in script
    script = script.replace("port 6379\n", f"port {port}\nbind 127.0.0.1\n")
    password = secrets.token_hex(16)  # what `openssl rand -hex 24` gives in docs/deploying.md: URL-safe
    env = {**os.environ, "REDIS_PASSWORD": password}
    proc = subprocess.Popen([*container["command"], script], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, cwd=os.getcwd())
    try:
        client = redis.Redis(port=port, password=password, socket_timeout=0.5)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "volatile-lru"}
        client.close()
        with pytest.raises(redis.AuthenticationError):  # a password is required
            redis.Redis(port=port, socket_timeout=0.5).ping()
        yield f"redis://:{password}@127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.slow
def test_the_probe_paths_answer_200_on_a_gateway_started_with_the_manifest_flags(manifest_redis, tmp_path,
                                                                                  monkeypatch):
    deployment = _one("Deployment", "agent-cache-gateway")
    container = _container(deployment)
    argv = list(container["args"])
    probes = _probes(container)
    port = free_port()
    keys = tmp_path / "keys.txt"
    keys.write_text("sk-test-key team-a\nsk-test-admin ops role=admin\n")

    def replace(flag: str, value: str) -> None:
        argv[argv.index(flag) + 1] = value

    with SimFleet(2) as fleet, Processes() as procs:
        # what differs on loopback: the worker names, the port, where the mounted Secret file lies
        hosts = tmp_path / "hosts"  # the headless Service's name, answered by a hosts file instead of DNS
        name, _, _ = argv[argv.index("--workers-dns") + 1].partition(":")
        hosts.write_text(f"127.0.0.1 {name}\n")
        replace("--workers-dns", f"{name}:{fleet.urls[0].rsplit(':', 1)[1]}")
        argv += ["--workers-dns-hosts", str(hosts)]
        replace("--port", str(port))
        replace("--host", "127.0.0.1")
        replace("--api-keys", str(keys))
        metrics_port = free_port()
        replace("--metrics-port", str(metrics_port))
        env_names = {e["name"] for e in container["env"]}
        assert "AGENT_CACHE_REDIS_URL" in env_names
        monkeypatch.setenv("AGENT_CACHE_REDIS_URL", manifest_redis)  # as the Secret sets it
        proc = procs.start("serve", [sys.executable, "-m", "agent_cache.cli", "serve", *argv])
        url = f"http://127.0.0.1:{port}"
        # every probe, on the port the manifest names (moved with --port), answers 200
        paths = {path for path, probe_port in probes.values()}
        assert {probe_port for _, probe_port in probes.values()} == {_serve_args(container).port}
        for path in sorted(paths):
            wait_until(lambda: httpx.get(url + path, timeout=2.0).status_code == 200, [proc], f"GET {path}",
                       timeout=60.0)
        assert httpx.get(url + "/ready").json() == {"status": "ready"}  # the detail is an admin's
        ready = httpx.get(url + "/ready", headers={"authorization": "Bearer sk-test-admin"}).json()
        assert ready == {"status": "ready", "store": "ok"}  # it reached the manifest's Redis with the password
        assert httpx.get(url + "/readyz").status_code == 404  # a path the gateway does not serve fails
        # Prometheus scrapes the annotated port without a key; the main port's /metrics wants an admin key
        assert deployment["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == str(
            _serve_args(container).metrics_port)
        assert "agent_cache_gateway_inflight" in httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
        assert httpx.get(url + "/metrics").status_code == 401
        call = httpx.post(url + "/v1/chat/completions", headers={"authorization": "Bearer sk-test-key"},
                          json={"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
        assert call.status_code == 200 and call.headers["x-agent-cache-worker"] in map(worker_id, fleet.urls)
        assert httpx.post(url + "/v1/chat/completions", json={"model": "m", "messages": []}).status_code == 401
