"""The deployment files in deploy/, checked offline: no Docker daemon, no cluster.

Kubernetes manifests are validated against the API's own JSON schemas (bundled by
kubernetes-validate), then checked for what running Super-agent depends on: the order of
compose's services, probes on the real health endpoints, the Service and the PDB selecting
the replicas, commands that exist, environment variables that are real settings, the image
running as the user the manifests expect, the gateway's TLS material reaching every replica
unchanged, and the endpointd units agreeing with what `endpointd service install` writes.
"""

from __future__ import annotations

import ast
import configparser
import os
import plistlib
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]  # no py.typed
import pytest
import yaml

from controlplane.gateway.tls import ensure_server_tls
from controlplane.settings import describe
from endpointd.autostart import LAUNCHD_LABEL, SYSTEMD_UNIT, service_file

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY = REPO_ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
# The template holds placeholders only and is applied by hand, never by the kustomization.
SECRET_TEMPLATE = "secret.example.yaml"
# The oldest Kubernetes these manifests promise to work on, and a recent one.
KUBERNETES_VERSIONS = ("1.28.0", "1.34.0")
SUPERAGENT_SERVICES = ("migrate", "replica-1", "replica-2", "watchdog")
ENV_NAME = re.compile(r"^\s*#?\s*([A-Z][A-Z0-9_]*)=", re.MULTILINE)

