# SPDX-License-Identifier: MIT
"""The version probe: KvtierConnector's overrides match the installed vLLM's
KVConnectorBase_V1, and import refuses a vLLM outside the supported range, naming it."""
from __future__ import annotations

import inspect

import pytest

import kvtier.vllm as kv
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1


def test_overrides_match_the_base_class() -> None:
    for name in kv.OVERRIDDEN:
        base = getattr(KVConnectorBase_V1, name, None)
        assert base is not None, f"KVConnectorBase_V1 has no {name} any more"
        mine = getattr(kv.KvtierConnector, name)
        assert mine is not base, f"KvtierConnector does not override {name}"
        pb = list(inspect.signature(base).parameters)
        pm = list(inspect.signature(mine).parameters)
        assert pm == pb, f"{name}{pm} against the base's {name}{pb}"
    # Every abstract method of the base is one of them: the class can be instantiated.
    assert not kv.KvtierConnector.__abstractmethods__
    assert set(KVConnectorBase_V1.__abstractmethods__) <= set(kv.OVERRIDDEN)


@pytest.mark.parametrize("version", ["0.31.2", "0.33.0", "1.0.0", "dev"])
def test_refuses_other_versions(version: str) -> None:
    with pytest.raises(ImportError, match=f"found vLLM {version}"):
        kv.check_vllm_version(version)


def test_accepts_the_installed_version() -> None:
    import vllm

    kv.check_vllm_version(vllm.__version__)
    kv.check_vllm_version("0.32.0+cpu")
