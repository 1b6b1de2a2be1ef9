"""The Helm chart deploy/helm/llmgw/ with each values file in its ci/ (SQLite on a claim; PostgreSQL from a Secret with
an Ingress and a ServiceMonitor): the real `helm lint --strict` passes, `helm template` renders, and every manifest
it renders passes the real `kubernetes-validate --strict` (Kubernetes 1.37 schemas; strict: an unknown field fails).

kubernetes-validate has no schema for a CRD's kind: for the ServiceMonitor it warns and still exits 0, so the test
requires that warning for it alone and checks the ServiceMonitor itself with the Prometheus operator's own type
(npm `@kubernetes-models/prometheus-operator`): its validator, generated from the operator's CRD schema (types,
enums, required fields), and TypeScript's `tsc` with the manifest as an object literal of that type (an unknown
field fails, what --strict does for the rest). Negative controls show each checker refusing what it should.

Then the rendered objects are checked to hold together (Services select the pod and name its ports, Ingresses and
the ServiceMonitor name those Services' ports, the deploy key and the store reach `llmgw server` where its options
say, every option the chart passes is one `llmgw server --help` lists), and settings that cannot work are refused
by `helm template` with a sentence. Tools: `make helm` and `make k8s-models` (tests/support/helm_tools.py); fails,
never skips, without them. About 10 s here.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from support.helm_tools import K8S_MODELS, helm_binary, k8s_models

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "llmgw"
VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
KUBERNETES_VALIDATE = Path(sys.executable).parent / "kubernetes-validate"
KINDS = {
    "sqlite-values.yaml": ["ConfigMap", "PersistentVolumeClaim", "Service", "Service", "Service", "Deployment"],
    "postgresql-values.yaml": ["ConfigMap", "PersistentVolumeClaim", "Service", "Service", "Service", "Deployment",
                               "Ingress", "Ingress", "ServiceMonitor"],
}


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([helm_binary(), *args], capture_output=True, text=True, timeout=60)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def render(values: Path | None = None, *sets: str) -> list[dict]:
    args = ["template", "llmgw", str(CHART), "--namespace", "llmgw"]
    if values is not None:
        args += ["-f", str(values)]
    for item in sets:
        args += ["--set", item]
    return [doc for doc in yaml.safe_load_all(helm(*args).stdout) if doc]


def kubernetes_validate(path: Path) -> subprocess.CompletedProcess:
    assert KUBERNETES_VALIDATE.exists(), "kubernetes-validate is missing: run `make venv` (the test extra)"
    return subprocess.run([str(KUBERNETES_VALIDATE), "--strict", str(path)], capture_output=True, text=True,
                          timeout=60)


def check_service_monitor(doc: dict, workdir: Path) -> str:
    """The errors of the operator's validator and of tsc for `doc`, "" when both accept it."""
    prefix = k8s_models()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "node_modules").symlink_to(prefix / "node_modules")
    (workdir / "validate.mjs").write_text(
        'import { ServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/'
        'ServiceMonitor";\nimport { readFileSync } from "node:fs";\n'
        'new ServiceMonitor(JSON.parse(readFileSync(process.argv[2], "utf8"))).validate();\n')
    (workdir / "doc.json").write_text(json.dumps(doc))
    (workdir / "doc.ts").write_text(
        'import type { IServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/'
        f'ServiceMonitor";\nexport const doc: IServiceMonitor = {json.dumps(doc, indent=1)};\n')
    errors = []
    validated = subprocess.run(["node", "validate.mjs", "doc.json"], cwd=workdir, capture_output=True, text=True,
                               timeout=60)
    if validated.returncode:
        errors.append(validated.stderr)
    typed = subprocess.run(["node", str(prefix / "node_modules" / "typescript" / "bin" / "tsc"), "--noEmit", "--strict",
                            "--skipLibCheck", "--target", "es2022", "--module", "esnext", "--moduleResolution",
                            "bundler", "doc.ts"], cwd=workdir, capture_output=True, text=True, timeout=120)
    if typed.returncode:
        errors.append(typed.stdout + typed.stderr)
    return "\n".join(errors)


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.name)
def test_the_chart_lints_strictly(values: Path) -> None:
    done = helm("lint", "--strict", str(CHART), "-f", str(values))
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout
    assert "[WARNING]" not in done.stdout and "[ERROR]" not in done.stdout, done.stdout


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.name)
def test_every_rendered_manifest_validates_strictly(values: Path, tmp_path: Path) -> None:
    docs = render(values)
    assert [doc["kind"] for doc in docs] == KINDS[values.name]
    for number, doc in enumerate(docs):
        path = tmp_path / f"{number}-{doc['kind']}.yaml"
        path.write_text(yaml.safe_dump(doc))
        done = kubernetes_validate(path)
        resource = f"{doc['kind'].lower()}/{doc['metadata']['name']}"
        assert done.returncode == 0, done.stdout + done.stderr
        if doc["kind"] == "ServiceMonitor":
            assert (f"Couldn't find schema for kind ServiceMonitor with api version monitoring.coreos.com/v1 "
                    "for kubernetes version 1.37") in done.stdout + done.stderr
            assert check_service_monitor(doc, tmp_path / "servicemonitor") == ""
        else:
            assert f"passed for resource {resource} against version 1.37" in done.stdout + done.stderr, done.stdout


