"""`tfdet.Profile`: a frozen record that survives JSON and compares by field."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tfdet import Profile

_TEXT = st.text(min_size=1, max_size=12)

profiles = st.builds(
    Profile,
    seed=st.integers(0, 2**32 - 1),
    intra_op_threads=st.integers(0, 64),
    inter_op_threads=st.integers(0, 64),
    onednn_opts=st.booleans(),
    cpu_isa=st.sampled_from(["AVX2", "AVX512_CORE", "ALL", "not applicable"]),
    op_determinism=st.booleans(),
    xla_determinism=st.booleans(),
    python_hash_seed=st.none() | st.integers(0, 2**32 - 1).map(str),
    patches=st.lists(_TEXT, unique=True).map(lambda names: tuple(sorted(names))),
    keras=st.sampled_from(["keras3", "tf_keras"]),
    tensorflow_version=_TEXT,
    keras_version=st.none() | _TEXT,
    numpy_version=_TEXT,
    python_version=_TEXT,
    distribution=st.dictionaries(_TEXT, _TEXT).map(lambda d: tuple(sorted(d.items()))),
)


def _example(**changes) -> Profile:
    fields = dict(
        seed=0,
        intra_op_threads=1,
        inter_op_threads=1,
        onednn_opts=True,
        cpu_isa="AVX2",
        op_determinism=True,
        xla_determinism=True,
        python_hash_seed="0",
        patches=("bincount",),
        keras="keras3",
        tensorflow_version="2.21.0",
        keras_version="3.15.1",
        numpy_version="2.4.6",
        python_version="3.11.7",
    )
    fields.update(changes)
    return Profile(**fields)


@given(profiles)
def test_from_dict_inverts_to_dict_through_json(profile: Profile) -> None:
    data = json.loads(json.dumps(profile.to_dict()))
    assert Profile.from_dict(data) == profile
    assert Profile.from_dict(data).differences(profile) == {}


def test_to_dict_is_json_ready_and_str_is_its_json() -> None:
    profile = _example()
    assert profile.to_dict()["patches"] == ["bincount"]
    assert json.loads(str(profile)) == profile.to_dict()


def test_profile_is_frozen_and_hashable() -> None:
    profile = _example()
    with pytest.raises(dataclasses.FrozenInstanceError):
        profile.seed = 1  # type: ignore[misc]
    assert hash(profile) == hash(_example())


def test_from_dict_ignores_unknown_keys_and_names_missing_ones() -> None:
    data = _example().to_dict()
    assert Profile.from_dict({**data, "added_later": 1}) == _example()
    del data["cpu_isa"], data["seed"]
    with pytest.raises(ValueError, match=r"Missing: \['seed', 'cpu_isa'\]"):
        Profile.from_dict(data)


def test_a_profile_recorded_before_the_distribution_section_still_loads() -> None:
    data = _example(distribution=(("collective", "RING"),)).to_dict()
    assert data["distribution"] == {"collective": "RING"}
    del data["distribution"]
    assert Profile.from_dict(data).distribution == ()


def test_distribution_section_is_the_defaults_replaced_by_installed_patches() -> None:
    from tfdet._patching._registry import Patch
    from tfdet._pin._distribution import pinned

    ring = Patch(
        name="ring",
        replaces=(),
        summary="",
        upstream="",
        distribution={"collective": "RING"},
    )
    keras3 = dict(pinned([ring], "keras3"))
    assert keras3["collective"] == "RING"
    assert keras3["auto_shard_policy"] == "AUTO"  # No patch decides it here.
    assert keras3["replica_seeds"] == "shared"
    assert dict(pinned([], "tf_keras"))["replica_seeds"] == "per replica"


def test_differences_lists_each_differing_field_with_both_values() -> None:
    mine = _example()
    theirs = _example(intra_op_threads=2, cpu_isa="ALL")
    assert mine.differences(theirs) == {
        "intra_op_threads": (1, 2),
        "cpu_isa": ("AVX2", "ALL"),
    }
    assert theirs.differences(mine)["cpu_isa"] == ("ALL", "AVX2")
