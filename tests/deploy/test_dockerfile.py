"""The gateway image: the Dockerfile read as Docker reads it (offline), the dependency lock it installs
from, the build context the .dockerignore lets through, the wheel built from that context alone, and a
real ``docker build`` where a daemon and the base image are at hand."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
import uuid
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from agent_cache.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
LOCK_DIR = ROOT / "deploy" / "docker"
# a name part that says "secret": API_KEY, HF_TOKEN, REDIS_PASSWORD (not TIKTOKEN_CACHE_DIR)
SECRET_NAME = re.compile(r"(?:^|_)(?:KEYS?|TOKEN|SECRET|PASSWORD|PASSWD|PASS|CREDENTIALS?|REDIS_URL)(?:_|$)",
                         re.IGNORECASE)


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order: comments dropped, continuation lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


def _stages(instructions: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for ins in instructions:
        if ins[0] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(ins)
    return stages


def _dockerfile() -> list[tuple[str, str]]:
    return _instructions((ROOT / "Dockerfile").read_text())


def _base_image(instructions: list[tuple[str, str]]) -> str:
    args = dict(a.split("=", 1) for k, a in instructions if k == "ARG" and "=" in a)
    froms = [a.split()[0] for k, a in instructions if k == "FROM"]
    return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], froms[-1])


def test_multi_stage_on_slim_python_311_running_serve_as_a_non_root_user():
    instructions = _dockerfile()
    stages = _stages(instructions)
    assert len(stages) >= 2, "multi-stage: the build tools stay out of the runtime image"
    base = _base_image(instructions)
    assert re.fullmatch(r"python:3\.11-slim(-\w+)?", base), base
    final = stages[-1]
    assert any(k == "COPY" and a.startswith("--from=") for k, a in final), "the runtime copies the built environment"
    users = [a for k, a in final if k == "USER"]
    assert users, "the runtime stage sets USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"a numeric non-root UID (runAsNonRoot can check it), got {users[-1]}"
    order = [k for k, _ in final]
    assert order.index("USER") < order.index("ENTRYPOINT")

    entrypoint = json.loads(next(a for k, a in final if k == "ENTRYPOINT"))  # exec form: signals reach the server
    assert entrypoint == ["agent-cache", "serve"]
    assert 'agent-cache = "agent_cache.cli:main"' in (ROOT / "pyproject.toml").read_text()  # the command exists
    cmd = json.loads(next(a for k, a in final if k == "CMD"))
    args = build_parser().parse_args(["serve", *cmd])  # the default arguments are real serve flags
    assert args.host == "0.0.0.0" and args.port == 8000
    exposed = [a for k, a in final if k == "EXPOSE"]
    assert exposed == [str(args.port)]


def test_no_secret_is_baked_into_the_image():
    for kind, arg in _dockerfile():
        if kind in ("ENV", "ARG", "LABEL"):
            names = re.findall(r"(?:^|\s)([A-Za-z_][A-Za-z0-9_]*)=", " " + arg) or [arg.split("=")[0].split()[0]]
            assert not [n for n in names if SECRET_NAME.search(n)], (kind, arg)
        assert not re.search(r"rediss?://[^\s\"]*:[^\s\"@]*@", arg), (kind, arg)  # a URL with a password
        if kind in ("COPY", "ADD"):
            assert not re.search(r"keys|\.env|\.pem|secret", arg, re.IGNORECASE), (kind, arg)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _is_langchain(name: str) -> bool:
    return _canonical(name).startswith(("langchain", "langgraph", "langsmith"))


def _locked() -> dict[str, tuple[str, list[str]]]:
    """gateway-requirements.txt as {name: (version, hashes)}."""
    text = (LOCK_DIR / "gateway-requirements.txt").read_text()
    out = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", text):
        match = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", block)
        if match:
            out[_canonical(match.group(1))] = (match.group(2), re.findall(r"--hash=sha256:([0-9a-f]{64})", block))
    return out


def test_the_gateway_lock_is_the_runtime_dependencies_without_langchain_pinned_and_hashed():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["otel"]]
    gateway = {_canonical(r.name): r for r in runtime if not _is_langchain(r.name)}
    assert len(gateway) < len(runtime)  # the LangChain stack is left out
    lines = (LOCK_DIR / "gateway-requirements.in").read_text().splitlines()
    listed = {_canonical(Requirement(line).name): Requirement(line) for line in lines if line and line[0] != "#"}
    assert set(listed) == set(gateway)
    assert all(listed[name].extras == r.extras for name, r in gateway.items())  # redis[hiredis], uvicorn[standard]
    locked = _locked()
    for name, requirement in gateway.items():
        assert locked[name][0] in requirement.specifier, (name, locked[name][0], str(requirement.specifier))
    assert not [name for name in locked if _is_langchain(name)]
    assert not [name for name, (_, hashes) in locked.items() if not hashes], "every pin carries its hashes"


def test_dependencies_install_from_the_lock_in_their_own_layer_before_the_sources():
    build, runtime = _stages(_dockerfile())[0], _stages(_dockerfile())[-1]

    def first(kind: str, *parts: str) -> int:
        return next(i for i, (k, a) in enumerate(build) if k == kind and all(p in a for p in parts))

    copy_lock = first("COPY", "gateway-requirements.txt")
    install_lock = first("RUN", "-r gateway-requirements.txt")
    copy_sources = first("COPY", "agent_cache")
    install_package = first("RUN", "install --no-deps .")
    assert copy_lock < install_lock < copy_sources < install_package
    # only the lock precedes its layer: a change to the sources leaves the dependencies' layer cached
    assert [a for k, a in build[:install_lock] if k in ("COPY", "ADD")] == [build[copy_lock][1]]
    assert "--require-hashes" in build[install_lock][1] and "--no-deps" in build[install_lock][1]
    # no installer in what runs: the environment is made without pip, the base image's is removed
    assert any(k == "RUN" and "venv --without-pip" in a for k, a in build)
    assert any(k == "RUN" and re.search(r"pip uninstall .*\bpip\b.*\bsetuptools\b", a) for k, a in runtime)


def _ignore_rules() -> list[tuple[bool, re.Pattern[str]]]:
    """.dockerignore as Docker applies it: in order, the last matching rule wins, ``!`` re-includes,
    ``*`` stays within one path segment, ``**`` spans any, and a rule matching a directory covers
    what is under it."""
    rules = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keep = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        regex = ""
        for part in re.split(r"(\*\*/|\*\*|\*|\?)", pattern):
            regex += {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(part, re.escape(part))
        rules.append((keep, re.compile(regex + "(?:/.*)?")))
    return rules


def _in_context(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    included = True
    for keep, regex in rules:
        if regex.fullmatch(path):
            included = keep
    return included


def _context_files() -> list[str]:
    rules = _ignore_rules()
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    return [f for f in files if _in_context(f, rules)]


def test_the_build_context_holds_the_package_and_nothing_else():
    rules = _ignore_rules()
    context = _context_files()
    assert "pyproject.toml" in context and "README.md" in context
    assert "agent_cache/gateway/app.py" in context and "agent_cache/py.typed" in context
    for outside in ("tests/conftest.py", "docs/gateway.md", ".git/config", "Dockerfile", "deploy/kubernetes/gateway.yaml",
                    "keys.txt", ".env", "agent_cache/__pycache__/cli.cpython-311.pyc"):
        assert not _in_context(outside, rules), outside
    for kind, arg in _dockerfile():
        if kind == "COPY" and not arg.startswith("--from"):
            for source in arg.split()[:-1]:
                assert (ROOT / source).exists(), source
                assert _in_context(source, rules) or any(f.startswith(source + "/") for f in context), source


def test_the_wheel_builds_from_the_build_context_alone(tmp_path):
    context = tmp_path / "context"
    for f in _context_files():
        (context / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, context / f)
    out = tmp_path / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(context)], check=True, capture_output=True, text=True)
    (wheel,) = out.glob("agent_cache-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry_points = next(z.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    assert {"agent_cache/gateway/readiness.py", "agent_cache/cli.py", "agent_cache/py.typed"} <= names
    assert "agent-cache = agent_cache.cli:main" in entry_points
    assert not [n for n in names if n.startswith("tests/")]


def _docker_skip_reason(base: str) -> str | None:
    if shutil.which("docker") is None:
        return "no docker binary"
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    if info.returncode != 0:
        return "docker has no reachable daemon"
    image = subprocess.run(["docker", "image", "inspect", base], capture_output=True, text=True, timeout=30)
    if image.returncode != 0:
        return f"base image {base} is not present locally (docker pull {base} to run this test)"
    return None


def test_docker_build_gives_an_image_running_serve_as_non_root():
    base = _base_image(_dockerfile())
    reason = _docker_skip_reason(base)
    if reason is not None:
        pytest.skip(reason)
    tag = f"agent-cache-test:{uuid.uuid4().hex[:8]}"
    try:
        subprocess.run(["docker", "build", "-t", tag, str(ROOT)], check=True, timeout=1800)
        uid = subprocess.run(["docker", "run", "--rm", "--entrypoint", "id", tag, "-u"], capture_output=True,
                             text=True, check=True, timeout=120).stdout.strip()
        assert uid == "10001"
        help_text = subprocess.run(["docker", "run", "--rm", tag, "--help"], capture_output=True, text=True,
                                   check=True, timeout=120).stdout
        assert "--drain-timeout" in help_text and "--api-keys" in help_text  # the entrypoint is `serve`
    finally:
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True, timeout=120)
