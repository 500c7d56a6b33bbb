"""docker/Dockerfile's Python install, run as the image would run it, without a Docker engine.

The RUN instructions that install from files the Dockerfile COPYs from this repository are taken
out of the Dockerfile as written and run by bash in a fresh Python 3.11 virtual environment named
by VIRTUAL_ENV and first on PATH, as the Airflow base image sets them (its environment is
~/.local), with the copied files at their places in this repository. Then the environment must
hold exactly what requirements.lock pins, and the full pyspark (every file of its wheel intact,
Spark's jars with it), never pyspark-client, which the Spark provider asks for and which would
install the same `pyspark` package without the jars over it (overrides.txt).

Two departures, both about where packages come from, never which: uv's `--no-cache` is dropped
and the step first runs offline, so uv's cache (filled by `make setup`: same uv, same lock)
serves every wheel and the step takes seconds, not a gigabyte's download and a build of
pyspark's sdist (online, uv re-fetches and rebuilds it: ~2 minutes); only when the cache lacks
something is it run again online. And uv, which the image copies from uv's pinned image, is the
uv of this environment, checked to be that version. Marked integration: on an empty cache it
downloads.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "Dockerfile"
UV_IMAGE = "ghcr.io/astral-sh/uv"


def instructions(text: str) -> list[tuple[str, str]]:
    """A Dockerfile's (INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    current = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue  # comment lines may sit inside a continued instruction too
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        keyword, _, arguments = (current + stripped).partition(" ")
        out.append((keyword.upper(), arguments.strip()))
        current = ""
    assert not current, "the Dockerfile ends inside a continued line"
    return out


def install_step(text: str) -> tuple[list[str], dict[str, Path], str | None]:
    """The RUN commands (as written) that use a file COPYed from the build context (the
    repository, docker-compose.yaml's `context: .`) while the image's user is airflow; each copy's
    destination and the repository file it is; the tag of the uv image uv is copied from."""
    copied: dict[str, Path] = {}
    runs: list[str] = []
    uv_tag = None
    user = "root"
    for keyword, arguments in instructions(text):
        if keyword == "USER":
            user = arguments
        elif keyword == "COPY":
            assert not arguments.startswith("["), "COPY in JSON form: not parsed here"
            words = arguments.split()
            flags = [w for w in words if w.startswith("--")]
            *sources, dest = [w for w in words if not w.startswith("--")]
            source_image = next((f.split("=", 1)[1] for f in flags if f.startswith("--from=")),
                                None)
            if source_image is not None:
                image, _, tag = source_image.rpartition(":")
                if image == UV_IMAGE and sources == ["/uv"]:
                    uv_tag = tag
                continue
            for source in sources:
                target = dest + Path(source).name if dest.endswith("/") else dest
                assert len(sources) == 1 or dest.endswith("/"), arguments
                copied[target] = REPO / source
        elif keyword == "RUN" and user == "airflow" and any(d in arguments for d in copied):
            runs.append(arguments)
    return runs, copied, uv_tag


def makefile_uv_version() -> str:
    (version,) = re.findall(r"^UV_VERSION\s*:?=\s*(\S+)", (REPO / "Makefile").read_text(), re.M)
    return version


def lock_pins() -> dict[str, str]:
    return {normalized(name): version for name, version in re.findall(
        r"^([A-Za-z0-9_.\-]+)==(\S+)", (REPO / "requirements.lock").read_text(), re.M)}


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


#: Run in the installed environment: its pyspark, every distribution, and each file of
#: pyspark's wheel checked against the hash its RECORD holds.
INSPECT = r"""
import base64, hashlib, importlib.metadata as md, json, pathlib, pyspark
dist = md.distribution("pyspark")
changed = []
for f in dist.files:
    if f.hash is None:
        continue
    data = f.locate().read_bytes() if f.locate().exists() else None
    digest = None if data is None else base64.urlsafe_b64encode(
        hashlib.new(f.hash.mode, data).digest()).rstrip(b"=").decode()
    if digest != f.hash.value:
        changed.append(str(f))
jars = pathlib.Path(pyspark.__file__).parent / "jars"
print(json.dumps({
    "file": pyspark.__file__, "version": dist.version, "changed": changed,
    "jars": sorted(p.name for p in jars.glob("*.jar")) if jars.is_dir() else [],
    "dists": {d.metadata["Name"]: d.version for d in md.distributions()},
    "owners": sorted(d.metadata["Name"] for d in md.distributions()
                     if any(str(f) == "pyspark/__init__.py" for f in (d.files or []))),
}))
"""


