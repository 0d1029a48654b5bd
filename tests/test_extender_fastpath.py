"""The request fast path gives what the model-based path gives, on random inputs.

Filter and prioritize decode their bodies with ``wire.decode_args`` and write
their answers with ``wire.filter_answer``/``encode``; the state answers from
the gang's block alone. Each is checked against the general version of the
same step: pydantic's ``ExtenderArgs.model_validate`` on the stdlib decoder's
output, ``dump(filter_result(...))`` through Starlette's ``JSONResponse``, and
per-candidate loops over ``ClusterState`` (``filter_by_candidate``,
``prioritize_by_candidate`` below).
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

import httpx
import orjson
import pydantic
import pytest
from extender_bodies import node, pod
from fastapi.responses import JSONResponse
from hypothesis import example, given, settings
from hypothesis import strategies as st
from powerflow.extender import create_app
from powerflow.extender.candidates import MAPS_KEPT, AllBut, Candidates, NamesMemo
from powerflow.extender.objects import pod_info
from powerflow.extender.state import ClusterState, FilterAnswer
from powerflow.extender.wire import (
    MAX_EXTENDER_PRIORITY,
    ExtenderArgs,
    WireError,
    decode_args,
    dump,
    encode,
    encode_filter,
    encode_priorities,
    filter_answer,
    filter_result,
    loads,
)

from powerflow.core.errors import PlacementError

fast = settings(max_examples=200, deadline=None, derandomize=True)
JSON_TYPE = {"Content-Type": "application/json"}

names = st.text(max_size=8) | st.sampled_from(["gpu-0", "gpu-1", "Ünïcode", "a\u2028b", 'q"\\/'])
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=6)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=12,
)
node_objects = st.one_of(
    st.builds(lambda n: {"metadata": {"name": n}}, names),
    st.dictionaries(st.sampled_from(["metadata", "status", "x"]), json_values, max_size=3),
    json_values,
)
keys = {
    "Pod": st.sampled_from(["Pod", "pod", "POD", "pOd"]),
    "Nodes": st.sampled_from(["Nodes", "nodes", "NODES"]),
    "NodeNames": st.sampled_from(["NodeNames", "nodenames", "NODENAMES", "nodeNames"]),
}


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    """ExtenderArgs-like JSON: right and wrong types, folded keys, duplicates, NaN, big ints."""
    if draw(st.integers(0, 9)) == 0:
        return json.dumps(draw(json_values)).encode()
    body: dict[str, Any] = {}
    for field in ("Pod", "Nodes", "NodeNames", "Pod", "Other"):
        if not draw(st.booleans()):
            continue
        key = draw(keys[field]) if field in keys else field
        if field == "Pod":
            body[key] = draw(st.just(pod("p", job="j", workers=2)) | json_values)
        elif field == "NodeNames":
            body[key] = draw(st.lists(names, max_size=5) | json_values)
        elif field == "Nodes":
            items = st.lists(node_objects, max_size=4)
            extra = st.dictionaries(st.sampled_from(["metadata", "kind", "Items"]), json_values)
            body[key] = draw(
                st.builds(lambda i, e: {"items": i, **e}, items, extra)
                | st.builds(lambda e: e, extra)
                | json_values
            )
        else:
            body[key] = draw(json_values)
    return json.dumps(body).encode()  # NaN and Infinity as the stdlib writes them


def by_model(raw: bytes) -> ExtenderArgs:
    """The general path: the stdlib decoder (as FastAPI), then the pydantic model."""
    return ExtenderArgs.model_validate(json.loads(raw))


def same_json(a: bytes, b: bytes) -> bool:
    """Equal as JSON values, object keys in the same order, NaN never present."""
    ordered = {"object_pairs_hook": list}
    return bool(json.loads(a, **ordered) == json.loads(b, **ordered))


@fast
@given(raw=bodies())
def test_decoding_accepts_and_refuses_what_the_model_does(raw: bytes) -> None:
    try:
        expected = by_model(raw)
    except pydantic.ValidationError:
        with pytest.raises(WireError, match="cannot decode the request"):
            decode_args(raw, "application/json")
        return
    got = decode_args(raw, "application/json")
    assert got.Pod == expected.Pod or (json.dumps(got.Pod) == json.dumps(expected.Pod))
    assert got.NodeNames == expected.NodeNames
    if expected.Nodes is None:
        assert got.Nodes is None
    else:
        assert got.Nodes is not None
        assert json.dumps(got.Nodes.items) == json.dumps(expected.Nodes.items)
        assert json.dumps(got.Nodes.model_extra) == json.dumps(expected.Nodes.model_extra)


plain_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=12,
)
"""JSON as kube-scheduler's encoder writes it: no NaN or infinities."""


