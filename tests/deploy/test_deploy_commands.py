"""The README's and docs/deploying.md's Kubernetes commands, run as written by bash on a copy of
deploy/kubernetes, with stand-ins for `docker` and the cluster (`kubectl apply`): the image that is
built must be the one pushed and the one the rendered manifests name. The kustomization is rendered
by `kubectl kustomize` where kubectl is installed, else by applying its `images:` entries as kustomize
does; `kustomize edit set image` is the real binary where installed, else a stand-in that writes the
entry as kustomize does."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
BUILT = "agent-cache"  # the image name the manifests use for the Dockerfile's image

# appends its argv to $DEPLOY_LOG as one JSON line: docker and kubectl apply
RECORD = """#!{python}
import json, os, sys
with open(os.environ["DEPLOY_LOG"], "a") as log:
    log.write(json.dumps({{"argv": [os.path.basename(sys.argv[0]), *sys.argv[1:]], "cwd": os.getcwd()}}) + "\\n")
"""
# `kustomize edit set image NAME=IMAGE` as kustomize writes it: newName, then newTag or digest
KUSTOMIZE = """#!{python}
import sys, yaml
assert sys.argv[1:4] == ["edit", "set", "image"], sys.argv
for spec in sys.argv[4:]:
    name, _, image = spec.partition("=")
    if "@" in image:
        new_name, _, digest = image.partition("@")
        entry = {{"name": name, "newName": new_name, "digest": digest}}
    else:
        head, _, tag = image.rpartition(":")
        new_name, tag = (head, tag) if head and "/" not in tag else (image, None)
        entry = {{"name": name, "newName": new_name, **({{"newTag": tag}} if tag else {{}})}}
    with open("kustomization.yaml") as f:
        doc = yaml.safe_load(f)
    doc["images"] = [e for e in doc.get("images", []) if e["name"] != name] + [entry]
    with open("kustomization.yaml", "w") as f:
        yaml.safe_dump(doc, f)
"""


def _block(path: str, heading: str) -> str:
    """The first ```bash block after ``heading``."""
    text = (ROOT / path).read_text()
    return text.split(heading, 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]


def _run(script: str, tmp_path: Path) -> tuple[list[dict[str, Any]], Path]:
    """Runs ``script`` with bash in a copy of the repository's deploy/ directory; returns the commands
    the stand-ins saw and the copy."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "deploy", repo / "deploy")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stubs = {"docker": RECORD, "kubectl": RECORD}
    if shutil.which("kustomize") is None:
        stubs["kustomize"] = KUSTOMIZE
    for name, code in stubs.items():
        (bin_dir / name).write_text(code.format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "commands.jsonl"
    log.touch()
    path = f"{bin_dir}:/usr/bin:/bin" + (f":{Path(shutil.which('kustomize') or '').parent}"
                                         if "kustomize" not in stubs else "")
    subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=repo, check=True, timeout=60,
                   env={"PATH": path, "DEPLOY_LOG": str(log), "HOME": str(tmp_path)})
    return [json.loads(line) for line in log.read_text().splitlines()], repo


def _render(directory: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is not None:
        out = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, check=True,
                             timeout=60).stdout
        return [d for d in yaml.safe_load_all(out) if d]
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    docs = [d for r in kustomization["resources"] for d in yaml.safe_load_all((directory / r).read_text()) if d]
    for doc in docs:
        for container in doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            for entry in kustomization.get("images", []):
                if container["image"].split("@")[0].rsplit(":", 1)[0] == entry["name"]:
                    image = entry.get("newName", entry["name"])
                    container["image"] = image + (f"@{entry['digest']}" if "digest" in entry
                                                  else f":{entry['newTag']}" if "newTag" in entry else "")
    return docs


def _gateway_image(docs: list[dict[str, Any]]) -> str:
    (gateway,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "agent-cache-gateway"]
    (container,) = gateway["spec"]["template"]["spec"]["containers"]
    return str(container["image"])


def _check(commands: list[dict[str, Any]], repo: Path) -> str:
    """The image built is the one pushed and the one rendered; returns it."""
    argvs = [c["argv"] for c in commands]
    (build,) = [a for a in argvs if a[:2] == ["docker", "build"]]
    image = build[build.index("-t") + 1]
    assert ["docker", "push", image] in argvs, argvs
    assert argvs.index(["docker", "push", image]) > argvs.index(build)
    assert "/" in image.split(":")[0], f"{image}: a registry's image, which a cluster can pull"
    rendered = _render(repo / "deploy" / "kubernetes")
    assert _gateway_image(rendered) == image
    return image


def test_the_readme_deploys_the_image_it_built_and_pushed(tmp_path):
    script = _block("README.md", "## Run it on Kubernetes")
    commands, repo = _run(script, tmp_path)
    image = _check(commands, repo)
    apply = [c for c in commands if c["argv"][:2] == ["kubectl", "apply"]]
    assert [c["argv"] for c in apply] == [["kubectl", "apply", "-k", "deploy/kubernetes"]]
    assert image == script.split("IMAGE=", 1)[1].split()[0]  # one variable, set once


def test_deploying_md_builds_pushes_and_points_the_manifests_at_one_image(tmp_path):
    commands, repo = _run(_block("docs/deploying.md", "## 1. Build the image"), tmp_path)
    _check(commands, repo)
    assert "kubectl apply -k deploy/kubernetes" in _block("docs/deploying.md", "## 3. Apply")


def test_a_digest_given_as_the_variable_is_what_is_rendered(tmp_path):
    digest = "registry.example.com/agent-cache@sha256:" + "ab" * 32
    script = _block("README.md", "## Run it on Kubernetes").replace("IMAGE=", f"IMAGE={digest} #", 1)
    commands, repo = _run(script, tmp_path)
    assert _check(commands, repo) == digest


def test_without_the_edit_the_manifests_name_an_image_no_registry_holds(tmp_path):
    # what the commands are there for: as shipped, the kustomization renders the bare local name
    image = _gateway_image(_render(ROOT / "deploy" / "kubernetes"))
    assert image.split(":")[0] == BUILT
