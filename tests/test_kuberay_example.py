"""examples/kuberay-raycluster.yaml is a RayCluster KubeRay would take, checked offline: there is
no kubectl or Kubernetes API server here (`kubectl apply --dry-run=server` would need both, and
`--dry-run=client` does not know the CRD's schema). So PyYAML reads it and jsonschema checks it
against a schema written here from the fields of KubeRay's CRD (ray.io/v1 RayCluster:
ray-operator/config/crd/bases/ray.io_rayclusters.yaml) and of Kubernetes' PodSpec that the
example uses, closed (``additionalProperties: false``) so that a misspelt key fails as the API
server's pruning would silently drop it; and the CRD's rule that rayStartParams values are
strings (``num-gpus: 4`` unquoted is refused). Then what autoloop needs of it: no GPU on the
head, workers declaring to Ray the GPUs their pods ask Kubernetes for, one shared volume at
the same path on every pod, one Ray version everywhere."""

from __future__ import annotations

from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
jsonschema = pytest.importorskip("jsonschema")

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "kuberay-raycluster.yaml"


def closed(properties: dict, required: tuple[str, ...] = ()) -> dict:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


QUANTITY = {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": r"^[0-9.]+([KMGTPE]i?|m)?$"}]}
RESOURCES = closed({"requests": {"type": "object", "additionalProperties": QUANTITY},
                    "limits": {"type": "object", "additionalProperties": QUANTITY}})
CONTAINER = closed({
    "name": {"type": "string"}, "image": {"type": "string"}, "resources": RESOURCES,
    "command": {"type": "array", "items": {"type": "string"}},
    "lifecycle": closed({"postStart": closed({"exec": closed({"command": {"type": "array",
                                                                         "items": {"type": "string"}}})})}),
    "volumeMounts": {"type": "array", "items": closed({"name": {"type": "string"}, "mountPath": {"type": "string"}},
                                                      ("name", "mountPath"))},
}, ("name", "image"))
POD_TEMPLATE = closed({"metadata": {"type": "object"}, "spec": closed({
    "containers": {"type": "array", "minItems": 1, "items": CONTAINER},
    "volumes": {"type": "array", "items": closed({"name": {"type": "string"},
                                                  "persistentVolumeClaim": closed({"claimName": {"type": "string"}},
                                                                                  ("claimName",))}, ("name",))},
}, ("containers",))}, ("spec",))
START_PARAMS = {"type": "object", "additionalProperties": {"type": "string"}}   # the CRD: map[string]string
RAY_CLUSTER = closed({
    "apiVersion": {"const": "ray.io/v1"}, "kind": {"const": "RayCluster"},
    "metadata": closed({"name": {"type": "string"}, "namespace": {"type": "string"}}, ("name",)),
    "spec": closed({
        "rayVersion": {"type": "string"},
        "enableInTreeAutoscaling": {"type": "boolean"},
        "headGroupSpec": closed({"rayStartParams": START_PARAMS, "serviceType": {"type": "string"},
                                 "enableIngress": {"type": "boolean"}, "template": POD_TEMPLATE}, ("template",)),
        "workerGroupSpecs": {"type": "array", "items": closed({
            "groupName": {"type": "string"}, "replicas": {"type": "integer", "minimum": 0},
            "minReplicas": {"type": "integer", "minimum": 0}, "maxReplicas": {"type": "integer", "minimum": 0},
            "numOfHosts": {"type": "integer", "minimum": 1}, "rayStartParams": START_PARAMS,
            "template": POD_TEMPLATE}, ("groupName", "template"))},
    }, ("headGroupSpec",)),
}, ("apiVersion", "kind", "metadata", "spec"))


def documents() -> dict[str, dict]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(EXAMPLE.read_text())}


def test_the_raycluster_matches_kuberays_fields():
    cluster = documents()["RayCluster"]
    jsonschema.validate(cluster, RAY_CLUSTER)
    broken = next(yaml.safe_load_all(EXAMPLE.read_text().replace('num-gpus: "4"', "num-gpus: 4")))
    with pytest.raises(jsonschema.ValidationError):   # the schema is not a rubber stamp
        jsonschema.validate(broken, RAY_CLUSTER)


def test_the_raycluster_gives_autoloop_what_it_needs():
    docs = documents()
    spec = docs["RayCluster"]["spec"]
    head = spec["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"   # the orchestrator's node takes no trial
    pods = [head["template"]["spec"]] + [w["template"]["spec"] for w in spec["workerGroupSpecs"]]
    for worker in spec["workerGroupSpecs"]:
        (container,) = worker["template"]["spec"]["containers"]
        limits = container["resources"]["limits"]
        # Ray hands out to trials what the pod holds of Kubernetes' GPUs, no more.
        assert str(limits["nvidia.com/gpu"]) == worker["rayStartParams"]["num-gpus"], worker
        assert worker["minReplicas"] <= worker["replicas"] <= worker["maxReplicas"]
    mounts = set()
    for pod in pods:
        (container,) = pod["containers"]
        assert container["image"].startswith(f"rayproject/ray:{spec['rayVersion']}-"), container["image"]
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]}
        mounts |= {(m["mountPath"], claims[m["name"]]) for m in container["volumeMounts"]}
        assert "autoloop[ray]" in " ".join(container["lifecycle"]["postStart"]["exec"]["command"])
    assert mounts == {("/night", "autoloop-night")}, mounts   # one shared volume, one path, every pod
    claim = docs["PersistentVolumeClaim"]
    assert claim["metadata"]["name"] == "autoloop-night" and claim["spec"]["accessModes"] == ["ReadWriteMany"]