@fast
@given(
    pod_body=st.just(pod("p", job="j", workers=2))
    | st.dictionaries(st.text(max_size=5), plain_values),
    node_names=st.lists(names, max_size=6) | st.none(),
    items=st.none() | st.lists(st.dictionaries(st.text(max_size=5), plain_values), max_size=3),
)
def test_the_schedulers_bodies_are_read_in_one_pass(
    pod_body: dict[str, Any], node_names: list[str] | None, items: list[Any] | None
) -> None:
    """A body as kube-scheduler writes it (its three keys, the right types) never reaches
    the general decoder, and reads as the model reads it."""
    nodes = None if items is None else {"items": items}
    raw = json.dumps({"Pod": pod_body, "Nodes": nodes, "NodeNames": node_names}).encode()
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr("powerflow.extender.wire.loads", None)  # the general path would fail
        got = decode_args(raw, "application/json")
    expected = by_model(raw)
    assert json.dumps(got.Pod) == json.dumps(expected.Pod)
    assert got.NodeNames == expected.NodeNames
    assert (got.Nodes is None) == (expected.Nodes is None)
    if got.Nodes is not None and expected.Nodes is not None:
        assert json.dumps(got.Nodes.items) == json.dumps(expected.Nodes.items)


@fast
@given(raw=bodies(), data=st.data())
def test_filter_answers_are_the_json_the_models_gave(raw: bytes, data: st.DataObject) -> None:
    try:
        args = decode_args(raw)
    except WireError:
        return
    candidates = args.candidate_names()
    admitted = data.draw(
        st.lists(st.sampled_from(candidates), max_size=3) if candidates else st.just([])
    )
    failed = {n: data.draw(names) for n in candidates if n not in admitted}
    never = {f"x{k}": "never" for k in failed}
    general = JSONResponse(dump(filter_result(by_model(raw), admitted, failed, never))).body
    answer = filter_answer(args, admitted, failed, never)
    assert same_json(encode(answer), bytes(general))
    if answer["Nodes"] is None:  # names and reasons only: byte for byte
        assert encode(answer) == bytes(general)


@fast
@given(hosts=st.lists(names, max_size=20), scores=st.data())
def test_priority_lists_are_byte_for_byte_what_json_response_wrote(
    hosts: list[str], scores: st.DataObject
) -> None:
    answer = [
        {"Host": h, "Score": scores.draw(st.integers(0, MAX_EXTENDER_PRIORITY))} for h in hosts
    ]
    assert encode(answer) == bytes(JSONResponse(answer).body)


HOSTS = ["n0", "n1", "n2", "\ud800", ",", "a,", ",b", '","', "\\"]
"""Names besides ``names``: nodes' own, and what could confuse the all-zero list (commas,
quotes, backslashes, lone surrogates)."""


@fast
@given(
    hosts=st.lists(names | st.sampled_from(HOSTS), max_size=12),
    scores=st.dictionaries(
        names | st.sampled_from(HOSTS),
        st.integers(0, MAX_EXTENDER_PRIORITY),
        max_size=20,
    ),
)
@example(hosts=[",", "b"], scores={"b": 3})
@example(hosts=["n0", "n1", "n0"], scores={"n0": 7, "elsewhere": 2})
def test_priorities_are_written_as_json_response_wrote_them(
    hosts: list[str], scores: dict[str, int]
) -> None:
    """Escaped names, names with commas, repeated names, scores of hosts not sent, more
    scores than the all-zero list takes: the bytes are JSONResponse's, and names
    JSONResponse cannot write (lone surrogates) are written as escapes that decode to the
    same list."""
    answer = [{"Host": h, "Score": scores.get(h, 0)} for h in hosts]
    try:
        expected = bytes(JSONResponse(answer).body)
    except UnicodeEncodeError:
        assert json.loads(encode_priorities(hosts, scores)) == answer
    else:
        assert encode_priorities(hosts, scores) == expected


