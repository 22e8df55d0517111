"""The Helm chart with a real helm binary: lint, render for the default values and each
example values file, and validate every manifest offline (Kubernetes schemas, the CRDs'
own schemas); then what the rendered workloads must say for shoal to work."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

Doc = dict[str, Any]

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "shoal"
EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))


def test_the_examples_are_the_four_documented_setups() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {"single-node", "dedicated-cache-nodes", "memory-only", "tls"} <= names


def test_lint_strict_passes_for_defaults_and_every_example(chart: Any) -> None:
    proc = chart.run("lint", "--strict", str(CHART))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for values in EXAMPLES:
        proc = chart.run("lint", "--strict", str(CHART), "-f", str(values))
        assert proc.returncode == 0, f"{values.name}: {proc.stdout}{proc.stderr}"


@pytest.mark.parametrize("values", [None, *EXAMPLES], ids=lambda v: v.stem if v else "defaults")
def test_every_rendered_manifest_is_valid(chart: Any, validator: Any, values: Path | None) -> None:
    docs = chart.template(*([values] if values else []))
    kinds = {d["kind"] for d in docs}
    assert {"StatefulSet", "DaemonSet", "CustomResourceDefinition", "Service"} <= kinds
    problems = [p for d in docs for p in validator.errors(d)]
    assert not problems, "\n".join(problems)


def test_the_crds_shipped_validate_their_own_example_resources(validator: Any) -> None:
    # a typo'd field in a custom resource is caught by the strict CRD schema
    crds = [
        d
        for f in sorted((CHART / "crds").glob("*.yaml"))
        for d in yaml.safe_load_all(f.read_text())
        if d
    ]
    assert crds, "the chart ships no CRDs"
    for crd in crds:
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        version = crd["spec"]["versions"][0]["name"]
        bad = {
            "apiVersion": f"{group}/{version}",
            "kind": kind,
            "metadata": {"name": "x"},
            "spec": {"surelyNotAField": 1},
        }
        problems = validator.errors(bad)
        assert any("surelyNotAField" in p for p in problems), (kind, problems)


def test_master_keeps_its_state_on_a_claim_and_honours_placement(
    chart: Any, find_doc: Callable[..., Doc], container_of: Callable[[Doc, str], Doc]
) -> None:
    docs = chart.template(CHART / "examples" / "dedicated-cache-nodes.yaml")
    sts = find_doc(docs, "StatefulSet", "-master")
    spec = sts["spec"]
    claim = spec["volumeClaimTemplates"][0]
    assert claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    assert claim["spec"]["storageClassName"] == "fast-ssd"
    master = container_of(sts, "master")
    assert "--state-dir=/var/lib/shoal/master" in master["args"]
    assert {"name": "state", "mountPath": "/var/lib/shoal/master"} in master["volumeMounts"]
    pod = spec["template"]["spec"]
    assert pod["nodeSelector"] == {"node-role.example.com/system": "true"}
    assert pod["tolerations"][0]["value"] == "system"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert master["readinessProbe"]["httpGet"]["path"] == "/api/v1/health"


def test_a_standby_master_shares_one_rwx_claim_and_every_process_knows_both(
    chart: Any, find_doc: Callable[..., Doc], container_of: Callable[[Doc, str], Doc]
) -> None:
    docs = chart.template(CHART / "examples" / "standby.yaml")
    sts = find_doc(docs, "StatefulSet", "-master")
    spec = sts["spec"]
    assert spec["replicas"] == 2 and "volumeClaimTemplates" not in spec
    pvc = find_doc(docs, "PersistentVolumeClaim", "-master-state")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["spec"]["storageClassName"] == "cephfs"
    assert pvc["spec"]["resources"]["requests"]["storage"] == "2Gi"
    pod = spec["template"]["spec"]
    state = next(v for v in pod["volumes"] if v["name"] == "state")
    assert state == {
        "name": "state",
        "persistentVolumeClaim": {"claimName": pvc["metadata"]["name"]},
    }
    master = container_of(sts, "master")
    assert "--standby" in master["args"]
    # a waiting standby binds no port: an HTTP probe would restart it, or hold a rolling
    # update forever; `shoal master probe` passes it and fails a hung active master
    probe = ["shoal", "master", "probe", "--state-dir=/var/lib/shoal/master"]
    assert master["livenessProbe"]["exec"]["command"] == probe
    assert master["readinessProbe"]["exec"]["command"] == probe
    assert pod["affinity"]["podAntiAffinity"]  # apart where the scheduler can
    # workers, the mount pod and the operator are given both masters
    svc = "shoal-master"
    both = ",".join(f"http://{svc}-{i}.{svc}-headless.shoal-system.svc:19999" for i in range(2))
    worker = container_of(find_doc(docs, "DaemonSet", "-worker"), "worker")
    assert {"name": "SHOAL_MASTER", "value": both} in worker["env"]
    operator = container_of(find_doc(docs, "Deployment", "-operator"), "operator")
    assert f"--master={both}" in operator["args"]
    # without it: one master, its own claim, HTTP probes
    plain = find_doc(chart.template(), "StatefulSet", "-master")
    assert plain["spec"]["replicas"] == 1 and plain["spec"]["volumeClaimTemplates"]
    assert "--standby" not in container_of(plain, "master")["args"]


def test_workers_run_on_cache_nodes_with_one_flag_and_volume_per_tier(
    chart: Any, find_doc: Callable[..., Doc], container_of: Callable[[Doc, str], Doc]
) -> None:
    docs = chart.template(CHART / "examples" / "dedicated-cache-nodes.yaml")
    ds = find_doc(docs, "DaemonSet", "-worker")
    pod = ds["spec"]["template"]["spec"]
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    expr = term["nodeSelectorTerms"][0]["matchExpressions"][0]
    assert (expr["key"], expr["operator"], expr["values"]) == (
        "shoal.io/cache-node",
        "In",
        ["true"],
    )
    worker = container_of(ds, "worker")
    tiers = [a.split("=", 1)[1] for a in worker["args"] if a.startswith("--tier=")]
    assert tiers == [
        "mem:/var/lib/shoal/tiers/mem:16Gi",
        "ssd:/var/lib/shoal/tiers/ssd:1500Gi:0.9:0.75",
        "hdd:/var/lib/shoal/tiers/hdd:8Ti",
    ]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tier-mem"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    assert volumes["tier-ssd"]["hostPath"]["path"] == "/mnt/nvme0/shoal"
    assert volumes["tier-hdd"]["hostPath"]["path"] == "/mnt/hdd0/shoal"
    # credentials by reference only: the Secret's keys become env, nothing in plain values
    assert worker["envFrom"] == [{"secretRef": {"name": "s3-credentials"}}]
    # ...and credential files where the operator's credentials_file points
    assert {
        "name": "ufs-imagenet-s3",
        "mountPath": "/etc/shoal/secrets/imagenet-s3",
        "readOnly": True,
    } in worker["volumeMounts"]
    assert {
        "name": "ufs-imagenet-s3",
        "secret": {"secretName": "imagenet-s3", "defaultMode": 0o440},
    } in pod["volumes"]
    env = {e["name"]: e for e in worker["env"]}
    assert env["SHOAL_SECRET"]["valueFrom"]["secretKeyRef"]["key"] == "token"
    assert env["SHOAL_NODE"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # the init container hands exactly the host paths to the worker's user
    init = pod["initContainers"][0]
    assert init["command"][-3:] == [
        "/var/lib/shoal/worker",
        "/var/lib/shoal/tiers/ssd",
        "/var/lib/shoal/tiers/hdd",
    ]


def test_workers_drain_on_sigterm_within_their_grace_period(
    chart: Any, find_doc: Callable[..., Doc], container_of: Callable[[Doc, str], Doc]
) -> None:
    for sets, drain in (((), 60), (("worker.drainTimeoutSeconds=300",), 300)):
        ds = find_doc(chart.template(sets=sets), "DaemonSet", "-worker")
        args = container_of(ds, "worker")["args"]
        assert f"--drain-timeout={drain}" in args
        # the kubelet's SIGKILL comes after the drain could end
        assert ds["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > drain


def test_memory_only_workers_have_one_ram_tier_and_no_host_cache(
    chart: Any, find_doc: Callable[..., Doc], container_of: Callable[[Doc, str], Doc]
) -> None:
    docs = chart.template(CHART / "examples" / "memory-only.yaml")
    ds = find_doc(docs, "DaemonSet", "-worker")
    tiers = [a for a in container_of(ds, "worker")["args"] if a.startswith("--tier=")]
    assert tiers == ["--tier=mem:/var/lib/shoal/tiers/mem:24Gi:0.9:0.8"]
    host = [
        v["hostPath"]["path"] for v in ds["spec"]["template"]["spec"]["volumes"] if "hostPath" in v
    ]
    assert host == ["/var/lib/shoal/worker"]
    sts = find_doc(docs, "StatefulSet", "-master")
    assert "volumeClaimTemplates" not in sts["spec"]


def test_the_node_pod_has_fuse_privileges_and_the_propagation_csi_needs(
    chart: Any, find_doc: Callable[..., Doc], container_of: Callable[[Doc, str], Doc]
) -> None:
    docs = chart.template()
    ds = find_doc(docs, "DaemonSet", "-node")
    fuse = container_of(ds, "fuse")
    assert fuse["securityContext"]["privileged"] is True
    mounts = {m["name"]: m for m in fuse["volumeMounts"]}
    assert mounts["mount-root"]["mountPropagation"] == "Bidirectional"
    assert mounts["dev-fuse"]["mountPath"] == "/dev/fuse"
    assert fuse["command"] == ["shoal", "mount"] and fuse["args"][0] == "/var/lib/shoal/mnt"
    csi = container_of(ds, "csi")
    assert csi["args"] == [
        "--endpoint=unix:///csi/csi.sock",
        "--mount-root=/var/lib/shoal/mnt",
        "--node-id=$(NODE_NAME)",
    ]
    cm = {m["name"]: m for m in csi["volumeMounts"]}
    assert cm["kubelet-dir"]["mountPropagation"] == "Bidirectional"
    reg = container_of(ds, "node-driver-registrar")
    assert (
        "--kubelet-registration-path=/var/lib/kubelet/plugins/csi.shoal.io/csi.sock" in reg["args"]
    )
    driver = find_doc(docs, "CSIDriver")
    assert driver["metadata"]["name"] == "csi.shoal.io"
    assert driver["spec"]["attachRequired"] is False


def test_csi_command_comes_from_values(
    chart: Any,
    find_doc: Callable[..., Doc],
    container_of: Callable[[Doc, str], Doc],
    tmp_path: Path,
) -> None:
    values = tmp_path / "csi.yaml"
    node = {
        "mountRoot": "/data/shoal",
        "csi": {
            "command": ["python3", "-m", "shoal.csi"],
            "args": ["--socket={socket}", "--root={mountRoot}"],
        },
    }
    values.write_text(yaml.safe_dump({"node": node}))
    docs = chart.template(values)
    csi = container_of(find_doc(docs, "DaemonSet", "-node"), "csi")
    assert csi["command"] == ["python3", "-m", "shoal.csi"]
    assert csi["args"] == ["--socket=/csi/csi.sock", "--root=/data/shoal"]


def test_webhook_serves_the_certificate_its_configuration_trusts(
    chart: Any, find_doc: Callable[..., Doc]
) -> None:
    from cryptography import x509

    docs = chart.template()
    secret = find_doc(docs, "Secret", "-webhook-tls")
    hook = find_doc(docs, "MutatingWebhookConfiguration")["webhooks"][0]
    assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    assert hook["clientConfig"]["service"]["name"].endswith("-webhook")
    assert hook["failurePolicy"] == "Ignore"
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "shoal-webhook.shoal-system.svc" in names.get_values_for_type(x509.DNSName)
    # the release's own namespace is never sent to its own webhook
    assert "shoal-system" in hook["namespaceSelector"]["matchExpressions"][0]["values"]


def test_tls_example_uses_cert_manager_and_an_existing_token(
    chart: Any, find_doc: Callable[..., Doc], container_of: Callable[[Doc, str], Doc]
) -> None:
    docs = chart.template(CHART / "examples" / "tls.yaml")
    assert not [d for d in docs if d["kind"] == "Secret"], (
        "no chart-made Secret with TLS from cert-manager"
    )
    certs = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Certificate"}
    assert set(certs) == {"shoal-tls", "shoal-webhook"}
    hook = find_doc(docs, "MutatingWebhookConfiguration")
    assert (
        hook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        == "shoal-system/shoal-webhook"
    )
    master = container_of(find_doc(docs, "StatefulSet", "-master"), "master")
    env = {e["name"]: e for e in master["env"]}
    assert env["SHOAL_SECRET"]["valueFrom"]["secretKeyRef"]["name"] == "shoal-token"
    assert env["SHOAL_TLS_CERT_FILE"]["value"] == "/etc/shoal/tls/tls.crt"


def test_optional_monitoring_templates(chart: Any, find_doc: Callable[..., Doc]) -> None:
    assert not [d for d in chart.template() if d["kind"] in ("ServiceMonitor", "ConfigMap")]
    docs = chart.template(
        sets=["metrics.serviceMonitor.enabled=true", "metrics.dashboard.enabled=true"]
    )
    monitor = find_doc(docs, "ServiceMonitor")
    service = find_doc(docs, "Service", "-master")
    # selects the API Service only (not the headless one, which would scrape twice)
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    headless = find_doc(docs, "Service", "-master-headless")
    assert (
        not monitor["spec"]["selector"]["matchLabels"].items()
        <= headless["metadata"]["labels"].items()
    )
    board = find_doc(docs, "ConfigMap", "-dashboard")
    assert board["data"]["shoal.json"] == (CHART / "dashboards" / "shoal.json").read_text()


def test_dataset_volumes_bind_a_claim_to_a_csi_volume(
    chart: Any, find_doc: Callable[..., Doc]
) -> None:
    docs = chart.template(CHART / "examples" / "single-node.yaml")
    pv = find_doc(docs, "PersistentVolume")
    pvc = find_doc(docs, "PersistentVolumeClaim")
    assert pv["spec"]["csi"]["driver"] == "csi.shoal.io"
    assert pv["spec"]["csi"]["volumeAttributes"]["dataset"] == "demo"
    assert pv["spec"]["claimRef"] == {"namespace": "default", "name": "demo"}
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"]
    assert pvc["metadata"]["namespace"] == "default"
    assert pv["spec"]["accessModes"] == pvc["spec"]["accessModes"] == ["ReadOnlyMany"]
    assert not [d for d in chart.template() if d["kind"] == "PersistentVolume"]


def test_operator_command_and_rbac(
    chart: Any, find_doc: Callable[..., Doc], container_of: Callable[[Doc, str], Doc]
) -> None:
    docs = chart.template(sets=["operator.command={shoal,operator}", "operator.logLevel=debug"])
    dep = find_doc(docs, "Deployment", "-operator")
    op = container_of(dep, "operator")
    assert op["command"] == ["shoal", "operator"]
    assert op["args"] == [
        "--master=http://shoal-master.shoal-system.svc:19999",
        "--secrets-root=/etc/shoal/secrets",
        "--webhook-port=9443",
        "--tls-cert=/etc/shoal/webhook/tls.crt",
        "--tls-key=/etc/shoal/webhook/tls.key",
        "--verbose",
    ]
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == "shoal-operator"
    role = find_doc(docs, "ClusterRole", "-operator")
    by_resource = {r: rule["verbs"] for rule in role["rules"] for r in rule["resources"]}
    assert "patch" in by_resource["nodes"]
    binding = find_doc(docs, "ClusterRoleBinding", "-operator")
    assert binding["subjects"][0] == {
        "kind": "ServiceAccount",
        "name": "shoal-operator",
        "namespace": "shoal-system",
    }


def test_the_walkthrough_manifests_are_valid(validator: Any) -> None:
    docs = [
        d
        for f in sorted((CHART / "examples" / "walkthrough").glob("*.yaml"))
        for d in yaml.safe_load_all(f.read_text())
        if d
    ]
    assert {d["kind"] for d in docs} == {"Dataset", "DataLoad", "Pod"}
    problems = [p for d in docs for p in validator.errors(d)]
    assert not problems, "\n".join(problems)
    by_kind = {d["kind"]: d for d in docs}
    claim = by_kind["Pod"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
    # the operator names the claim after the Dataset; the DataLoad names the Dataset
    assert claim == by_kind["Dataset"]["metadata"]["name"] == by_kind["DataLoad"]["spec"]["dataset"]


def test_webhook_configuration_matches_what_the_operator_serves(
    chart: Any, find_doc: Callable[..., Doc]
) -> None:
    webhook = pytest.importorskip("shoal.operator.webhook")
    rendered = find_doc(chart.template(), "MutatingWebhookConfiguration")["webhooks"][0]
    want = webhook.configuration("shoal-webhook", "shoal-system", "CA")["webhooks"][0]
    for key in ("name", "rules", "namespaceSelector", "failurePolicy", "timeoutSeconds"):
        assert rendered[key] == want[key], key
    assert rendered["clientConfig"]["service"]["path"] == want["clientConfig"]["service"]["path"]


def test_operator_role_grants_what_the_operator_calls(
    chart: Any, find_doc: Callable[..., Doc]
) -> None:
    needed = CHART.parents[1] / "examples" / "operator-rbac.yaml"
    if not needed.exists():
        pytest.skip("the operator publishes no RBAC list (deploy/examples/operator-rbac.yaml)")
    want = next(d for d in yaml.safe_load_all(needed.read_text()) if d["kind"] == "ClusterRole")
    role = find_doc(chart.template(), "ClusterRole", "-operator")

    def grants(rules: list[Doc]) -> set[tuple[str, str, str]]:
        return {
            (g, r, v)
            for rule in rules
            for g in rule["apiGroups"]
            for r in rule["resources"]
            for v in rule["verbs"]
        }

    assert grants(want["rules"]) <= grants(role["rules"])


def test_no_gateway_by_default(chart: Any) -> None:
    docs = chart.template()
    assert not [d for d in docs if "-gateway-" in d["metadata"]["name"]]


def test_the_gateways_run_beside_the_workers_and_reach_their_socket(
    chart: Any, find_doc: Callable[..., Doc], container_of: Callable[[Doc, str], Doc]
) -> None:
    docs = chart.template(CHART / "examples" / "gateways.yaml")
    worker = find_doc(docs, "DaemonSet", "-worker")
    for kind, port in (("s3", 9000), ("webhdfs", 9870)):
        ds = find_doc(docs, "DaemonSet", f"-gateway-{kind}")
        pod = ds["spec"]["template"]["spec"]
        # the same nodes as the workers: every gateway has a worker on its node
        assert pod["affinity"] == worker["spec"]["template"]["spec"]["affinity"]
        gw = container_of(ds, "gateway")
        assert gw["command"] == ["shoal", "gateway", kind]
        assert f"--port={port}" in gw["args"] and "--host=0.0.0.0" in gw["args"]
        assert "--allow-anonymous" not in gw["args"]
        assert "--credentials=/etc/shoal/gateway/credentials.toml" in gw["args"]
        assert {"name": "worker-dir", "mountPath": "/var/lib/shoal/worker"} in gw["volumeMounts"]
        vols = {v["name"]: v for v in pod["volumes"]}
        assert vols["worker-dir"]["hostPath"]["path"] == "/var/lib/shoal/worker"
        assert {e["name"] for e in gw["env"]} >= {"SHOAL_MASTER", "SHOAL_SECRET", "SHOAL_NODE"}
        assert pod["securityContext"]["runAsNonRoot"] is True
        svc = find_doc(docs, "Service", f"-gateway-{kind}")
        assert svc["spec"]["ports"][0]["port"] == port
        assert svc["spec"]["selector"] == ds["spec"]["selector"]["matchLabels"]
    s3 = find_doc(docs, "DaemonSet", "-gateway-s3")
    args = container_of(s3, "gateway")["args"]
    assert "--writable=ckpt" in args and "--uploads-dir=/var/lib/shoal/uploads" in args
    vols = {v["name"]: v for v in s3["spec"]["template"]["spec"]["volumes"]}
    assert vols["uploads"]["persistentVolumeClaim"]["claimName"] == "shoal-s3-uploads"
    assert vols["gateway-credentials"]["secret"]["secretName"] == "shoal-s3-keys"
    assert find_doc(docs, "Service", "-gateway-s3")["spec"]["internalTrafficPolicy"] == "Local"
    hdfs = container_of(find_doc(docs, "DaemonSet", "-gateway-webhdfs"), "gateway")["args"]
    assert "--trust-user-name" in hdfs and "--block-size=128MiB" in hdfs


def test_a_gateway_without_credentials_serves_anonymous_reads(
    chart: Any, find_doc: Callable[..., Doc], container_of: Callable[[Doc, str], Doc]
) -> None:
    docs = chart.template(sets=["gateway.s3.enabled=true"])
    gw = container_of(find_doc(docs, "DaemonSet", "-gateway-s3"), "gateway")
    assert "--allow-anonymous" in gw["args"]
    assert not [a for a in gw["args"] if a.startswith("--credentials")]
    vols = find_doc(docs, "DaemonSet", "-gateway-s3")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "uploads", "emptyDir": {}} in vols
