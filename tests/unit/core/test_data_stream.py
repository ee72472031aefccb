from tether.data import ProblemStream


def test_resume_reproduces_order_across_epoch_boundary():
    probs = [{"i": i} for i in range(5)]
    full = ProblemStream(probs, seed=3)
    ref = [p["i"] for p in full.next_batch(12)]
    assert sorted(ref[:5]) == list(range(5)) and sorted(ref[5:10]) == list(range(5))
    for k in (5, 7):  # k=5 ends exactly at the epoch boundary (verl PR#5725)
        a = ProblemStream(probs, seed=3)
        first = [p["i"] for p in a.next_batch(k)]
        b = ProblemStream(probs, seed=3)
        b.load_state_dict(a.state_dict())
        rest = [p["i"] for p in b.next_batch(12 - k)]
        assert first + rest == ref


def test_state_from_other_data_is_rejected():
    a = ProblemStream([{"i": i} for i in range(5)], 0)
    b = ProblemStream([{"i": i} for i in range(6)], 0)
    try:
        b.load_state_dict(a.state_dict())
    except ValueError as e:
        assert "5 problems" in str(e)
    else:
        raise AssertionError("expected ValueError")
