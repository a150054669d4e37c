"""The `auto_shard_data` patch: AUTO auto-sharding becomes DATA, whatever the storage.

Shards a dataset read from 4 TFRecord files the way a 2-worker strategy does
(`input_ops.auto_shard_dataset`, worker 0 of 2). TensorFlow's AUTO shards
files (worker 0 reads files 0 and 2); under the patch worker 0 gets every
other element, exactly what it gets from the same samples in memory. A
policy set on the dataset is kept.
"""

from __future__ import annotations

import pytest

from tfdet._patching import _registry

tf = pytest.importorskip("tensorflow")

_FILES, _PER_FILE = 4, 3


@pytest.fixture
def records(tmp_path):
    """4 TFRecord files of 3 records each; record i holds the number i."""
    paths = []
    for file in range(_FILES):
        path = str(tmp_path / f"part{file}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for i in range(file * _PER_FILE, (file + 1) * _PER_FILE):
                writer.write(str(i).encode())
        paths.append(path)
    return tf.data.TFRecordDataset(paths).map(tf.strings.to_number)


@pytest.fixture
def patch():
    installed = "auto_shard_data" in _registry.installed()
    _registry.install(["auto_shard_data"])
    yield
    if not installed:
        _registry.restore(["auto_shard_data"])


def _worker_0_of_2(dataset, policy=None):
    from tensorflow.python.distribute import input_ops

    if policy is not None:
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = getattr(
            tf.data.experimental.AutoShardPolicy, policy
        )
        dataset = dataset.with_options(options)
    sharded = input_ops.auto_shard_dataset(dataset, 2, 0, 2)
    return [int(x) for x in sharded.as_numpy_iterator()]


def test_without_the_patch_auto_shards_files(records):
    if "auto_shard_data" in _registry.installed():
        pytest.skip("the patch is installed in this process")
    # Files 0 and 2: what a worker trains on follows how the data are stored.
    assert _worker_0_of_2(records) == [0, 1, 2, 6, 7, 8]


def test_auto_becomes_data_the_same_samples_as_in_memory(records, patch):
    in_memory = tf.data.Dataset.range(_FILES * _PER_FILE)
    assert _worker_0_of_2(records) == [0, 2, 4, 6, 8, 10]
    assert _worker_0_of_2(in_memory) == [0, 2, 4, 6, 8, 10]


def test_a_policy_set_on_the_dataset_is_kept(records, patch):
    assert _worker_0_of_2(records, "FILE") == [0, 1, 2, 6, 7, 8]
    assert _worker_0_of_2(records, "OFF") == list(range(12))
