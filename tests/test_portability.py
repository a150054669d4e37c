"""This machine's weights digests against the recorded portability table.

`benchmarks/portability.py` trains each reference model in a fresh process
under the default profile and keeps one digest per model per machine in
`benchmarks/portability_digests.json`. The slow test recomputes the tiny
models' digests here and fails:

- on a CPU whose facts (vendor, model, family/model/stepping, caches, logical
  CPUs, best ISA) and software versions match a recorded machine, on any
  difference: the same machine must repeat its bits;
- on any machine with the same TensorFlow, Keras and patch set, for a model
  recorded identical on two or more different real CPUs (shown portable:
  34 of the 36 reference models on an AMD EPYC Zen 4 and an Intel Xeon
  Sapphire Rapids under today's patch set; the two tf_keras models with
  Dropout changed bits since and are recorded on the EPYC only). An emulated CPU's entry is evidence, not a
  machine: it never makes a model portable.

On a CPU not in the table, for models not yet shown portable, it only prints
the digests: nothing says they should match there, so it must not fail CI on
a new machine. The fast tests show `compare` fails when it should.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

_SPEC = importlib.util.spec_from_file_location(
    "portability", REPO / "benchmarks" / "portability.py"
)
portability = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(portability)

SOFT = {"tensorflow": "2.21.0", "keras_version": "3.15.1", "numpy": "2", "python": "3"}
AMD = {"cpu_vendor": "AuthenticAMD", "cpu_caches": ["L2=1024K"], "cpu_count": 2}
INTEL = {"cpu_vendor": "GenuineIntel", "cpu_caches": ["L2=2048K"], "cpu_count": 16}


def _table(*entries: tuple[dict, dict, dict]) -> dict:
    return {
        "machines": [
            {"cpu": cpu, "software": soft, "digests": digests}
            for cpu, soft, digests in entries
        ]
    }


def test_same_cpu_fails_on_any_difference() -> None:
    table = _table((AMD, SOFT, {"bn_gelu": "aaaa", "embedding": "bbbb"}))
    failures, _ = portability.compare(
        table, AMD, SOFT, {"bn_gelu": "aaaa", "embedding": "cccc"}
    )
    assert len(failures) == 1 and "builtin:embedding" in failures[0]
    assert portability.compare(table, AMD, SOFT, {"bn_gelu": "aaaa"}) == ([], [])


def test_another_cpu_only_records_models_not_shown_portable() -> None:
    table = _table((AMD, SOFT, {"bn_gelu": "aaaa"}))
    failures, notes = portability.compare(table, INTEL, SOFT, {"bn_gelu": "ffff"})
    assert failures == []
    assert "not in the table" in notes[0]


def test_a_model_identical_on_two_cpus_must_match_anywhere() -> None:
    table = _table(
        (AMD, SOFT, {"embedding": "eeee", "bn_gelu": "aaaa"}),
        (INTEL, SOFT, {"embedding": "eeee", "bn_gelu": "1111"}),  # bn_gelu differed.
    )
    assert portability.portable_models(table, SOFT) == {"embedding": "eeee"}
    # Python and NumPy are recorded, not compared (they did not decide the bits).
    newer_python = dict(SOFT, python="3.12", numpy="2.5")
    assert portability.portable_models(table, newer_python) == {"embedding": "eeee"}
    third = {"cpu_vendor": "HygonGenuine", "cpu_caches": [], "cpu_count": 8}
    failures, _ = portability.compare(
        table, third, SOFT, {"embedding": "0000", "bn_gelu": "2222"}
    )
    assert len(failures) == 1 and "shown portable" in failures[0]
    # Other software versions: nothing is shown portable for them.
    other = dict(SOFT, tensorflow="2.22.0")
    assert portability.compare(table, third, other, {"embedding": "0000"})[0] == []


def test_an_emulated_cpu_does_not_make_a_model_portable() -> None:
    emulated = {"emulated": "QEMU 7.2.22 user-mode emulation of a Haswell-v4 CPU"}
    table = _table(
        (AMD, SOFT, {"embedding": "eeee"}), (emulated, SOFT, {"embedding": "eeee"})
    )
    assert portability.portable_models(table, SOFT) == {}
    table["machines"].append(
        {"cpu": INTEL, "software": SOFT, "digests": {"embedding": "eeee"}}
    )
    assert portability.portable_models(table, SOFT) == {"embedding": "eeee"}


def test_a_process_run_whole_under_an_emulator_is_recorded_as_an_emulation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An aarch64 Python under qemu-aarch64 (ci/aarch64.py): its CPU facts say
    # so, and its entry must never count as a real machine.
    facts = dict.fromkeys(portability.CPU_KEYS, None)
    facts.update(
        cpu_vendor="QEMU (emulated)",
        cpu_model="QEMU max",
        cpu_emulated="aarch64 max under a user-mode emulator on x86-64 (AuthenticAMD)",
    )
    monkeypatch.setattr(portability._environment, "cpu_facts", lambda: facts)
    entry = portability.cpu()
    assert set(entry) == set(portability.EMULATED_KEYS)
    assert entry["emulated"].startswith("aarch64 max under a user-mode emulator")
    assert entry["emulated_model"] == "QEMU max"
    table = _table((AMD, SOFT, {"cnn": "aaaa"}), (entry, SOFT, {"cnn": "aaaa"}))
    assert portability.portable_models(table, SOFT) == {}


def test_across_architectures_compares_each_models_digests_by_architecture() -> None:
    arm = {"emulated": "aarch64 max under a user-mode emulator on x86-64"}
    older = dict(SOFT, tfdet_patches=["older"])
    table = _table(
        (AMD, SOFT, {"cnn": "aaaa", "bn_gelu": "bbbb", "lstm": "cccc"}),
        (INTEL, SOFT, {"cnn": "aaaa", "bn_gelu": "bbbb"}),
        (INTEL, older, {"cnn": "0000"}),
        (arm, dict(SOFT, tfdet_patches=["fewer"]), {"cnn": "aaaa", "bn_gelu": "dddd"}),
        (arm, dict(SOFT, tensorflow="2.20.0"), {"lstm": "cccc"}),
    )
    for machine, date in zip(table["machines"], ["2", "2", "1", "3", "3"], strict=True):
        machine["date"] = date
    for machine in table["machines"][3:]:
        machine["architecture"] = "aarch64"
    rows = portability.across_architectures(
        table, SOFT["tensorflow"], SOFT["keras_version"]
    )
    # Entries without an architecture are x86-64's. Another TensorFlow's entry
    # is left out, and so is an older patch set than an architecture's newest
    # entry's; each architecture's own patch set counts.
    assert rows == [
        ("bn_gelu", {"aarch64": ["dddd"], "x86_64": ["bbbb"]}, "differs"),
        ("cnn", {"aarch64": ["aaaa"], "x86_64": ["aaaa"]}, "equal"),
    ]


def test_record_updates_this_machines_entry() -> None:
    table = _table(
        (AMD, SOFT, {"bn_gelu": "aaaa", "survey:adam": "cccc"}),
        (INTEL, SOFT, {"bn_gelu": "1111"}),
    )
    updated = portability.record(table, AMD, SOFT, {"bn_gelu": "bbbb"})
    assert len(updated["machines"]) == 2
    # The model trained now is replaced; one not trained now is kept.
    assert updated["machines"][-1]["digests"] == {
        "bn_gelu": "bbbb",
        "survey:adam": "cccc",
    }
    assert updated["machines"][-1]["date"]
    assert updated["machines"][-1]["architecture"] == platform.machine()
    assert updated["machines"][0]["digests"] == {"bn_gelu": "1111"}


def test_survey_models_are_named_and_trained_from_their_module() -> None:
    names = portability.models()
    assert "survey:batch_norm_train" in names and "bn_gelu" in names
    assert portability.label("survey:adam") == "survey:adam"
    assert portability.label("cnn") == "builtin:cnn"
    assert portability.target("survey:adam").endswith("survey_models.py:adam")


def test_the_recorded_table_is_well_formed() -> None:
    table = portability.load_table()
    assert table["machines"], "record this machine: benchmarks/portability.py --record"
    for machine in table["machines"]:
        assert set(machine["cpu"]) in (
            set(portability.CPU_KEYS),
            set(portability.EMULATED_KEYS),
        )
        # Entries recorded before the patch set was part of the key lack it.
        assert (
            set(portability.SOFTWARE_KEYS) - {"tfdet_patches"}
            <= set(machine["software"])
            <= set(portability.SOFTWARE_KEYS)
        )
        assert set(machine["digests"]) <= set(portability.models())
        assert all(len(d) == 16 for d in machine["digests"].values())


@pytest.mark.slow
def test_this_machine_repeats_its_recorded_digests(
    capsys: pytest.CaptureFixture,
) -> None:
    digests = {
        name: result["digest"]
        for name, result in portability.measure(list(portability.TINY)).items()
    }
    facts, soft = portability.cpu(), portability.software()
    failures, notes = portability.compare(
        portability.load_table(), facts, soft, digests
    )
    with capsys.disabled():
        print(f"\nportability digests on {facts['cpu_model']}: {digests}")
        for note in notes:
            print(note)
    assert not failures, "\n".join(failures)


def test_tiny_models_are_built_in_targets() -> None:
    assert set(portability.TINY) <= set(portability.models())
    assert Path(portability.TABLE).name == "portability_digests.json"


def test_model_groups_expand_to_their_models() -> None:
    survey = portability.expand(["survey"])
    assert survey and all(name.startswith("survey:") for name in survey)
    assert portability.expand(["builtin", "survey:adam"])[-1] == "survey:adam"
    assert "cnn" in portability.expand(["builtin"])


def test_a_pool_of_no_thread_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exited:
        portability.main(["--threads", "0"])
    assert exited.value.code == 2


def test_entries_at_another_pool_size_are_kept_and_compared_apart() -> None:
    table = _table((AMD, SOFT, {"cnn": "aaaa"}), (INTEL, SOFT, {"cnn": "aaaa"}))
    at_two = portability.record(table, AMD, SOFT, {"cnn": "2222"}, threads=2)
    # A second entry for the same CPU and software: the profile's stays.
    assert [portability.threads_of(m) for m in at_two["machines"]] == [1, 1, 2]
    assert at_two["machines"][0]["digests"] == {"cnn": "aaaa"}
    assert at_two["machines"][-1]["profile"]["threads"] == 2
    # At 2 threads, the same CPU must repeat its 2-thread digest, and the
    # 1-thread digest shown portable on two CPUs is not the 2-thread promise.
    assert portability.compare(at_two, AMD, SOFT, {"cnn": "2222"}, threads=2)[0] == []
    failures, _ = portability.compare(at_two, AMD, SOFT, {"cnn": "3333"}, threads=2)
    assert len(failures) == 1 and "same CPU" in failures[0]
    assert portability.portable_models(at_two, SOFT) == {"cnn": "aaaa"}
    assert portability.portable_models(at_two, SOFT, threads=2) == {}
    # At 1 thread nothing changed: the 2-thread entry is not this CPU's.
    assert portability.compare(at_two, AMD, SOFT, {"cnn": "aaaa"})[0] == []
    again = portability.record(at_two, AMD, SOFT, {"lstm": "4444"}, threads=2)
    assert len(again["machines"]) == 3
    assert again["machines"][-1]["digests"] == {"cnn": "2222", "lstm": "4444"}


def test_across_architectures_compares_one_pool_size() -> None:
    table = _table((AMD, SOFT, {"cnn": "aaaa"}), (INTEL, SOFT, {"cnn": "bbbb"}))
    table["machines"][1]["architecture"] = "aarch64"
    table["machines"][1]["profile"] = {"threads": 2}
    assert portability.across_architectures(table, "2.21.0", "3.15.1") == []
    table["machines"][0]["profile"] = {"threads": 2}
    rows = portability.across_architectures(table, "2.21.0", "3.15.1", threads=2)
    assert rows == [("cnn", {"aarch64": ["bbbb"], "x86_64": ["aaaa"]}, "differs")]


def _machine_output(folder: Path, cpu: str, digests: dict[str, str]) -> None:
    folder.mkdir()
    (folder / "env.txt").write_text(f"cpu_vendor: {cpu}\ncpu_count: 2\n")
    for name, digest in digests.items():
        (folder / f"{name}.json").write_text(json.dumps({"digest": digest}))


def test_two_machines_compare_says_same_bits_only_when_every_digest_agrees(
    tmp_path: Path,
) -> None:
    # The comparison of benchmarks/two_machines.sh, on made-up outputs: a
    # case is the same bits only when both uninterrupted runs and both
    # cross-machine resumes agree; a missing resume is incomplete.
    same = {"full-gan": "aa", "resumed-gan": "aa", "full-dense-array": "bb"}
    _machine_output(tmp_path / "a", "AuthenticAMD", same)
    _machine_output(
        tmp_path / "b",
        "GenuineIntel",
        {**same, "full-control-conv-plain-tensorflow": "cc"},
    )
    (tmp_path / "a" / "full-control-conv-plain-tensorflow.json").write_text(
        json.dumps({"digest": "dd"})
    )
    result = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "two_machines.sh"), "compare",
         str(tmp_path / "a"), str(tmp_path / "b")],
        capture_output=True, text=True, env={**os.environ, "PYTHON": sys.executable},
        check=True,
    )  # fmt: skip
    rows = {
        line.split()[0]: line.split()[-1] for line in result.stdout.splitlines()[3:]
    }
    assert rows["gan"] == "bits"  # "same bits"
    assert rows["dense-array"] == "incomplete"  # No resume on either side.
    assert rows["control-conv-plain-tensorflow"] == "DIFFERENT"
    assert "cpu_vendor=GenuineIntel" in result.stdout
