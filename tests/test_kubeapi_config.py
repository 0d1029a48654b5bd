"""The shared configuration rules (``powerflow/kubeapi/config.py``): which source wins,
and that every unusable configuration is one line naming the source."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.operator_harness import write_kubeconfig

from powerflow.kubeapi.config import KubeConfigError, Source, load_configuration, resolve_source


def test_an_explicit_file_wins_then_the_pods_account_then_kubeconfig_then_home() -> None:
    in_pod = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBECONFIG": "/env/kc"}
    assert resolve_source("/given", in_pod) == Source("/given")
    assert resolve_source(None, in_pod) == Source(None)
    assert resolve_source(None, {"KUBECONFIG": "/env/kc"}) == Source("/env/kc")
    assert resolve_source(None, {}) == Source(os.path.expanduser("~/.kube/config"))
    assert resolve_source("", {}) == resolve_source(None, {})  # an empty option is no option


def test_a_kubeconfig_list_is_merged_and_missing_entries_are_skipped(tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "kc", "http://emulator:8080", token="t0k")
    cfg = load_configuration(Source(f"{tmp_path / 'missing'}{os.pathsep}{path}"))
    assert cfg.host == "http://emulator:8080"
    assert cfg.get_api_key_with_prefix("BearerToken") == "Bearer t0k"


def one_line_error(source: Source) -> str:
    with pytest.raises(KubeConfigError) as info:
        load_configuration(source)
    text = str(info.value)
    assert "\n" not in text
    assert info.value.__cause__ is None  # no chained traceback behind the line
    return text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("clusters: [\n", ": not a usable kubeconfig (ParserError: "),
        ("just a string", ": not a usable kubeconfig ("),
        ("apiVersion: v1\nkind: Config\n", "current-context"),
    ],
)
def test_a_garbage_kubeconfig_is_one_line_naming_it(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(text)
    message = one_line_error(Source(str(path)))
    assert message.startswith(f"{path}: ") and expected in message


def test_no_file_and_no_server_are_one_line(tmp_path: Path) -> None:
    missing = f"{tmp_path / 'a'}{os.pathsep}{tmp_path / 'b'}"
    assert one_line_error(Source(missing)) == f"kubeconfig {missing}: no such file"
    assert one_line_error(Source(os.pathsep)) == f"kubeconfig {os.pathsep}: no such file"
    serverless = write_kubeconfig(tmp_path / "kc", "")
    assert one_line_error(Source(str(serverless))) == (
        f"{serverless}: no cluster server in the configuration"
    )


def test_in_a_pod_without_its_account_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    assert one_line_error(Source(None)).startswith("in-cluster service account: ")
