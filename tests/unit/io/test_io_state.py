"""tether.io.state: live objects <-> plain data that `torch.load(weights_only=True)` reads back."""

from __future__ import annotations

import io
import math
from collections import deque

import pytest
import torch

from tether.health.detectors import Finding
from tether.health.telemetry import History
from tether.io.state import decode_state, encode_state


def roundtrip(obj):
    buf = io.BytesIO()
    torch.save(encode_state(obj), buf)
    buf.seek(0)
    return decode_state(torch.load(buf, weights_only=True))


def test_containers_dataclasses_and_objects_survive_a_weights_only_checkpoint():
    h = History(skip=0, window=3)
    for s in range(1, 5):
        h.add(s, {"x": float(s), "nan": float("nan")})
    h.exclude([4])
    f = Finding("nonfinite", "numerical_instability", "warn", 3, 2, "m", {"v": (1, 2)})
    state = {"t": (1, "a"), "s": {3, 1}, "fs": frozenset({2}), "d": deque([(1, 0), (2, 1)], maxlen=3),
             "ints": {1: "a", 2: torch.ones(2)}, "f": f, "h": h, "tag": {"__t__": "user data"}}
    back = roundtrip(state)
    assert back["t"] == (1, "a") and back["s"] == {1, 3} and back["fs"] == frozenset({2})
    assert back["d"] == deque([(1, 0), (2, 1)]) and back["d"].maxlen == 3
    assert back["ints"][1] == "a" and torch.equal(back["ints"][2], torch.ones(2))
    assert back["f"] == f and back["tag"] == {"__t__": "user data"}
    assert isinstance(back["h"], History) and back["h"].excluded == {4} and back["h"].baseline_steps == h.baseline_steps
    assert math.isnan(back["h"].rows[0]["nan"]) and back["h"].baseline("x").median == h.baseline("x").median


def test_callables_are_dropped_and_foreign_classes_refused():
    from tether.health.remediation import Change

    back = roundtrip(Change("a.b", 1, 2, undo=lambda: 1 / 0))
    assert (back.path, back.old, back.new) == ("a.b", 1, 2) and back.undo() is None
    with pytest.raises(TypeError, match="cannot store"):
        encode_state(object())
    with pytest.raises(ValueError, match="outside tether"):
        decode_state({"__t__": "obj", "cls": "os:system", "v": {}})
