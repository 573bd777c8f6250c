"""The `wok` CLI as a new user meets it: --version, a default shown for every option in every
command's --help, and `wok budget` refusing what it cannot mean."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator
from importlib.metadata import version

import pytest

from wok.cli import build_parser, main
from wok_operator import cli as operator_cli


def commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser of the CLI, with the words that reach it (`("batch", "run")`)."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, command in action.choices.items():
                yield from commands(command, (*path, name))


def test_version_prints_the_installed_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"wok {version('wok')}"


def test_every_option_with_a_default_shows_it_in_help():
    missing = []
    for path, parser in commands(build_parser()):
        text = " ".join(parser.format_help().split())
        for action in parser._actions:
            default = action.default
            if default is None or default is False or default is argparse.SUPPRESS:
                continue
            if action.help is argparse.SUPPRESS or not action.option_strings:
                continue
            if f"default: {default}" not in text and "(default: " not in (action.help or ""):
                missing.append(f"wok {' '.join(path)} {action.option_strings[-1]}")
    assert not missing, missing


def test_the_budget_help_shows_the_max_model_len_default(capsys):
    with pytest.raises(SystemExit):
        main(["budget", "--help"])
    assert "--max-model-len TOKENS longest sequence (default: 4096)" in " ".join(
        capsys.readouterr().out.split()
    )


@pytest.mark.parametrize("flag", ["--gpu-memory", "--reserve"])
@pytest.mark.parametrize("size", ["80", "8.5"])
def test_a_memory_size_without_a_unit_is_refused_naming_both_readings(capsys, flag, size):
    assert main(["budget", "--preset", "llama-3-8b", flag, size]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"wok budget: error: {flag} {size} has no unit: write {size}Gi (GiB, 2^30 bytes) or "
        f"{size}G (GB, 10^9 bytes)"
    )


def test_a_reserve_of_zero_needs_no_unit(capsys):
    assert main(["budget", "--preset", "llama-3-8b", "--reserve", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["reserve_bytes"] == 0


def test_a_memory_size_with_a_unit_is_read_in_it(capsys):
    assert main(["budget", "--preset", "llama-3-8b", "--gpu-memory", "80G", "--json"]) == 0
    decimal = json.loads(capsys.readouterr().out)
    assert main(["budget", "--preset", "llama-3-8b", "--gpu-memory", "80Gi", "--json"]) == 0
    binary = json.loads(capsys.readouterr().out)
    assert decimal["kv_budget_bytes"] < binary["kv_budget_bytes"]


def test_a_sequence_longer_than_the_context_is_refused(capsys):
    argv = ["budget", "--preset", "llama-3-8b", "--max-model-len", "8192"]
    assert main([*argv, "--sequence-length", "9000"]) == 2
    assert capsys.readouterr().err.strip() == (
        "wok budget: error: --sequence-length 9000 is above --max-model-len 8192: no sequence "
        "is longer than the model's context"
    )
    assert main([*argv, "--sequence-length", "8192"]) == 0


def test_more_gpus_split_the_weights_and_leave_more_kv_cache(capsys):
    def kv_cache_gib(gpus: int) -> float:
        assert main(["budget", "--preset", "llama-3-8b", "--gpus", str(gpus)]) == 0
        captured = capsys.readouterr()
        assert captured.err == ""
        line = next(ln for ln in captured.out.splitlines() if "KV cache" in ln)
        return float(line.split()[2])

    one, four = kv_cache_gib(1), kv_cache_gib(4)
    assert four > 4 * one


def test_dev_operator_runs_the_operator_with_the_dev_clusters_flags(tmp_path, monkeypatch):
    """`wok dev operator -- FLAGS` parses `wok operator run` with the cluster's Prometheus, the
    backer's pod label and FLAGS last (the operator itself needs a cluster: a fake stands in)."""
    kubeconfig = tmp_path / "admin.kubeconfig"
    state = {"kubeconfig": str(kubeconfig), "prometheus": "http://127.0.0.1:9090"}
    (tmp_path / "state.json").write_text(json.dumps(state))
    monkeypatch.setenv("WOK_DEV_DIR", str(tmp_path))
    monkeypatch.setenv("KUBECONFIG", "")
    seen: list[argparse.Namespace] = []

    def fake_run_operator(args: argparse.Namespace) -> int:
        seen.append(args)
        return 0

    monkeypatch.setattr(operator_cli, "run_operator", fake_run_operator)
    assert main(["dev", "operator", "-n", "team", "--", "--lease-duration=30"]) == 0
    (args,) = seen
    assert args.namespace == ["team"]
    assert args.prometheus_url == "http://127.0.0.1:9090"
    assert args.standalone and args.metrics_port == 0 and args.lease_duration == 30
    assert os.environ["KUBECONFIG"] == str(kubeconfig)