Manifest = dict[str, Any]


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def manifests() -> Iterator[tuple[Path, Manifest]]:
    for path in sorted(KUBERNETES.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            assert isinstance(doc, dict), path
            yield path, doc


def manifest(kind: str, name: str) -> Manifest:
    found = [
        doc for _, doc in manifests() if (doc["kind"], doc["metadata"]["name"]) == (kind, name)
    ]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def workloads() -> Iterator[Manifest]:
    """The manifests that run pods (Deployments, the Job)."""
    return (doc for _, doc in manifests() if "template" in doc.get("spec", {}))


def pod_spec(workload: Manifest) -> Manifest:
    spec: Manifest = workload["spec"]["template"]["spec"]
    return spec


def containers(spec: Manifest) -> list[Manifest]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def compose() -> Manifest:
    data: Manifest = load_yaml(DEPLOY / "compose.yaml")
    return data


def dockerfile() -> tuple[dict[str, str], dict[str, list[tuple[str, str]]]]:
    """The global ARG defaults, and the instructions of each build stage as
    (INSTRUCTION, arguments) with line continuations joined."""
    text = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    text = re.sub(r"\\\n", " ", text)
    args: dict[str, str] = {}
    stages: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instr, _, arguments = line.partition(" ")
        instr, arguments = instr.upper(), arguments.strip()
        if instr == "FROM":
            words = arguments.split()
            name = words[-1] if len(words) == 3 and words[1].upper() == "AS" else str(len(stages))
            current = stages.setdefault(name, [])
        if current is None:
            if instr == "ARG":
                key, _, value = arguments.partition("=")
                args[key] = value
            continue
        current.append((instr, arguments))
    return args, stages


def dockerfile_stages() -> dict[str, list[tuple[str, str]]]:
    return dockerfile()[1]


def base_image(stage: list[tuple[str, str]]) -> str:
    image = instruction(stage, "FROM")[0].split()[0]
    for key, value in dockerfile()[0].items():
        image = image.replace("${" + key + "}", value)
    return image


def final_stage() -> list[tuple[str, str]]:
    return list(dockerfile_stages().values())[-1]


def instruction(stage: list[tuple[str, str]], name: str) -> list[str]:
    return [arguments for instr, arguments in stage if instr == name]


def image_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for arguments in instruction(final_stage(), "ENV"):
        for pair in shlex.split(arguments):
            key, _, value = pair.partition("=")
            env[key] = value
    return env


def superagent(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controlplane.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


# ------------------------------------------------------------------------------ Kubernetes


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_kubernetes_manifest_matches_the_api_schema(version: str) -> None:
    checked = 0
    for path, doc in manifests():
        try:
            # Strict: an unknown field (a typo such as `readinessprobe`) is an error too.
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.absolute_path)
            pytest.fail(f"{path.name}: {doc['kind']} {where}: {exc.message}")
        checked += 1
    assert checked >= 7


def test_kustomization_applies_every_manifest_but_the_secret_template() -> None:
    kustomization = load_yaml(KUBERNETES / "kustomization.yaml")
    files = {p.name for p in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml", SECRET_TEMPLATE}
    assert set(kustomization["resources"]) == files
    assert "namespace" not in kustomization  # applied into whichever namespace is chosen
    assert all("namespace" not in doc["metadata"] for _, doc in manifests())
    # Its image override reaches every container only if they all name that image.
    (image,) = kustomization["images"]
    used = {c["image"] for doc in workloads() for c in containers(pod_spec(doc))}
    assert used == {image["name"]}


def test_replicas_are_several_non_root_and_probed_on_the_health_endpoints() -> None:
    deployment = manifest("Deployment", "superagent")
    config = manifest("ConfigMap", "superagent")["data"]
    spec = pod_spec(deployment)
    assert deployment["spec"]["replicas"] >= 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    for container in containers(spec):
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert "memory" in container["resources"]["limits"]

    (server,) = spec["containers"]
    assert server["command"] == ["superagent", "serve"]
    ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert ports == {
        "http": int(config["SUPERAGENT_HTTP__PORT"]),
        "grpc": int(config["SUPERAGENT_GRPC__PORT"]),
    }
    assert server["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert server["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert server["startupProbe"]["httpGet"]["path"] == "/healthz"
    # The listeners face the pod network, or no probe and no Service could reach them.
    assert config["SUPERAGENT_HTTP__HOST"] == config["SUPERAGENT_GRPC__HOST"] == "0.0.0.0"  # noqa: S104


def test_service_exposes_http_and_grpc_of_the_replicas() -> None:
    service = manifest("Service", "superagent")
    server = pod_spec(manifest("Deployment", "superagent"))["containers"][0]
    pod_labels = manifest("Deployment", "superagent")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["sessionAffinity"] == "None"
    container_ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    exposed = {p["name"]: p for p in service["spec"]["ports"]}
    assert set(exposed) == {"http", "grpc"}
    for name, port in exposed.items():
        assert port["targetPort"] in container_ports, name
        assert port["port"] == container_ports[name]


def test_pdb_keeps_a_replica_and_selects_only_the_replicas() -> None:
    pdb = manifest("PodDisruptionBudget", "superagent")
    deployment = manifest("Deployment", "superagent")
    selector = pdb["spec"]["selector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert selector == deployment["spec"]["selector"]["matchLabels"]
    assert 1 <= pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    for other in (
        manifest("Deployment", "superagent-watchdog"),
        manifest("Job", "superagent-migrate"),
    ):
        assert not selector.items() <= other["spec"]["template"]["metadata"]["labels"].items()


def test_migration_job_and_watchdog_run_their_commands_with_the_same_configuration() -> None:
    job = manifest("Job", "superagent-migrate")
    watchdog = manifest("Deployment", "superagent-watchdog")
    replicas = pod_spec(manifest("Deployment", "superagent"))["containers"][0]
    (migrate,) = pod_spec(job)["containers"]
    assert migrate["command"] == ["superagent", "migrate"]
    assert pod_spec(job)["restartPolicy"] in {"Never", "OnFailure"}
    assert watchdog["spec"]["replicas"] == 1
    assert watchdog["spec"]["strategy"]["type"] == "Recreate"
    (loop,) = pod_spec(watchdog)["containers"]
    assert loop["command"] == ["superagent", "watchdog"]
    for container in (migrate, loop):
        assert container["envFrom"] == replicas["envFrom"]
    for workload in (job, watchdog):
        assert pod_spec(workload)["securityContext"]["runAsNonRoot"] is True


def test_secret_template_holds_only_placeholders_that_production_refuses() -> None:
    (secret,) = yaml.safe_load_all((KUBERNETES / SECRET_TEMPLATE).read_text(encoding="utf-8"))
    values = secret["stringData"]
    assert values["SUPERAGENT_ADMIN_TOKEN"] == values["OPENAI_API_KEY"] == "changeme"
    inherited = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SUPERAGENT_", "OPENAI_")) and k != "DATABASE_URL"
    }
    configmap = manifest("ConfigMap", "superagent")["data"]
    proc = superagent("config", env={**inherited, **configmap, **values})
    assert proc.returncode == 1
    assert "placeholder" in proc.stderr
    assert "Traceback" not in proc.stderr


# --------------------------------------------------------------------------------- compose


def test_compose_starts_postgres_then_migrate_then_replicas_one_after_the_other() -> None:
    services = compose()["services"]
    assert set(services) == {"postgres", *SUPERAGENT_SERVICES}
    assert "pg_isready" in services["postgres"]["healthcheck"]["test"]

    def waits_for(service: str) -> dict[str, str]:
        return {dep: cond["condition"] for dep, cond in services[service]["depends_on"].items()}

    assert waits_for("migrate") == {"postgres": "service_healthy"}
    after_migration = {"postgres": "service_healthy", "migrate": "service_completed_successfully"}
    assert waits_for("replica-1") == after_migration
    # The second replica finds the gateway CA that the first one created in the shared volume.
    assert waits_for("replica-2") == {**after_migration, "replica-1": "service_healthy"}
    assert waits_for("watchdog") == after_migration

    for name in (n for n, service in services.items() if "depends_on" in service):
        for dep, condition in waits_for(name).items():
            target = services[dep]
            if condition == "service_healthy":
                assert not target["healthcheck"].get("disable"), f"{name} waits on {dep}"
            if condition == "service_completed_successfully":
                assert target["restart"] == "no", f"{dep} must run once and exit"


def test_compose_services_run_the_commands_with_health_checks_where_they_serve() -> None:
    services = compose()["services"]
    assert services["migrate"]["command"] == ["superagent", "migrate"]
    assert services["watchdog"]["command"] == ["superagent", "watchdog"]
    for name in ("replica-1", "replica-2"):
        assert services[name]["command"] == ["superagent", "serve"]
        check = " ".join(services[name]["healthcheck"]["test"])
        assert "http://127.0.0.1:8420/readyz" in check
        published = {p.rsplit(":", 1)[1] for p in services[name]["ports"]}
        assert published == {"8420", "8421"}
    for name in ("migrate", "watchdog"):  # no HTTP: the image's /readyz check would fail
        assert services[name]["healthcheck"] == {"disable": True}


def test_compose_replicas_share_the_state_directory_and_reach_postgres() -> None:
    services = compose()["services"]
    postgres = services["postgres"]["environment"]
    state_dir = image_env()["SUPERAGENT_STATE_DIR"]
    for name in SUPERAGENT_SERVICES:
        service = services[name]
        assert any(v.endswith(f":{state_dir}") for v in service["volumes"]), name
        url = service["environment"]["DATABASE_URL"]
        user, host_db = url.removeprefix("postgresql://").split(":", 1)[0], url.rsplit("@", 1)[1]
        assert user == postgres["POSTGRES_USER"]
        assert host_db == f"postgres:5432/{postgres['POSTGRES_DB']}"
        # Compose refuses to start with these unset or empty (`${VAR:?message}`).
        assert "${POSTGRES_PASSWORD:?" in url
        assert service["environment"]["SUPERAGENT_ADMIN_TOKEN"].startswith(
            "${SUPERAGENT_ADMIN_TOKEN:?"
        )


# ------------------------------------------------------------------------ all of deploy/


def test_every_command_the_deployment_runs_exists() -> None:
    argvs = [list(c["command"]) for doc in workloads() for c in pod_spec(doc)["containers"]]
    argvs += [list(s["command"]) for s in compose()["services"].values() if "command" in s]
    cmd = instruction(final_stage(), "CMD")
    argvs.append(yaml.safe_load(cmd[-1]))
    subcommands = {argv[1] for argv in argvs if argv[0] == "superagent"}
    assert subcommands >= {"serve", "migrate", "watchdog"}
    for subcommand in sorted(subcommands):
        proc = superagent(subcommand, "--help")
        assert proc.returncode == 0, f"`superagent {subcommand}`: {proc.stderr.strip()}"


def test_every_environment_variable_named_is_a_real_setting() -> None:
    settings = {name for name, _, _ in describe()}
    assert {"DATABASE_URL", "OPENAI_BASE_URL", "OPENAI_API_KEY"} <= settings
    named: dict[str, set[str]] = {}

    def note(source: str, names: Any) -> None:
        for name in names:
            named.setdefault(name, set()).add(source)

    for name in SUPERAGENT_SERVICES:
        note("compose.yaml", compose()["services"][name]["environment"])
    note("Dockerfile", image_env())
    note("configmap.yaml", manifest("ConfigMap", "superagent")["data"])
    for doc in workloads():
        for container in containers(pod_spec(doc)):
            note(doc["metadata"]["name"], (e["name"] for e in container.get("env", [])))
    # Commented-out lines count: they are what people uncomment.
    for path in (
        DEPLOY / "env.example",
        KUBERNETES / SECRET_TEMPLATE,
        KUBERNETES / "configmap.yaml",
    ):
        text = path.read_text(encoding="utf-8").replace(": ", "=")
        note(path.name, ENV_NAME.findall(text))
    ours = {n for n in named if n.startswith(("SUPERAGENT_", "OPENAI_")) or n == "DATABASE_URL"}
    assert "SUPERAGENT_ADMIN_TOKEN" in ours
    unknown = {n: sorted(named[n]) for n in ours - settings}
    assert not unknown, f"not settings (superagent config --markdown lists them): {unknown}"


def test_image_runs_serve_as_the_non_root_user_the_manifests_expect() -> None:
    stages = dockerfile_stages()
    assert len(stages) >= 2  # wheels are built in one stage, installed in a slim other
    final = final_stage()
    assert base_image(final).startswith("python:3.11-slim")
    (user,) = instruction(final, "USER")
    uid = user.split(":")[0]
    assert uid.isdigit(), "numeric, so that runAsNonRoot can check it"
    assert uid != "0"
    assert (
        int(uid) == pod_spec(manifest("Deployment", "superagent"))["securityContext"]["runAsUser"]
    )
    assert any(f"--uid {uid}" in run for run in instruction(final, "RUN"))
    assert yaml.safe_load(instruction(final, "CMD")[-1]) == ["superagent", "serve"]
    assert set(" ".join(instruction(final, "EXPOSE")).split()) == {"8420", "8421"}
    assert "/readyz" in instruction(final, "HEALTHCHECK")[-1]
    env = image_env()
    assert (
        env["SUPERAGENT_STATE_DIR"]
        == manifest("ConfigMap", "superagent")["data"]["SUPERAGENT_STATE_DIR"]
    )
    assert any(
        "pip wheel" in run and "./endpointd ." in run for run in instruction(stages["build"], "RUN")
    )
    # The runtime stage installs both distributions by their names (a stale name would
    # fail the build, or worse, find an unrelated project of that name).
    names = {
        tomllib.loads((REPO_ROOT / d / "pyproject.toml").read_text(encoding="utf-8"))["project"][
            "name"
        ]
        for d in (".", "endpointd")
    }
    assert any(
        "pip install" in run and names <= set(shlex.split(run)) for run in instruction(final, "RUN")
    )


def test_image_build_context_holds_every_source_tree_the_wheels_need() -> None:
    build = dockerfile_stages()["build"]
    copied = {
        source.rstrip("/")
        for arguments in instruction(build, "COPY")
        for source in shlex.split(arguments)[:-1]
    }
    # endpointd's wheel draws the shared code and the protocol stubs from sibling folders,
    # named in endpointd/setup.py's SIBLINGS (import package -> folder).
    setup = ast.parse((REPO_ROOT / "endpointd" / "setup.py").read_text(encoding="utf-8"))
    (assigned,) = (
        node.value
        for node in setup.body
        if isinstance(node, ast.Assign)
        and [getattr(t, "id", None) for t in node.targets] == ["SIBLINGS"]
    )
    siblings = set(ast.literal_eval(assigned).values())
    assert siblings == {"shared", "proto"}
    root = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    packages = {p.rstrip("*") for p in root["tool"]["setuptools"]["packages"]["find"]["include"]}
    needed = {"pyproject.toml", root["project"]["readme"], "endpointd", *siblings, *packages}
    assert needed <= copied
    allowed = {
        line[1:].rstrip("/")
        for line in (DEPLOY / "Dockerfile.dockerignore").read_text(encoding="utf-8").splitlines()
        if line.startswith("!")
    }
    assert copied <= allowed, "copied but kept out of the build context by the ignore file"
    for source in copied:
        assert (REPO_ROOT / source).exists(), source


# --------------------------------------------------------------------- the gateway's TLS


def test_tls_material_made_as_the_docs_say_reaches_every_replica_unchanged(tmp_path: Path) -> None:
    """docs/deploy.md makes the Secret with the gateway's own code; each pod gets a 0600
    copy (the init container); the gateway then serves that certificate as is."""
    docs = (REPO_ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    (snippet,) = re.findall(r"python -c '([^']+)'", docs)
    made = tmp_path / "gateway-tls"
    made.mkdir(mode=0o700)

    def run_snippet() -> str:
        proc = subprocess.run(
            [sys.executable, "-c", snippet.replace('"/tls"', repr(str(made)))],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=tmp_path,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    fingerprint = run_snippet()
    init = pod_spec(manifest("Deployment", "superagent"))["initContainers"][0]
    script = init["command"][-1]
    files = sorted(p.name for p in made.iterdir())
    assert files == ["ca.key", "ca.pem", "server.key", "server.pem"]
    assert all(name in script for name in files)
    state = next(m["mountPath"] for m in init["volumeMounts"] if m["name"] == "state")
    assert f"{state}/tls" in script
    assert state == manifest("ConfigMap", "superagent")["data"]["SUPERAGENT_STATE_DIR"]

    for replica in ("a", "b"):
        copy = tmp_path / replica / "tls"
        copy.mkdir(parents=True, mode=0o700)
        for name in files:
            shutil.copyfile(made / name, copy / name)
            (copy / name).chmod(0o600)
        assert ensure_server_tls(copy).fingerprint == fingerprint
        assert all((copy / n).read_bytes() == (made / n).read_bytes() for n in files)

    # Renewal as docs/tls-guide.md says: drop the certificate, run the same command again.
    ca = (made / "ca.pem").read_bytes()
    (made / "server.pem").unlink()
    (made / "server.key").unlink()
    renewed = run_snippet()
    assert renewed != fingerprint
    assert (made / "ca.pem").read_bytes() == ca


# --------------------------------------------------------------------------------- endpointd


def unit(text: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(text)
    return parser


def test_systemd_unit_keeps_what_endpointd_service_install_writes(tmp_path: Path) -> None:
    ours = unit((DEPLOY / "endpointd" / SYSTEMD_UNIT).read_text(encoding="utf-8"))
    generated = unit(service_file("linux", directory=tmp_path).content)
    for section, key in [
        ("Unit", "Description"),
        ("Unit", "After"),
        ("Service", "KillMode"),  # commands outlive a daemon restart
        ("Service", "RestartSec"),
        ("Install", "WantedBy"),
    ]:
        assert ours[section][key] == generated[section][key], f"[{section}] {key}"
    assert shlex.split(ours["Service"]["ExecStart"])[-1] == "exec endpointd run"
    assert ours["Service"]["Restart"] == "on-failure"
    assert ours["Service"]["NoNewPrivileges"] == "yes"


def test_launchd_agent_keeps_what_endpointd_service_install_writes(tmp_path: Path) -> None:
    path = DEPLOY / "endpointd" / f"{LAUNCHD_LABEL}.plist"
    ours = plistlib.loads(path.read_bytes())
    generated = plistlib.loads(service_file("darwin", directory=tmp_path).content.encode())
    for key in ("Label", "RunAtLoad", "AbandonProcessGroup"):
        assert ours[key] == generated[key], key
    assert ours["KeepAlive"] == {"SuccessfulExit": False}
    command = ours["ProgramArguments"][-1]
    assert command.startswith("exec endpointd run ")
    # The same log file as the generated agent, which launchd cannot expand `~` in.
    log = generated["StandardErrorPath"].replace(str(Path.home()), "$HOME")
    assert f'"{log}"' in command


def test_docs_name_every_deployment_file() -> None:
    docs = (REPO_ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    for path in sorted(DEPLOY.rglob("*")):
        if path.is_file() and path.name not in {"README.md", ".gitignore"}:
            assert path.name in docs, f"docs/deploy.md does not mention {path.name}"