def test_each_checker_refuses_an_unknown_field_or_a_wrong_value(tmp_path: Path) -> None:
    docs = {doc["kind"]: doc for doc in render(CHART / "ci" / "postgresql-values.yaml")}
    deployment = json.loads(json.dumps(docs["Deployment"]))
    deployment["spec"]["replicaz"] = deployment["spec"].pop("replicas")
    (tmp_path / "deployment.yaml").write_text(yaml.safe_dump(deployment))
    done = kubernetes_validate(tmp_path / "deployment.yaml")
    assert done.returncode == 1
    assert "Additional properties are not allowed ('replicaz' was unexpected)" in done.stdout + done.stderr

    wrong = json.loads(json.dumps(docs["ServiceMonitor"]))  # one run of each checker (tsc takes seconds)
    wrong["metadata"]["labelz"] = wrong["metadata"].pop("labels")
    wrong["spec"]["endpoints"][0]["scheme"] = "ftp"
    errors = check_service_monitor(wrong, tmp_path / "wrong")
    assert "'\"labelz\"' does not exist in type 'IObjectMeta'" in errors  # tsc: an unknown field
    assert "data/spec/endpoints/0/scheme must be equal to one of the allowed values" in errors  # the CRD's enum


def _container(docs: list[dict]) -> dict:
    deployment, = (doc for doc in docs if doc["kind"] == "Deployment")
    container, = deployment["spec"]["template"]["spec"]["containers"]
    return container


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.name)
def test_the_rendered_objects_hold_together(values: Path) -> None:
    docs = render(values)
    by_name = {(doc["kind"], doc["metadata"]["name"]): doc for doc in docs}
    deployment = by_name["Deployment", "llmgw"]
    pod = deployment["spec"]["template"]
    container = _container(docs)
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()

    services = {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] == "Service"}
    assert sorted(services) == ["llmgw-admin", "llmgw-agents", "llmgw-gateway"]
    for service in services.values():
        assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
        # the agents reconnect (and the admin API answers) while /health, the readiness probe, still says recovering
        published = service["spec"].get("publishNotReadyAddresses", False)
        assert published is (service["metadata"]["name"] != "llmgw-gateway")
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "gateway"}
    args = container["args"]
    assert {"--gateway=0.0.0.0:8080", "--admin=0.0.0.0:8081", "--agents=0.0.0.0:8082", "--state=/var/lib/llmgw",
            "--tls", "--join-port=8083"} <= set(args)
    assert (ports["gateway"], ports["admin"], ports["agents"], ports["join"]) == (8080, 8081, 8082, 8083)
    names = [arg.split("=", 1)[1] for arg in args if arg.startswith("--tls-hostname=")]
    for service in ("llmgw-agents", "llmgw-admin"):
        assert [service, f"{service}.llmgw", f"{service}.llmgw.svc", f"{service}.llmgw.svc.cluster.local"] <= names

    # every option the chart passes is one `llmgw server` has
    help_text = subprocess.run([sys.executable, "-m", "llmgw.cli", "server", "--help"], capture_output=True,
                               text=True, check=True, env={"PYTHONPATH": str(ROOT), "COLUMNS": "200"}).stdout
    listed = set(re.findall(r"(--[a-z][a-z-]+)", help_text))
    assert {arg.split("=", 1)[0] for arg in args} <= listed

    # the state claim, the deploy key where --repo-ssh-key reads it, known_hosts where libgit2 reads it
    mounts = {mount["name"]: mount for mount in container["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in pod["spec"]["volumes"]}
    assert mounts["state"]["mountPath"] == "/var/lib/llmgw"
    assert ("PersistentVolumeClaim", volumes["state"]["persistentVolumeClaim"]["claimName"]) in by_name
    key_arg, = (arg.split("=", 1)[1] for arg in args if arg.startswith("--repo-ssh-key="))
    assert key_arg == f"{mounts['deploy-key']['mountPath']}/ssh-privatekey"
    assert volumes["deploy-key"]["secret"] == {"secretName": "llmgw-settings-deploy-key", "defaultMode": 0o440,
                                               "items": [{"key": "ssh-privatekey", "path": "ssh-privatekey"}]}
    env = {item["name"]: item for item in container["env"]}
    assert mounts["config"]["mountPath"] == f"{env['HOME']['value']}/.ssh/known_hosts"
    assert by_name["ConfigMap", "llmgw"]["data"]["known_hosts"].startswith("git.example.org ssh-ed25519 ")

    if values.name == "sqlite-values.yaml":
        assert env["LLMGW_STORE"] == {"name": "LLMGW_STORE", "value": "sqlite:////var/lib/llmgw/llmgw.sqlite3"}
        assert not [doc for doc in docs if doc["kind"] in ("Ingress", "ServiceMonitor")]
        assert services["llmgw-agents"]["spec"]["type"] == "LoadBalancer"
        return
    assert env["LLMGW_STORE"]["valueFrom"] == {"secretKeyRef": {"name": "llmgw-store", "key": "url"}}
    assert not [arg for arg in args if "postgresql" in arg]
    for name, host in (("gateway", "llm.example.org"), ("admin", "llmgw-admin.example.org")):
        ingress = by_name["Ingress", f"llmgw-{name}"]
        rule, = ingress["spec"]["rules"]
        path, = rule["http"]["paths"]
        assert (rule["host"], path["backend"]["service"]) == (host, {"name": f"llmgw-{name}", "port": {"name": name}})
        assert name in [port["name"] for port in services[f"llmgw-{name}"]["spec"]["ports"]]
    assert by_name["Ingress", "llmgw-admin"]["metadata"]["annotations"] == {
        "nginx.ingress.kubernetes.io/backend-protocol": "HTTPS"}
    monitor = by_name["ServiceMonitor", "llmgw"]
    selected = [s for s in services.values()
                if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
    assert [s["metadata"]["name"] for s in selected] == ["llmgw-admin"]
    endpoint, = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["scheme"]) == ("admin", "/metrics", "https")
    assert endpoint["tlsConfig"]["serverName"] in names
    assert endpoint["authorization"]["credentials"] == {"name": "llmgw-metrics-token", "key": "token"}
    assert monitor["metadata"]["labels"]["release"] == "prometheus"


@pytest.mark.parametrize("sets,refusal", [
    ((), "settings.repo is required: the URL of the settings repository"),
    (("settings.repo=ssh://git@h/x.git", "settings.deployKey.existingSecret=k"),
     "settings.knownHosts is required with a deploy key"),
    (("settings.repo=https://h/x.git", "settings.deployKey.existingSecret=k", "settings.knownHosts=h ssh-ed25519 A"),
     "settings.deployKey is for an ssh settings.repo (ssh://user@host/path or user@host:path), not https://h/x.git"),
    (("settings.repo=https://h/x.git", "store.kind=mysql"), 'store.kind "mysql": give sqlite or postgresql'),
    (("settings.repo=https://h/x.git", "tls.enabled=false"), "tls.enabled is false: llmgw server refuses agents"),
    (("settings.repo=https://h/x.git", "store.kind=postgresql"), "store.postgresql.existingSecret is required"),
    (("settings.repo=https://h/x.git", "serviceMonitor.enabled=true"), "serviceMonitor.tokenSecret.name is required"),
])
def test_settings_that_cannot_work_are_refused_with_a_sentence(sets: tuple[str, ...], refusal: str) -> None:
    args = ["template", "llmgw", str(CHART)]
    for item in sets:
        args += ["--set", item]
    done = helm(*args, check=False)
    assert done.returncode == 1
    assert refusal in done.stderr, done.stderr


def test_an_https_repository_needs_no_key_and_a_key_given_inline_becomes_a_secret() -> None:
    docs = render(None, "settings.repo=https://git.example.org/ops/settings.git")
    assert not [arg for arg in _container(docs)["args"] if arg.startswith("--repo-ssh-key")]
    assert "Secret" not in [doc["kind"] for doc in docs]
    docs = render(None, "settings.repo=git@git.example.org:ops/settings.git", "settings.knownHosts=h ssh-ed25519 A",
                  "settings.deployKey.privateKey=KEY")
    secret, = (doc for doc in docs if doc["kind"] == "Secret")
    assert (secret["metadata"]["name"], secret["stringData"]) == ("llmgw-deploy-key", {"ssh-privatekey": "KEY"})


def test_the_makefile_pins_the_node_packages_this_test_uses() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert f"K8S_MODELS := {' '.join(K8S_MODELS)}\n" in makefile