def test_the_dockerfile_installs_the_lock_with_the_overrides_make_setup_uses():
    """Static half: what the image installs is what `make setup` installs, the same way."""
    runs, copied, uv_tag = install_step(DOCKERFILE.read_text())
    assert runs, "no install step found in docker/Dockerfile"
    makefile = (REPO / "Makefile").read_text()
    assert "--override overrides.txt -r requirements.lock" in makefile
    lock = next(d for d, src in copied.items() if src == REPO / "requirements.lock")
    overrides = next((d for d, src in copied.items() if src == REPO / "overrides.txt"), None)
    assert overrides is not None, "the image does not copy overrides.txt"
    for run in runs:
        words = shlex.split(run)
        assert words[:3] == ["uv", "pip", "install"], run  # plain pip knows no overrides
        assert words[words.index("-r") + 1] == lock, run
        assert words[words.index("--override") + 1] == overrides, run
    assert uv_tag == makefile_uv_version(), "the image's uv is not the version make setup uses"


def test_the_dockerfiles_install_step_keeps_the_full_pyspark(tmp_path):
    """Dynamic half: the step itself, run in a fresh environment."""
    text = DOCKERFILE.read_text()
    runs, copied, uv_tag = install_step(text)
    (base,) = re.findall(r"^FROM \S+-python(\d+\.\d+)\s*$", text, re.M)
    assert f"{sys.version_info.major}.{sys.version_info.minor}" == base  # the image's Python

    uv = Path(sys.executable).parent / "uv"
    said = subprocess.run([str(uv), "--version"], capture_output=True, text=True, check=True)
    assert said.stdout.split()[1] == uv_tag, "this environment's uv is not the image's"
    tools = tmp_path / "bin"  # where the image has uv: /usr/local/bin, on its PATH
    tools.mkdir()
    (tools / "uv").symlink_to(uv)

    venv = tmp_path / "local"  # the image's VIRTUAL_ENV, /home/airflow/.local, with its pip
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "UV_OFFLINE")}
    env.update(VIRTUAL_ENV=str(venv), PATH=f"{venv}/bin:{tools}:{os.environ['PATH']}")
    for run in runs:
        command = run.replace(" --no-cache ", " ")  # the cache serves the wheels (see above)
        for dest, source in copied.items():
            command = command.replace(dest, str(source))
        bash = ["bash", "-o", "pipefail", "-o", "errexit", "-o", "nounset", "-c", command]
        done = subprocess.run(bash, env={**env, "UV_OFFLINE": "1"}, cwd=tmp_path,
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0 and "cache" in done.stderr:  # not all cached: fetch the rest
            done = subprocess.run(bash, env=env, cwd=tmp_path, capture_output=True, text=True,
                                  timeout=900)
        assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"

    # from the image's working folder, not the checkout (whose deltaferry.egg-info a `python -c`
    # run there would list as installed)
    seen = json.loads(subprocess.run([str(venv / "bin" / "python"), "-c", INSPECT], env=env,
                                     cwd=tmp_path, capture_output=True, text=True,
                                     check=True).stdout)
    site = venv / "lib" / f"python{base}" / "site-packages"
    assert Path(seen["file"]) == site / "pyspark" / "__init__.py"
    assert seen["version"] == lock_pins()["pyspark"]
    assert seen["owners"] == ["pyspark"], "another distribution owns pyspark's files too"
    assert "pyspark-client" not in map(normalized, seen["dists"])
    assert seen["changed"] == [], "files of the pyspark wheel were overwritten"
    assert f"spark-core_2.13-{seen['version']}.jar" in seen["jars"]
    installed = {normalized(n): v for n, v in seen["dists"].items()}
    installed.pop("pip")  # the environment's own, as in the image
    assert installed == lock_pins(), "the image holds something the lock does not pin"