def test_numbers_orjson_cannot_write_take_the_general_path() -> None:
    nodes = {"metadata": {"big": 2**80, "nan": math.nan}, "items": [{"metadata": {"name": "a"}}]}
    raw = json.dumps({"Pod": {}, "Nodes": nodes}).encode()
    answer = encode(filter_answer(decode_args(raw), ["a"], {}))
    assert same_json(
        answer, bytes(JSONResponse(dump(filter_result(by_model(raw), ["a"], {}))).body)
    )
    assert b"1208925819614629174706176" in answer and b'"nan":null' in answer


@fast
@given(value=json_values, ascii_only=st.booleans(), wrap=st.sampled_from(["", "utf-16", "bom"]))
def test_loads_gives_the_stdlib_decoders_values(value: Any, ascii_only: bool, wrap: str) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)
    raw = text.encode("utf-16") if wrap == "utf-16" else text.encode()
    if wrap == "bom":
        raw = b"\xef\xbb\xbf" + raw
    # Same values and types (an int read as a float would print differently).
    assert json.dumps(loads(raw)) == json.dumps(json.loads(raw))


@pytest.mark.parametrize("number", [2**63, 2**64 + 1, -(2**70), 10**30, 12345678901234567890])
def test_loads_keeps_integers_beyond_64_bits_exact(number: int) -> None:
    got = loads(json.dumps({"limits": {"nvidia.com/gpu": number}}).encode())
    assert (
        got["limits"]["nvidia.com/gpu"] == number and type(got["limits"]["nvidia.com/gpu"]) is int
    )


def test_loads_refuses_what_the_stdlib_refuses() -> None:
    for raw in (b"", b"{", b"[1,]", b'"\xff"', b"nul"):
        with pytest.raises(ValueError):
            loads(raw)


@pytest.mark.parametrize(
    ("content_type", "ok"),
    [
        (None, True),
        ("application/json", True),
        ("application/json; charset=utf-8", True),
        ("application/merge-patch+json", True),
        ("text/plain", False),
        ("application/xml", False),
    ],
)
def test_content_types_are_read_as_fastapi_reads_them(content_type: str | None, ok: bool) -> None:
    raw = b'{"Pod": {}, "NodeNames": ["a"]}'
    if ok:
        assert decode_args(raw, content_type).NodeNames == ["a"]
    else:
        with pytest.raises(WireError, match="not JSON"):
            decode_args(raw, content_type)


# -- the state's answers against its first per-candidate loops ---------------------------------


def filter_by_candidate(state: ClusterState, info: Any, candidates: list[str]) -> FilterAnswer:
    gang = state.gangs.get(info.gang)
    if gang is None:
        return state._no_room(info, candidates)
    placed = state.member_node(gang, info)
    if placed is not None:
        why = f"pod {info.namespace}/{info.name} is already placed on {placed}"
        return FilterAnswer(
            [n for n in candidates if n == placed], {}, {n: why for n in candidates if n != placed}
        )
    room = state.room(gang)
    admitted: list[str] = []
    failed: dict[str, str] = {}
    never: dict[str, str] = {}
    outside = f"not in the GPU block reserved for gang {gang.key}"
    full = f"the GPUs of gang {gang.key}'s block on this node are taken by its other workers"
    for name in candidates:
        free = room.get(name)
        if free is None:
            never[name] = outside
        elif free < info.gpus:
            failed[name] = full
        else:
            admitted.append(name)
    return FilterAnswer(admitted, failed, never)


def prioritize_by_candidate(state: ClusterState, info: Any, candidates: list[str]) -> list[Any]:
    gang = state.gangs.get(info.gang)
    if gang is None:
        return [(name, 0) for name in candidates]
    room = state.room(gang)
    scores = []
    for name in candidates:
        entry = state.nodes.get(name)
        if room.get(name, 0) < info.gpus or entry is None or entry.gpus == 0:
            scores.append((name, 0))
            continue
        used = state._bound_gpus.get(name, 0) + state._in_flight.get(name, 0)
        fullness = min(1.0, used / entry.gpus)
        scores.append((name, 1 + math.floor((MAX_EXTENDER_PRIORITY - 1) * fullness)))
    return scores


