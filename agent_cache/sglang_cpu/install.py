"""``agent-cache sglang-cpu setup``: one SGLang release made to run on this CPU, in a folder of its own.

Layout under the harness home (``$AGENT_CACHE_SGLANG_HOME``, default ``~/.cache/agent-cache/sglang``)::

    <version>/venv/           SGLang, torch and their dependencies (never the project's environment)
    <version>/stub/libcuda.so.1   every ``cu*`` symbol the kernel wheel imports, each answering "no device"
    <version>/ready.json      written last: a folder without it is set up again
    model/                    the tiny random-weight Llama and its tokenizer, shared by every version

Each step is skipped when its result is there, so a second run (or CI with a kept cache) costs seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from agent_cache.errors import ConfigError
from agent_cache.sglang_cpu.versions import ENGINE_VERSIONS, GPU_ONLY_PREFIXES, LATEST_ENGINE, EngineVersion

HARNESS_ENV_PREFIX = "AGENT_CACHE_SGLANG_"  # the harness's own variables
HOME_ENV = HARNESS_ENV_PREFIX + "HOME"  # where releases are set up
VERSION_ENV = HARNESS_ENV_PREFIX + "VERSION"  # the release the sglang test tier runs
_CUDA_ERROR_NO_DEVICE = 100


def harness_home() -> Path:
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".cache" / "agent-cache" / "sglang")


@dataclass(frozen=True)
class Installed:
    """Where one set-up release lives."""

    version: str
    python: Path
    stub_dir: Path
    model_dir: Path

    @classmethod
    def find(cls, version: str, home: Path | None = None) -> "Installed | None":
        """The release if its setup finished, else None."""
        root = (home or harness_home())
        ready = root / version / "ready.json"
        if not ready.is_file():
            return None
        info = json.loads(ready.read_text())
        return cls(version, Path(info["python"]), Path(info["stub_dir"]), Path(info["model_dir"]))


def _log(message: str) -> None:
    print(f"[sglang-cpu {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _run(cmd: list[str], **kwargs: object) -> None:
    _log(" ".join(cmd) if len(cmd) < 12 else " ".join(cmd[:11]) + f" ... ({len(cmd)} args)")
    subprocess.run(cmd, check=True, **kwargs)  # type: ignore[call-overload]


def _pip(python: Path, *args: str) -> None:
    _run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off", *args])


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def cpu_requirements(wheel: Path) -> list[str]:
    """The wheel's declared dependencies for this machine, less the GPU-only ones."""
    import zipfile

    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as zf:
        meta_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = zf.read(meta_name).decode()
    out = []
    for line in meta.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if _normalise(req.name).startswith(GPU_ONLY_PREFIXES):
            continue
        out.append(str(req).split(";")[0].strip())
    return out


def _install_packages(spec: EngineVersion, venv: Path, work: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.exists():
        _run([sys.executable, "-m", "venv", str(venv)])
    constraints = work / "constraints.txt"  # nothing SGLang pulls may move torch off the release's pair
    constraints.write_text(f"torch=={spec.torch}\ntorchvision=={spec.torchvision}\n")
    _pip(python, "-c", str(constraints), f"torch=={spec.torch}", f"torchvision=={spec.torchvision}")
    wheels = work / "wheels"
    _run([str(python), "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q", "-d", str(wheels),
          f"sglang=={spec.sglang}"])
    wheel = next(wheels.glob("sglang-*.whl"))
    _pip(python, "-c", str(constraints), *cpu_requirements(wheel), *spec.extra)
    _pip(python, "--no-deps", str(wheel), spec.kernel)
    return python


def _kernel_libraries(python: Path) -> list[Path]:
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    return [p for d in ("sgl_kernel", "sglang_kernel") for p in (Path(site) / d).rglob("*.so")]


def build_stub_libcuda(libraries: list[Path], stub_dir: Path) -> Path:
    """A ``libcuda.so.1`` defining every ``cu*`` function ``libraries`` import, each returning
    CUDA_ERROR_NO_DEVICE: the CUDA kernel wheel then loads, ``torch.cuda.is_available()`` is False and
    SGLang takes its CPU path."""
    symbols: set[str] = set()
    for lib in libraries:
        out = subprocess.run(["nm", "-D", "--undefined-only", str(lib)], check=True, capture_output=True,
                             text=True).stdout
        symbols.update(m.group(1) for m in re.finditer(r"\bU (cu[A-Za-z0-9_]+)", out))
    # the driver entry points torch and the CUDA runtime ask for first, whatever the kernels import
    symbols.update({"cuInit", "cuDriverGetVersion", "cuDeviceGetCount", "cuDeviceGet", "cuGetProcAddress",
                    "cuGetProcAddress_v2", "cuGetErrorString", "cuGetErrorName"})
    stub_dir.mkdir(parents=True, exist_ok=True)
    source = stub_dir / "libcuda_stub.c"
    source.write_text("".join(f"int {s}(void) {{ return {_CUDA_ERROR_NO_DEVICE}; }}\n" for s in sorted(symbols)))
    target = stub_dir / "libcuda.so.1"
    _run(["gcc", "-shared", "-fPIC", "-o", str(target), str(source)])
    (stub_dir / "libcuda.so").unlink(missing_ok=True)
    (stub_dir / "libcuda.so").symlink_to("libcuda.so.1")
    _log(f"stub libcuda with {len(symbols)} entry points")
    return target


def _make_model(python: Path, model_dir: Path) -> None:
    if (model_dir / "config.json").is_file():
        return
    tmp = model_dir.with_name(model_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    script = Path(__file__).with_name("tiny_model.py")
    _run([str(python), str(script), str(tmp)], env={**os.environ, "HF_HUB_OFFLINE": "1"})
    tmp.rename(model_dir)


def setup(version: str, home: Path | None = None) -> Installed:
    """Set up ``version`` (idempotent); raises ConfigError for a release the harness does not know."""
    if version not in ENGINE_VERSIONS:
        raise ConfigError("--version", f"unknown SGLang release {version!r}; known: {', '.join(ENGINE_VERSIONS)}")
    found = Installed.find(version, home)
    if found is not None:
        _log(f"SGLang {version} already set up in {found.python.parents[2]}")
        return found
    spec = ENGINE_VERSIONS[version]
    root = (home or harness_home())
    vroot = root / version
    vroot.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sglang-setup-") as work:
        python = _install_packages(spec, vroot / "venv", Path(work))
    stub = build_stub_libcuda(_kernel_libraries(python), vroot / "stub")
    model_dir = root / "model"
    _make_model(python, model_dir)
    installed = Installed(version, python, stub.parent, model_dir)
    (vroot / "ready.json").write_text(json.dumps({
        "sglang": version, "python": str(python), "stub_dir": str(stub.parent), "model_dir": str(model_dir)}))
    _log(f"SGLang {version} set up in {time.monotonic() - started:.0f} s")
    return installed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agent-cache sglang-cpu setup",
                                     description="set up real SGLang releases to run on this CPU "
                                                 f"(in ${HOME_ENV}, default ~/.cache/agent-cache/sglang)")
    parser.add_argument("--version", action="append", dest="versions", metavar="0.5.N",
                        help=f"release(s) to set up (default {LATEST_ENGINE}; known: {', '.join(ENGINE_VERSIONS)})")
    args = parser.parse_args(argv)
    try:
        for version in args.versions or [LATEST_ENGINE]:
            setup(version)
    except ConfigError as exc:
        print(f"agent-cache sglang-cpu setup: {exc}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as exc:
        print(f"agent-cache sglang-cpu setup: step failed ({exc.returncode}): {' '.join(map(str, exc.cmd))}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
