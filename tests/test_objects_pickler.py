"""The process pickler (``sc.set_pickler``/``sc.get_pickler``) and the object collectives that use
it: lambdas and local closures travel by value at world sizes 1-4, what pickle handles still goes
by reference, a pickler the user sets is the one used, and the default comes back."""

import pickle

import pytest

import shmcomm as sc
from harness import run_ranks
from shmcomm import pickling


class Point:
    """A class of a module: pickled by reference, so it stays the very same class."""

    def __init__(self, x):
        self.x = x


def _lambdas_and_closures(rank, size):
    offset = 100 * rank

    def closure(x):   # local: plain pickle refuses it ("Can't pickle local object")
        return x + offset

    out = [None] * size
    sc.all_gather_object(out, lambda x: x * (rank + 1))
    assert [f(3) for f in out] == [3 * (q + 1) for q in range(size)]
    sc.all_gather_object(out, closure)
    assert [f(1) for f in out] == [1 + 100 * q for q in range(size)]

    objs = [lambda: "from root", closure] if rank == size - 1 else [None, None]
    sc.broadcast_object_list(objs, src=size - 1)
    assert objs[0]() == "from root" and objs[1](0) == 100 * (size - 1)

    gathered = [None] * size if rank == 0 else None
    sc.gather_object(lambda: rank, gathered, dst=0)
    if rank == 0:
        assert [f() for f in gathered] == list(range(size))

    got = [None]
    sc.scatter_object_list(got, [lambda q=q: q * q for q in range(size)] if rank == 0 else None)
    assert got[0]() == rank * rank

    # what pickle handles is still pickled by reference: the same class, not a copy of it
    sc.all_gather_object(out, Point(rank))
    assert all(type(p) is Point for p in out) and [p.x for p in out] == list(range(size))
    return True


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_lambdas_and_local_closures_travel_through_every_object_collective(world):
    assert run_ranks(_lambdas_and_closures, world, timeout=110) == [True] * world


_counts = {"dumps": 0, "loads": 0}


def counting_dumps(obj, protocol=None):
    _counts["dumps"] += 1
    return pickle.dumps(obj, protocol)


def counting_loads(data):
    _counts["loads"] += 1
    return pickle.loads(data)


def _user_pickler(rank, size):
    previous = sc.set_pickler(counting_dumps, counting_loads, protocol=4)
    assert previous == pickling.Pickler(pickling.default_dumps, pickle.loads, 5)
    assert sc.get_pickler() == (counting_dumps, counting_loads, 4)
    out = [None] * size
    sc.all_gather_object(out, {"rank": rank})
    assert out == [{"rank": q} for q in range(size)]
    assert _counts == {"dumps": 1, "loads": size}   # own object included, as torch does
    # counting_dumps is plain pickle: a lambda fails, with pickle's own error
    with pytest.raises((pickle.PicklingError, AttributeError)):
        sc.all_gather_object(out, lambda: 1)

    sc.set_pickler()   # the default again: lambdas work once more, and nothing is counted
    assert sc.get_pickler() == previous
    counted = dict(_counts)
    sc.all_gather_object(out, lambda: rank)
    assert [f() for f in out] == list(range(size)) and _counts == counted
    return True


@pytest.mark.timeout(90)
@pytest.mark.parametrize("world", [1, 3])
def test_a_pickler_the_user_sets_is_used_and_the_default_comes_back(world):
    assert all(run_ranks(_user_pickler, world, timeout=80))


def test_default_pickles_by_reference_when_pickle_can():
    # byte for byte what pickle makes, so classes of a script's __main__ stay the ranks' own class
    for obj in ({"a": [1, 2.5, None]}, Point, pickle.dumps, ("text", b"bytes")):
        assert pickling.default_dumps(obj) == pickle.dumps(obj, 5)
    square = pickle.loads(pickling.default_dumps(lambda x: x * x))
    assert square(7) == 49


def test_without_cloudpickle_the_default_is_plain_pickle(monkeypatch):
    monkeypatch.setattr(pickling, "_cloudpickle", False)   # as if it were not installed
    assert pickle.loads(pickling.default_dumps([1, "a"])) == [1, "a"]
    with pytest.raises((pickle.PicklingError, AttributeError)) as info:
        pickling.default_dumps(lambda: 1)
    notes = getattr(info.value, "__notes__", ["install cloudpickle"])
    assert any("install cloudpickle" in n for n in notes)


def test_protocol_defaults_as_in_mpi4py():
    try:
        assert sc.set_pickler(pickle.dumps, pickle.loads).protocol == 5   # the default's
        assert sc.get_pickler().protocol == 5   # pickle.dumps is given one
        sc.set_pickler(counting_dumps)
        assert sc.get_pickler() == (counting_dumps, pickle.loads, None)   # any other: none
        sc.set_pickler(protocol=-1)             # pickle's "highest"
        assert sc.get_pickler() == (pickling.default_dumps, pickle.loads, -1)
    finally:
        sc.set_pickler()
    assert sc.get_pickler() == (pickling.default_dumps, pickle.loads, 5)


def test_bad_arguments_are_refused_with_clear_errors():
    with pytest.raises(TypeError, match="dumps must be a callable or None, got int"):
        sc.set_pickler(dumps=3)
    with pytest.raises(TypeError, match="loads must be a callable or None, got str"):
        sc.set_pickler(loads="pickle.loads")
    with pytest.raises(TypeError, match="protocol must be an int or None, got float"):
        sc.set_pickler(protocol=4.0)
    with pytest.raises(TypeError, match="protocol must be an int or None, got bool"):
        sc.set_pickler(protocol=True)
    with pytest.raises(ValueError, match=f"protocol must be at most pickle.HIGHEST_PROTOCOL="
                                         f"{pickle.HIGHEST_PROTOCOL}"):
        sc.set_pickler(protocol=pickle.HIGHEST_PROTOCOL + 1)
    assert sc.get_pickler() == (pickling.default_dumps, pickle.loads, 5)   # nothing changed
    try:
        sc.set_pickler(dumps=repr)   # returns str: refused when used, naming the function
        with pytest.raises(TypeError, match="the pickler's dumps 'repr' returned str, not bytes"):
            pickling.dumps({"a": 1})
    finally:
        sc.set_pickler()
