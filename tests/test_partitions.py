"""Partitioners against hand-checked cases and the NIID-Bench procedure's properties."""

import numpy as np
import pytest

from fedjax_lab.data import partitions
from fedjax_lab.data.partitions import PartitionError
from fedjax_lab.data.report import counts_table, load_partition, save_partition


def _labels(per_class=(50,) * 10, seed=0):
    y = np.concatenate([np.full(n, k) for k, n in enumerate(per_class)])
    return np.random.RandomState(seed).permutation(y)


def _is_partition_of(rows, n):
    allrows = np.concatenate(rows)
    return len(allrows) == len(np.unique(allrows)) and set(allrows) <= set(range(n))


def _niid_bench_reference(y, n_parties, beta, seed, K=10):
    """NIID-Bench's ``noniid-labeldir`` loop as written there (global np.random seeded once)."""
    np.random.seed(seed)
    min_size, N = 0, y.shape[0]
    while min_size < 10:
        idx_batch = [[] for _ in range(n_parties)]
        for k in range(K):
            idx_k = np.where(y == k)[0]
            np.random.shuffle(idx_k)
            proportions = np.random.dirichlet(np.repeat(beta, n_parties))
            proportions = np.array([p * (len(idx_j) < N / n_parties)
                                    for p, idx_j in zip(proportions, idx_batch)])
            proportions = proportions / proportions.sum()
            proportions = (np.cumsum(proportions) * len(idx_k)).astype(int)[:-1]
            idx_batch = [idx_j + idx.tolist() for idx_j, idx in zip(idx_batch, np.split(idx_k, proportions))]
            min_size = min([len(idx_j) for idx_j in idx_batch])
    for j in range(n_parties):
        np.random.shuffle(idx_batch[j])
    return idx_batch


@pytest.mark.parametrize("num_clients, alpha, seed", [(10, 0.5, 0), (20, 0.1, 3), (7, 5.0, 1)])
def test_dirichlet_reproduces_niid_bench_draw_for_draw(num_clients, alpha, seed):
    y = _labels((300,) * 10)
    ours = partitions.dirichlet_label_skew(y, num_clients, alpha, seed, 10)
    theirs = _niid_bench_reference(y, num_clients, alpha, seed)
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(a, b)


def test_dirichlet_gives_every_client_min_size_and_uses_every_row():
    y = _labels((200,) * 10)
    rows = partitions.dirichlet_label_skew(y, 30, 0.3, 0, 10)
    assert min(map(len, rows)) >= 10
    assert _is_partition_of(rows, len(y)) and sum(map(len, rows)) == len(y)


def test_dirichlet_smaller_alpha_is_more_skewed():
    y = _labels((500,) * 10)

    def mean_classes_held(alpha):
        rows = partitions.dirichlet_label_skew(y, 20, alpha, 0, 10)
        return np.mean([(np.bincount(y[r], minlength=10) > 0).sum() for r in rows])

    assert mean_classes_held(0.1) < 5
    assert mean_classes_held(100.0) > 9.5


def test_dirichlet_gives_up_with_a_clear_error_instead_of_looping():
    y = _labels((12,) * 10)  # 120 rows cannot give 12 clients >= 10 rows each with alpha 0.01
    with pytest.raises(PartitionError, match="max_attempts=5"):
        partitions.dirichlet_label_skew(y, 12, 0.01, 0, 10, max_attempts=5)


@pytest.mark.parametrize("fn", [
    lambda y: partitions.dirichlet_label_skew(y, 5, 0.0, 0, 10),
    lambda y: partitions.dirichlet_client_mix(y, 5, -1.0, 0, 10),
    lambda y: partitions.quantity_skew(y, 5, 0.0, 0),
])
def test_non_positive_alpha_is_rejected(fn):
    with pytest.raises(PartitionError, match="alpha must be > 0"):
        fn(_labels())


def test_more_clients_than_examples_is_rejected():
    with pytest.raises(PartitionError, match="num_clients must be <= the number of training examples"):
        partitions.iid(np.zeros(5, int), 6, 0)


def test_iid_sizes_differ_by_at_most_one():
    rows = partitions.iid(_labels(), 7, 0)
    assert _is_partition_of(rows, 500) and max(map(len, rows)) - min(map(len, rows)) <= 1


