"""How the operator renders a pod with `runtime.compile`: `--compile`, and with
`compileCacheHostPath` the node's directory over the cache's `compile/` (where the runtime keeps
one set of builds per CPU, compile_cache.py), given to the runtime's user by an init container."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from wok_operator.api import InferenceServiceSpec
from wok_operator.budget import plan_for_spec
from wok_operator.resources import desired_deployment
from wok_runtime.kernels.compile_cache import cache_dirs


def pod_spec(**runtime: object) -> dict[str, Any]:
    spec = InferenceServiceSpec.model_validate(
        {"model": {"source": "builtin:tiny"}, "runtime": runtime}
    )
    deployment = desired_deployment("svc", "ns", spec, budget=plan_for_spec(spec), replicas=1)
    return deployment["spec"]["template"]["spec"]


def test_by_default_a_pod_neither_compiles_nor_touches_the_node() -> None:
    pod = pod_spec()
    (container,) = pod["containers"]
    assert "--compile" not in container["args"]
    assert "initContainers" not in pod
    assert not any("hostPath" in volume for volume in pod["volumes"])
    # a host path without `compile` mounts nothing: no build would use it
    assert pod_spec(compileCacheHostPath="/var/lib/wok/compile") == pod


def test_compile_alone_builds_into_the_pods_own_cache() -> None:
    pod = pod_spec(compile=True)
    (container,) = pod["containers"]
    assert container["args"].count("--compile") == 1
    assert {"name": "WOK_CACHE_DIR", "value": "/var/cache/wok"} in container["env"]
    assert {"name": "cache", "emptyDir": {}} in pod["volumes"]
    assert "initContainers" not in pod


def test_a_node_compile_cache_is_mounted_where_the_runtime_keeps_its_builds() -> None:
    pod = pod_spec(compile=True, compileCacheHostPath="/var/lib/wok/compile")
    (container,) = pod["containers"]
    volume = {
        "name": "compile-cache",
        "hostPath": {"path": "/var/lib/wok/compile", "type": "DirectoryOrCreate"},
    }
    assert volume in pod["volumes"]
    mount = {"name": "compile-cache", "mountPath": "/var/cache/wok/compile"}
    assert mount in container["volumeMounts"]
    # under WOK_CACHE_DIR, where compile_cache.cache_dirs puts compile/<cpu key>/
    assert {"name": "WOK_CACHE_DIR", "value": "/var/cache/wok"} in container["env"]
    (owner,) = pod["initContainers"]
    assert owner["command"] == ["chown", "1000:1000", "/var/cache/wok/compile"]
    assert owner["volumeMounts"] == [mount]
    assert owner["image"] == container["image"]
    assert owner["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert container["securityContext"]["runAsUser"] == 1000


def test_the_compile_cache_lands_under_the_cache_dir_the_runtime_reads() -> None:
    pod = pod_spec(compile=True, compileCacheHostPath="/var/lib/wok/compile")
    (container,) = pod["containers"]
    cache_root = next(e["value"] for e in container["env"] if e["name"] == "WOK_CACHE_DIR")
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    mounted = mounts["compile-cache"]
    for path in cache_dirs(Path(cache_root), "x86_64-abc").values():
        assert path.is_relative_to(mounted)