NODE_NAMES = [f"n{i}" for i in range(5)]


@settings(max_examples=120, deadline=None, derandomize=True)
@given(
    gangs=st.lists(
        st.tuples(st.sampled_from([1, 2, 4, 8, 16]), st.sampled_from([1, 2]), st.integers(0, 16)),
        min_size=1,
        max_size=6,
    ),
    candidates=st.lists(st.sampled_from([*NODE_NAMES, "elsewhere"]), max_size=12),
)
def test_state_answers_match_the_per_candidate_loops(
    gangs: list[tuple[int, int, int]], candidates: list[str]
) -> None:
    state = ClusterState()
    state.replace([node(n, 8) for n in NODE_NAMES], [])
    for g, (size, gpus, bound) in enumerate(gangs):
        workers = max(1, size // gpus)
        for i in range(workers):
            info = pod_info(pod(f"g{g}-{i}", job=f"g{g}", workers=workers, gpus=gpus, index=i))
            try:
                got = state.filter(info, candidates)
            except PlacementError:
                break
            assert got == filter_by_candidate(state, info, candidates)
            assert state.prioritize(info, candidates) == prioritize_by_candidate(
                state, info, candidates
            )
            if i < bound and got.admitted:  # bind some workers, leave the rest pending
                state.begin_bind(info, got.admitted[0])
                state.end_bind(info, got.admitted[0])
                again = state.filter(info, candidates)  # already placed: the other branch
                assert again == filter_by_candidate(state, info, candidates)


# -- the candidate memo and the maps it keeps --------------------------------------------------

MEMO_NAMES = ["n0", "n1", "n2", "\ud800", ",", "a,", ",b", '","', "\\", "", "ü", 'q"']


@fast
@given(
    candidates=st.lists(names | st.sampled_from(MEMO_NAMES), max_size=10),
    reason=names | st.sampled_from(MEMO_NAMES),
    data=st.data(),
)
@example(candidates=["a", "b", "c"], reason="r", data=None)
def test_kept_unresolvable_maps_are_the_dicts_json(
    candidates: list[str], reason: str, data: st.DataObject | None
) -> None:
    """Written from the names' JSON, or refused (``None``) for the general way: never other
    bytes than the dict's, whatever the names (escapes, commas, quotes, repeats, empty)."""
    left_out = (
        set(data.draw(st.lists(st.sampled_from(candidates)))) if data and candidates else set()
    )
    kept = Candidates(candidates)
    expected = dict.fromkeys(candidates, reason)
    for name in left_out:
        del expected[name]
    for _ in range(2):  # written, then kept
        written = kept.unresolvable_json(reason, left_out)
        if written is not None:
            assert written == orjson.dumps(expected)
    never = AllBut(kept, left_out, reason, kept.distinct)
    assert never == expected and len(never) == len(expected) and bool(never) == bool(expected)
    answer = {"Nodes": None, "NodeNames": [], "FailedNodes": None}
    general = {**answer, "FailedAndUnresolvableNodes": expected or None, "Error": ""}
    fast_answer = {**answer, "FailedAndUnresolvableNodes": never or None, "Error": ""}
    try:
        assert encode_filter(fast_answer) == encode(general)
    except WireError:
        with pytest.raises(WireError):
            encode(general)


@fast
@given(
    hosts=st.lists(names | st.sampled_from(MEMO_NAMES), max_size=10),
    scores=st.dictionaries(
        names | st.sampled_from(MEMO_NAMES), st.integers(0, MAX_EXTENDER_PRIORITY), max_size=6
    ),
)
def test_kept_zero_lists_score_as_the_general_way(hosts: list[str], scores: dict[str, int]) -> None:
    assert encode_priorities(Candidates(hosts), scores) == encode_priorities(list(hosts), scores)


def test_the_memo_tells_lists_apart_by_their_bytes() -> None:
    """Lists of the same length, and the same names in another order, are other lists; the
    same bytes give the same list back; the oldest list goes first."""
    memo = NamesMemo(size=2)
    ab, ba, cd = b'["a","b"]', b'["b","a"]', b'["c","d"]'
    first = Candidates(["a", "b"])
    memo.put(ab, first)
    assert memo.get(bytes(ab)) is first and memo.get(ba) is None and memo.get(cd) is None
    memo.put(ba, Candidates(["b", "a"]))
    memo.put(cd, Candidates(["c", "d"]))
    assert memo.get(ab) is None and memo.get(ba) == ["b", "a"] and memo.get(cd) == ["c", "d"]


CLUSTER = [f"n{i}" for i in range(6)]
LISTS = [
    CLUSTER,
    CLUSTER[::-1],
    CLUSTER[:3],
    [*CLUSTER[3:], "elsewhere"],
    ["n5", "n4", "n3", "n2", "n1", "n9"],  # as long as the first, other names
    ["n0", "n1", "n0"],
]
"""Candidate lists the scheduler might send: the same names again and again, reordered,
narrowed, with names not (yet) in the cache, repeated."""


@pytest.mark.parametrize("seed", range(12))
async def test_answers_through_the_memo_are_the_general_paths_across_cluster_changes(
    seed: int,
) -> None:
    """Filter and prioritize through the app (memo, kept maps and lists) against the same
    questions asked with plain lists and written by ``encode`` as plain dicts, byte for
    byte, while pods are bound and deleted and nodes are added, removed, cordoned and
    uncordoned between calls that send the same names."""
    rng = random.Random(seed)
    app = create_app(connect=False, state=ClusterState(clock=lambda: 0.0))
    state: ClusterState = app.state.extender.state
    nodes = {n: node(n, 8) for n in CLUSTER}
    state.replace(list(nodes.values()), [])
    gangs = [(f"g{g}", rng.choice([1, 2, 4, 8, 16]), rng.choice([1, 2])) for g in range(6)]
    bound: list[dict[str, Any]] = []
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
        for _ in range(60):
            step = rng.random()
            if step < 0.55:
                job, size, gpus = rng.choice(gangs)
                workers = max(1, size // gpus)
                body = pod(f"{job}-{rng.randrange(workers)}", job=job, workers=workers, gpus=gpus)
                info = pod_info(body)
                names = rng.choice(LISTS)
                raw = json.dumps({"Pod": body, "Nodes": None, "NodeNames": names}).encode()
                got = await client.post("/filter", content=raw, headers=JSON_TYPE)
                answer = got.json()
                try:  # the same question, asked with a plain list: nothing kept
                    expected = state.filter(info, list(names))
                except PlacementError as exc:
                    assert answer["Error"] == str(exc)
                    continue
                plain = ExtenderArgs.model_construct(Pod=body, Nodes=None, NodeNames=list(names))
                reference = filter_answer(
                    plain, expected.admitted, expected.failed, dict(expected.unresolvable)
                )
                assert got.content == encode(reference)
                scored = await client.post("/prioritize", content=raw, headers=JSON_TYPE)
                by_list = state.prioritize(info, list(names))
                assert scored.content == encode([{"Host": h, "Score": s} for h, s in by_list])
                if answer["NodeNames"] and rng.random() < 0.5:
                    state.begin_bind(info, answer["NodeNames"][0])
                    state.end_bind(info, answer["NodeNames"][0])
                    body["spec"]["nodeName"] = answer["NodeNames"][0]
                    bound.append(body)
            elif step < 0.65 and bound:
                state.delete_pod(bound.pop(rng.randrange(len(bound))))
            elif step < 0.75:
                name = f"n{rng.randrange(10)}"
                nodes[name] = node(name, 8)
                state.upsert_node(nodes[name])
            elif step < 0.85 and nodes:
                state.delete_node(nodes.pop(rng.choice(sorted(nodes))))
            elif nodes:
                name = rng.choice(sorted(nodes))
                nodes[name]["spec"]["unschedulable"] = not nodes[name]["spec"].get(
                    "unschedulable", False
                )
                state.upsert_node(nodes[name])


def test_maps_past_the_kept_few_are_written_again_the_same() -> None:
    """More gangs than ``MAPS_KEPT`` filtered against the same names: the oldest maps are
    dropped and written again, byte for byte the dict's."""
    kept = Candidates(["a", "b", "c"])
    reasons = [f"gang {g}" for g in range(MAPS_KEPT + 3)]
    for _ in range(2):
        for reason in reasons:
            expected = orjson.dumps({"a": reason, "c": reason})
            assert kept.unresolvable_json(reason, {"b"}) == expected