def test_classes_per_client_hand_checked():
    y = np.repeat(np.arange(4), 6)  # 4 classes x 6 rows
    rows = partitions.classes_per_client(y, 4, 1, 0, 4)
    # One class each: client i holds class i mod 4, all of its rows.
    for i, r in enumerate(rows):
        assert sorted(r) == list(range(6 * i, 6 * i + 6))
    rows = partitions.classes_per_client(y, 8, 1, 0, 4)
    # Two holders per class: the class's six rows split 3/3.
    assert [len(r) for r in rows] == [3] * 8 and _is_partition_of(rows, 24)


def test_classes_per_client_each_client_holds_exactly_k_classes():
    y = _labels()
    for r in partitions.classes_per_client(y, 10, 3, 0, 10):
        assert len(np.unique(y[r])) == 3


def test_shards_hand_checked():
    y = np.array([1, 0, 1, 0, 2, 2, 0, 1])
    rows = partitions.shards(y, 2, 2, seed=0)  # 4 shards of 2 rows of the label-sorted order
    order = np.argsort(y, kind="stable")  # [1 3 6 | 0 2 7 | 4 5]
    shards = [set(order[2 * s:2 * s + 2]) for s in range(4)]
    for r in rows:
        assert len(r) == 4 and sum(set(r) >= shard for shard in shards) == 2


def test_quantity_skew_keeps_labels_iid_but_sizes_vary():
    rows = partitions.quantity_skew(_labels((1000,) * 10), 10, 0.5, 0)
    sizes = [len(r) for r in rows]
    assert min(sizes) >= 10 and max(sizes) > 2 * min(sizes) and sum(sizes) == 10000


def test_client_mix_gives_equal_sizes_and_skewed_classes():
    y = _labels((400,) * 10)
    rows = partitions.dirichlet_client_mix(y, 20, 0.1, 0, 10)
    assert [len(r) for r in rows] == [200] * 20 and _is_partition_of(rows, len(y))
    assert np.mean([np.bincount(y[r], minlength=10).max() / 200 for r in rows]) > 0.5


def test_feature_noise_levels_grow_linearly_to_the_last_client():
    np.testing.assert_allclose(partitions.feature_noise_levels(5, 0.4), [0, 0.1, 0.2, 0.3, 0.4])


def test_bherd_cases_match_the_reference_code_sizes_on_mnist_counts():
    per_class = (5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949)
    y = _labels(per_class)
    case2 = partitions.bherd_case(y, 5, 2, 10)
    assert [len(r) for r in case2] == [11344, 12660, 12223, 11982, 11791]
    for k, r in enumerate(case2):
        assert set(np.unique(y[r])) == {k, k + 5}
    case3 = partitions.bherd_case(y, 5, 3, 10)
    assert [set(np.unique(y[r])) for r in case3[3:]] == [{6, 8}, {5, 7, 9}]
    assert [len(r) for r in case3[3:]] == [11769, 17635]
    case1 = partitions.bherd_case(y, 5, 1, 10)
    assert list(case1[1][:3]) == [1, 6, 11]


def test_saved_partition_reloads_identically(tmp_path):
    rows = partitions.dirichlet_label_skew(_labels(), 5, 0.5, 0, 10)
    save_partition(tmp_path / "p.npz", rows, {"alpha": 0.5})
    loaded, meta = load_partition(tmp_path / "p.npz")
    assert meta == {"alpha": 0.5}
    for a, b in zip(rows, loaded):
        np.testing.assert_array_equal(a, b)


def test_counts_table_lists_clients_and_totals():
    table = counts_table(np.array([[2, 0], [1, 3]]), ("a", "b"))
    assert "| 0 | 2 | 0 | 2 |" in table and "| **all** | 3 | 3 | 6 |" in table


def test_class_blocks_is_fedcogs_deterministic_niid2():
    labels = _labels()
    rows = partitions.class_blocks(labels, 10, 2, 10)
    assert _is_partition_of(rows, len(labels)) and sum(map(len, rows)) == len(labels)
    for i in range(10):
        assert set(labels[rows[i]]) == {2 * (i % 5), 2 * (i % 5) + 1} and len(rows[i]) == 50
    zero = np.flatnonzero(labels == 0)
    np.testing.assert_array_equal(np.sort(rows[0][labels[rows[0]] == 0]), zero[:25])  # contiguous halves
    np.testing.assert_array_equal(np.sort(rows[5][labels[rows[5]] == 0]), zero[25:])
    hundred = partitions.class_blocks(_labels((5,) * 100), 10, 10, 100)
    assert [len(r) for r in hundred] == [50] * 10
    with pytest.raises(PartitionError, match="multiple of 5"):
        partitions.class_blocks(labels, 8, 2, 10)
    with pytest.raises(PartitionError, match="must divide"):
        partitions.class_blocks(labels, 10, 3, 10)
