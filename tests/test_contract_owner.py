"""``contract.dljob_controller``: the one reading of "a DLJob controls this pod" that
the operator, the extender and the node agent share; a tenant's or a broken body's
shapes read as no owner."""

from __future__ import annotations

from typing import Any

import pytest

from powerflow.core import contract

DLJOB = {"apiVersion": contract.API_VERSION, "kind": contract.KIND, "name": "j", "uid": "u1"}


def test_the_dljob_controller_is_found_among_other_owners() -> None:
    other = {"kind": "ReplicaSet", "name": "rs", "uid": "u0", "controller": False}
    controller = {**DLJOB, "controller": True}
    assert contract.dljob_controller({"ownerReferences": [other, controller]}) == controller


@pytest.mark.parametrize(
    "refs",
    [
        None,
        "not a list",
        {"kind": contract.KIND},
        [],
        [DLJOB],  # an owner, not the controller
        [{**DLJOB, "controller": "true"}],  # a string is not the flag
        [{**DLJOB, "kind": "Job", "controller": True}],
        ["a string", 3, None],
    ],
    ids=[
        "none",
        "string",
        "mapping",
        "empty",
        "not-controller",
        "flag-string",
        "other-kind",
        "junk",
    ],
)
def test_anything_else_is_no_owner(refs: Any) -> None:
    assert contract.dljob_controller({"ownerReferences": refs}) is None
