"""The tuning log is data from a file (STYLE.md, "Errors for bad input"): every field of a
record is checked against its schema. Each field of valid records, mutated into each bad kind
(NaN, Infinity, strings, booleans, floats where integers are due, huge integers, nested lists
and objects, missing and unknown fields, nests deeper than json can read), is refused with a
`ValueError` naming the file and the line, the field, what it holds and what was expected;
never with another exception (OverflowError, RecursionError, TypeError). The enumeration is
exhaustive and fixed; the Hypothesis test (derandomised) adds arbitrary JSON in any place."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vtakit.compiler.backend.vta.tune import TuneRecord, TuningLog, read_log

CONV = {"version": 1,
        "key": {"kind": "conv2d", "inputs": [[1, 25, 28, 28]], "output": [1, 6, 28, 28],
                "kernel": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0],
                "requant": [{"imm_steps": 3, "row_steps": 2, "rows": 2}]},
        "config_hash": "eb4589e8", "layer": "conv_3",
        "schedule": {"toh": 28, "tow": 4, "tob": 1, "tib": 1, "threads": 2, "order": 1},
        "predicted_cycles": 9494, "simulated_cycles": 9647,
        "analytic": {"schedule": {"toh": 4, "tow": 28, "tob": 1, "tib": 1, "threads": 2,
                                  "order": 1},
                     "predicted_cycles": 9494, "simulated_cycles": 9721},
        "candidates": [[{"toh": 4, "tow": 28, "tob": 1, "tib": 1, "threads": 2, "order": 1},
                        9494, 9721],
                       [{"toh": 28, "tow": 4, "tob": 1, "tib": 1, "threads": 2, "order": 1},
                        9494, 9647]],
        "searched": 255}
ADD = {"version": 1,
       "key": {"kind": "add", "inputs": [[1, 64, 8, 8], [1, 64, 8, 8]], "output": [1, 64, 8, 8],
               "requant": [{"imm_steps": 2, "row_steps": 0, "rows": 0} for _ in range(3)]},
       "config_hash": "0badf00d", "layer": "add_9",
       "schedule": {"toh": 8, "tow": 8, "threads": 2, "chunk": 1},
       "predicted_cycles": 700, "simulated_cycles": 720,
       "analytic": {"schedule": {"toh": 4, "tow": 8}, "predicted_cycles": 710,
                    "simulated_cycles": 730},
       "candidates": [[{"toh": 4, "tow": 8}, 710, 730]], "searched": 12}
VALID = {"conv": CONV, "add": ADD}

NAN, INF = float("nan"), float("inf")
DEEP = "__deep__"  # written as a nest deeper than json's recursion limit
BAD: list[Any] = [NAN, INF, -INF, "7", "", True, False, None, 1.5, 2.0, 1e300, -1, 0,
                  1 << 63, 10 ** 400, -(10 ** 30), [], {}, [[[[1]]]], {"a": {"b": [1]}},
                  [1, [2, [3, [4, [5]]]]], [NAN], DEEP]
OPTIONAL = {"requant", "threads", "order", "chunk"}  # fields a record may leave out


def _still_valid(name: str, bad: Any) -> bool:
    """The few values of `BAD` that some field takes; every other mutation must be refused."""
    if type(bad) is str and bad != DEEP:
        return name == "layer"
    if type(bad) is list and not bad:
        return name == "candidates"  # no candidate simulated
    if type(bad) is int and bad == 0:  # a record's integers are >= 1 but these
        return name == "searched" or name.startswith("key.pads[") or name.endswith(
            (".imm_steps", ".row_steps", ".rows"))
    return False


def _paths(v: Any, path: tuple = ()) -> list[tuple]:
    """Every place in `v` (not `v` itself), depth first."""
    out = []
    items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
    for k, x in items:
        out.append(path + (k,))
        out += _paths(x, path + (k,))
    return out


def _name(path: tuple) -> str:
    """A place as the error messages name it: ``key.inputs[0][2]``, ``candidates[1][0].tow``."""
    s = ""
    for k in path:
        s += f"[{k}]" if isinstance(k, int) else (f".{k}" if s else k)
    return s


def _at(d: Any, path: tuple) -> Any:
    for k in path:
        d = d[k]
    return d


def _text(d: Any) -> str:
    """JSON as Python writes it (NaN, Infinity), with `DEEP` as 10,000 nested lists."""
    return json.dumps(d).replace(json.dumps(DEEP), "[" * 10_000 + "]" * 10_000)


def _refusal(tmp_path, text: str, reader=TuningLog.load) -> str:
    """The message of the ValueError that reading a log whose third line is `text` raises."""
    path = tmp_path / "log.jsonl"
    path.write_text(json.dumps(CONV) + "\n\n" + text + "\n")
    try:
        log = reader(path)
    except ValueError as e:
        assert type(e) is ValueError, type(e)
        msg = str(e)
        assert msg.startswith(f"tuning log {path}, line 3: "), msg[:300]
        assert "expected" in msg and len(msg) < 700, msg[:300]
        return msg
    except Exception as e:  # noqa: BLE001 - the point: nothing but ValueError escapes
        raise AssertionError(f"{type(e).__name__} escaped: {str(e)[:200]}") from None
    raise AssertionError(f"accepted: {text[:300]} -> {log.records[-1].to_json()}")


@pytest.mark.parametrize("record", VALID.values(), ids=VALID)
def test_valid_records_are_read_as_written(tmp_path, record):
    path = tmp_path / "ok.jsonl"
    path.write_text(json.dumps(record) + "\n")
    (rec,) = TuningLog.load(path).records
    assert rec.to_json() == record and rec.line == 1
    TuningLog(str(path), [rec]).save()
    assert path.read_text() == json.dumps(record, separators=(",", ":")) + "\n"


@pytest.mark.parametrize("record", VALID.values(), ids=VALID)
def test_every_field_mutated_into_every_bad_kind_is_refused(tmp_path, record):
    tried = 0
    for path in _paths(record):
        name = _name(path)
        for bad in BAD:
            if _still_valid(name, bad):
                continue
            d = copy.deepcopy(record)
            parent = _at(d, path[:-1])
            parent[path[-1]] = bad
            msg = _refusal(tmp_path, _text(d))
            tried += 1
            if bad is DEEP:
                assert "nested too deeply" in msg
            else:  # the field (or the first field of its that is wrong) is named
                assert name in msg or _name(path[:-1]) in msg, (name, bad, msg)
        if isinstance(path[-1], str) and path[-1] not in OPTIONAL:  # leave the field out
            d = copy.deepcopy(record)
            del _at(d, path[:-1])[path[-1]]
            msg = _refusal(tmp_path, _text(d))
            assert f"no {path[-1]!r}" in msg and _name(path[:-1]) in msg, msg
            tried += 1
        target = _at(record, path)
        if isinstance(target, dict):  # an unknown field
            for extra in ("zzz", "kernel" if record is ADD else "line"):
                d = copy.deepcopy(record)
                _at(d, path)[extra] = 1
                msg = _refusal(tmp_path, _text(d))
                assert f"the unknown field {extra!r}" in msg and name in msg, msg
                tried += 1
        if isinstance(target, list):  # one more item, a bad one
            for extra in (NAN, "x", [1, 2, 3, 4]):
                d = copy.deepcopy(record)
                _at(d, path).append(extra)
                msg = _refusal(tmp_path, _text(d))
                assert name in msg, msg
                tried += 1
    assert tried > 500


@pytest.mark.parametrize("text, match", [
    ("NaN", r"a JSON number, not an object"),
    ("true", r"a JSON boolean, not an object"),
    ("12345678901234567890123", r"a JSON integer, not an object"),
    ('"record"', r"a JSON string, not an object"),
    ("null", r"a JSON null, not an object"),
    ("[" * 100_000 + "]" * 100_000, r"nested too deeply"),
    ('{"a": ' * 100_000 + "1" + "}" * 100_000, r"nested too deeply"),
    ("9" * 5000, r"not a tuning record \(Exceeds the limit .* expected integers up to 2\*\*63"),
    ("{" + json.dumps(CONV)[1:-1] + ', "version": 1}',
     r"the field 'version' twice in one object \(expected each field once\)"),
    ('{"version": 1e999}', r"no 'key', .*\(expected a tuning record"),
    (json.dumps(dict(CONV, version=True)), r"version is true \(a boolean\); expected the "
                                           r"integer 1$"),
    (json.dumps(dict(CONV, version=1.0)), r"version is 1\.0; expected the integer 1$"),
    (json.dumps(dict(CONV, version=2)), r"tuning-log version 2; expected version 1, the one this "
                                           r"vtakit reads"),
    (json.dumps(dict(CONV, predicted_cycles=NAN)),
     r"predicted_cycles is NaN; expected an integer from 1 to 2\*\*63-1$"),
    (json.dumps(dict(CONV, simulated_cycles=-INF)), r"simulated_cycles is -Infinity; expected"),
    (json.dumps(dict(CONV, searched=10 ** 400)),
     r"searched is an integer of 1329 bits; expected an integer from 0 to 2\*\*63-1$"),
    (json.dumps(dict(CONV, searched="255")), r"searched is the string '255'; expected an int"),
    (json.dumps(dict(CONV, config_hash="EB4589E8")),
     r"config_hash is the string 'EB4589E8'; expected 8 lower-case hex digits"),
    (json.dumps(dict(CONV, key=dict(CONV["key"], kind="conv3d"))),
     r"key.kind is the string 'conv3d'; expected one of 'conv2d', 'dense', 'max_pool'"),
    (json.dumps(dict(CONV, schedule=dict(CONV["schedule"], chunk=1))),
     r"schedule \(a ConvSchedule\) has the unknown field 'chunk' \(expected an object with "
     r"toh, tow, tob, tib and optionally threads, order\)$"),
    (json.dumps(dict(CONV, candidates=[[CONV["schedule"], 9494]])),
     r"candidates\[0\] is \[\{.*\}, 9494\]; expected \[schedule, predicted_cycles, "
     r"simulated_cycles\]$"),
])
def test_refusals_say_what_was_received_and_what_was_expected(tmp_path, text, match):
    assert re.search(match, _refusal(tmp_path, text))


def test_compile_reads_the_log_with_the_same_checks(tmp_path):
    """`read_log`, which `compile --tuning-log` uses, refuses what `TuningLog.load` does."""
    for k, bad in enumerate([NAN, 1 << 70, True, "3", [[3]]]):
        d = copy.deepcopy(CONV)
        d["schedule"]["toh"] = bad
        (tmp_path / str(k)).mkdir()
        msg = _refusal(tmp_path / str(k), _text(d), reader=read_log)
        assert "schedule.toh is " in msg


def test_a_record_the_reader_would_refuse_is_not_written(tmp_path):
    rec = TuneRecord.from_json(copy.deepcopy(CONV), "here")
    rec.simulated_cycles = 1.5  # type: ignore[assignment]
    path = tmp_path / "out.jsonl"
    with pytest.raises(ValueError, match=r"TuningLog\.save\(.*out\.jsonl\): record 1 "
                                         r"\('conv_3'\): simulated_cycles is 1\.5; expected an "
                                         r"integer from 1"):
        TuningLog(str(path), [rec]).save()
    assert not path.exists()


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=1 << 62)
    | st.floats() | st.text(max_size=6) | st.sampled_from([1, 2, "conv2d", "add", "eb4589e8"]),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=6) | st.sampled_from(["toh", "kind", "rows"]), inner,
                      max_size=4),
    max_leaves=10)


@settings(derandomize=True, max_examples=400, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_arbitrary_json_anywhere_is_read_exactly_or_refused(tmp_path, data):
    """A value anywhere replaced, an item removed or a field added: the record reads back as
    exactly what the line holds, or is refused with a ValueError naming the file and line."""
    record = copy.deepcopy(data.draw(st.sampled_from(list(VALID.values()))))
    path = data.draw(st.sampled_from(_paths(record)))
    how = data.draw(st.sampled_from(["replace", "delete", "add"]))
    parent = _at(record, path[:-1])
    if how == "replace":
        parent[path[-1]] = data.draw(_JSON)
    elif how == "delete":
        del parent[path[-1]]
    else:
        target = _at(record, path)
        if isinstance(target, dict):
            target[data.draw(st.text(max_size=6))] = data.draw(_JSON)
        elif isinstance(target, list):
            target.insert(data.draw(st.integers(0, len(target))), data.draw(_JSON))
        else:
            parent[path[-1]] = [target]
    text = json.dumps(record)
    file = tmp_path / "log.jsonl"
    file.write_text(json.dumps(CONV) + "\n\n" + text + "\n")
    try:
        log = TuningLog.load(file)
    except ValueError as e:
        assert type(e) is ValueError and str(e).startswith(f"tuning log {file}, line 3: ")
        return
    got = log.records[-1]
    assert got.line == 3 and json.dumps(got.to_json()) == text
