"""Every supported dtype, byte order and shape survives a round trip bit for bit."""

import uuid

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import shmrdv

pytestmark = pytest.mark.timeout(60)

dtypes = st.one_of(
    hnp.boolean_dtypes(),
    hnp.integer_dtypes(endianness="?"),
    hnp.unsigned_integer_dtypes(endianness="?"),
    hnp.floating_dtypes(endianness="?", sizes=(16, 32, 64)),
    hnp.complex_number_dtypes(endianness="?", sizes=(64, 128)),
    hnp.datetime64_dtypes(min_period="ns", max_period="ns", endianness="?"),
    hnp.timedelta64_dtypes(min_period="s", max_period="s", endianness="?"),
    st.sampled_from([np.dtype(">i4"), np.dtype(">f8")]),
)
arrays = hnp.arrays(dtypes, hnp.array_shapes(min_dims=0, max_dims=5, min_side=0, max_side=6))
property_settings = settings(max_examples=60, deadline=None)


def round_trip(rdv, array):
    key = f"dtype-{uuid.uuid4().hex}"
    rdv.send(key, array, timeout=5)
    return rdv.recv(key, timeout=5)


def assert_identical(received, sent):
    """Same dtype (byte order included), same shape, same bits (so NaN and NaT compare too)."""
    assert received.dtype == sent.dtype
    assert received.dtype.str == sent.dtype.str
    assert received.shape == sent.shape
    assert received.tobytes() == sent.tobytes()


@property_settings
@given(array=arrays)
def test_contiguous_arrays_round_trip(module_rdv, array):
    assert_identical(round_trip(module_rdv, array), array)


@property_settings
@given(data=st.data())
def test_non_contiguous_arrays_round_trip(module_rdv, data):
    base = data.draw(hnp.arrays(dtypes, hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=8)))
    view = np.asarray(base[data.draw(hnp.basic_indices(base.shape))])
    if data.draw(st.booleans(), label="transpose"):
        view = view.T
    assert_identical(round_trip(module_rdv, view), view)


@pytest.mark.parametrize("array", [np.arange(10)[::3], np.arange(12).reshape(3, 4).T, np.ones((4, 4))[::-1, 1::2]])
def test_strided_views_arrive_as_their_values(module_rdv, array):
    assert not array.flags.c_contiguous
    assert_identical(round_trip(module_rdv, array), array)


def test_object_dtype_raises_invalid_type(module_rdv):
    with pytest.raises(shmrdv.InvalidType):
        module_rdv.send("objects", np.array([1, "a", None], dtype=object))
    assert issubclass(shmrdv.InvalidType, TypeError)
    assert module_rdv.try_recv("objects") is None


@pytest.mark.parametrize("name", ["float8_e5m2", "float8_e4m3fn", "int4"])
def test_dtypes_whose_descriptor_names_nothing_are_refused_before_anything_is_sent(module_rdv, name):
    """ml_dtypes' float8_e5m2 says '<f1', a descriptor no receiver can turn
    back into a dtype: refused at send and alloc (InvalidType), never sent
    and then lost at the receiver."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    dtype = np.dtype(getattr(ml_dtypes, name))
    with pytest.raises(shmrdv.InvalidType, match=f"dtype {name} cannot be sent.*astype"):
        module_rdv.send("f8", np.ones(3, dtype))
    with pytest.raises(shmrdv.InvalidType, match=f"dtype {name} cannot be sent"):
        module_rdv.alloc("f8", (3,), dtype).close()
    assert module_rdv.try_recv("f8") is None


def test_a_string_dtype_without_a_width_is_refused_so(module_rdv):
    with pytest.raises(shmrdv.InvalidType, match="needs a width"):
        with module_rdv.alloc("s0", (2,), "S0"):
            pass
    assert module_rdv.try_recv("s0") is None
