"""A real Prometheus that finds backed pods through Kubernetes service discovery, as in production.

The config is written here: `kubernetes_sd_configs` role `pod` against the test apiserver, keeping
pods annotated `prometheus.io/scrape: "true"` and scraping `podIP:<prometheus.io/port><path>`.
Targets are kept only when the pod IP is in 127.0.0.0/8 (the one network this harness may use).
Labels: namespace, pod, and the pod label `wok.dev/service` as `service`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from wok_cluster.apiserver import ControlPlane
from wok_cluster.netutil import free_port
from wok_cluster.process import Supervisor
from wok_cluster.waiting import wait_until


def scrape_config(
    *, api_server: str, ca_file: Path, token_file: Path, interval: str = "1s"
) -> dict[str, Any]:
    def label(source: str, target: str) -> dict[str, Any]:
        return {"source_labels": [source], "target_label": target, "action": "replace"}

    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [
            {
                "job_name": "wok-pods",
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "kubernetes_sd_configs": [
                    {
                        "role": "pod",
                        "api_server": api_server,
                        "tls_config": {"ca_file": str(ca_file)},
                        "authorization": {"credentials_file": str(token_file)},
                    }
                ],
                "relabel_configs": [
                    {
                        "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"],
                        "regex": "true",
                        "action": "keep",
                    },
                    {
                        "source_labels": ["__meta_kubernetes_pod_ip"],
                        "regex": r"127\..+",
                        "action": "keep",
                    },
                    {
                        "source_labels": ["__meta_kubernetes_pod_phase"],
                        "regex": "Running",
                        "action": "keep",
                    },
                    {
                        "source_labels": [
                            "__meta_kubernetes_pod_ip",
                            "__meta_kubernetes_pod_annotation_prometheus_io_port",
                        ],
                        "regex": r"(.+);(\d+)",
                        "replacement": "$1:$2",
                        "target_label": "__address__",
                        "action": "replace",
                    },
                    {
                        "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_path"],
                        "regex": "(.+)",
                        "target_label": "__metrics_path__",
                        "action": "replace",
                    },
                    label("__meta_kubernetes_namespace", "namespace"),
                    label("__meta_kubernetes_pod_name", "pod"),
                    label("__meta_kubernetes_pod_label_wok_dev_service", "service"),
                ],
            }
        ],
    }


class Prometheus:
    def __init__(self, control_plane: ControlPlane, run_dir: Path, *, interval: str = "1s") -> None:
        self.run_dir = run_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.supervisor = Supervisor(run_marker=str(control_plane.run_dir))
        self.binary = control_plane.binaries.prometheus
        token_file = run_dir / "token"
        run_dir.mkdir(parents=True, exist_ok=True)
        token_file.write_text(control_plane.tokens["admin"])
        token_file.chmod(0o600)
        self.config_file = run_dir / "prometheus.yml"
        self.config: dict[str, Any] = scrape_config(
            api_server=control_plane.server,
            ca_file=control_plane.pki.ca_cert,
            token_file=token_file,
            interval=interval,
        )
        self.ready_seconds: float | None = None

    def write_config(self) -> None:
        self.config_file.write_text(yaml.safe_dump(self.config, sort_keys=False))

    def start(self, *, timeout: float = 30.0) -> Prometheus:
        started = time.monotonic()
        self.write_config()
        popen = self.supervisor.start(
            "prometheus",
            [
                self.binary,
                f"--config.file={self.config_file}",
                f"--storage.tsdb.path={self.run_dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
                "--log.level=warn",
            ],
            log=self.run_dir / "prometheus.log",
        )
        wait_until(
            lambda: self.supervisor.check_alive(popen) or self._get("/-/ready").is_success,
            timeout=timeout,
            what="prometheus /-/ready",
            interval=0.2,
        )
        self.ready_seconds = time.monotonic() - started
        return self

    def stop(self) -> None:
        self.supervisor.stop_all()

    def query(self, promql: str) -> list[dict[str, Any]]:
        """Instant query; returns the result vector (empty when nothing matches)."""
        response = self._get("/api/v1/query", params={"query": promql})
        response.raise_for_status()
        return list(response.json()["data"]["result"])

    def targets(self) -> list[dict[str, Any]]:
        response = self._get("/api/v1/targets")
        response.raise_for_status()
        return list(response.json()["data"]["activeTargets"])

    def _get(self, path: str, params: dict[str, str] | None = None) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", params=params, timeout=10.0)
