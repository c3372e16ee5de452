"""Configs on image data: bad input fails before compilation; tfds under mock data; server data; a short
run."""

import numpy as np
import pytest

from fedjax_lab.data.sources import default_data_dir
from fedjax_lab.experiments import ConfigError, validate
from fedjax_lab.experiments.build import build_experiment
from fedjax_lab.experiments.runner import run_experiment

HAVE_MNIST = (default_data_dir() / "mnist" / "mnist.npz").is_file()


def _config(image_root, **sections):
    raw = {"dataset": {"name": "image_folder", "data_dir": str(image_root),
                       "partition": {"name": "dirichlet", "num_clients": 6, "alpha": 1.0, "min_size": 3}},
           "model": {"name": "simple_cnn"}, "algorithm": {"name": "fedavg"},
           "client": {"batch_size": 8, "local_steps": 3, "learning_rate": 0.05, "momentum": 0.9},
           "rounds": {"num_rounds": 4, "clients_per_round": 3}, "eval": {"every": 2, "per_client": False}}
    for section, fields in sections.items():
        raw[section] = {**raw.get(section, {}), **fields}
    return validate(raw)


def test_non_positive_alpha_fails_validation():
    raw = {"dataset": {"name": "cifar10", "partition": {"alpha": 0}}, "model": {"name": "simple_cnn"},
           "algorithm": {"name": "fedavg"}, "client": {"local_steps": 1}}
    with pytest.raises(ConfigError, match="dataset.partition.alpha: Input should be greater than 0, got 0"):
        validate(raw)


def test_unknown_dataset_lists_the_image_datasets():
    raw = {"dataset": {"name": "imagenet"}, "model": {"name": "simple_cnn"}, "algorithm": {"name": "fedavg"},
           "client": {"local_steps": 1}}
    with pytest.raises(ConfigError, match="dataset.name: unknown name 'imagenet'; .*allowed: .*'cifar10'"):
        validate(raw)


def test_more_clients_than_examples_fails_before_compilation(image_root):
    config = _config(image_root, dataset={"partition": {"name": "iid", "num_clients": 91}},
                     rounds={"clients_per_round": 2})
    with pytest.raises(ConfigError, match="num_clients must be <= the number of training examples "
                                          "\\(90\\), got 91"):
        build_experiment(config)


def test_image_shape_that_does_not_fit_the_model_fails_before_compilation(image_root):
    config = _config(image_root, model={"name": "fedavg_cnn", "padding": "VALID"})
    build_experiment(config)  # 16x16 fits VALID 5x5 convolutions twice (16 -> 12 -> 6 -> 2 -> 1)
    with pytest.raises(ConfigError, match="model.name: cnn3 does not fit inputs of shape \\(16, 16, 3\\)"):
        build_experiment(_config(image_root, model={"name": "cnn3"}, dataset={"augment": "none"}))


def test_missing_archive_fails_with_the_path(tmp_path):
    config = validate({"dataset": {"name": "cifar10", "data_dir": str(tmp_path)},
                       "model": {"name": "simple_cnn"}, "algorithm": {"name": "fedavg"},
                       "client": {"local_steps": 1}})
    with pytest.raises(ConfigError, match="dataset.data_dir: cifar10 archive not found at"):
        build_experiment(config)


def test_model_and_data_mismatches_are_named():
    with pytest.raises(ConfigError, match="linear_svm needs 2 classes"):
        build_experiment(validate({"dataset": {"name": "synthetic"}, "model": {"name": "linear_svm"},
                                   "algorithm": {"name": "fedavg"}, "client": {"local_steps": 1}}))
    with pytest.raises(ConfigError, match="tfds"):
        validate({"dataset": {"name": "svhn_cropped"}, "model": {"name": "simple_cnn"},
                  "algorithm": {"name": "fedavg"}, "client": {"local_steps": 1}})


def test_server_data_is_withheld_and_reaches_the_round(image_root):
    config = _config(image_root, dataset={"server_data": {"kind": "in_domain", "size": 12}})
    experiment = build_experiment(config)
    data = experiment.dataset
    client_rows = np.concatenate([data.client_train_ids[k, :n]
                                  for k, n in enumerate(data.client_train_counts)])
    assert len(client_rows) == 78 and experiment.inputs.server_arrays["x"].shape == (12, 16, 16, 3)
    assert list(np.bincount(data.server["y"])) == [4, 4, 4]


def test_in_domain_server_data_from_the_test_set_leaves_the_rest_for_evaluation(image_root):
    config = _config(image_root, dataset={"server_data": {"kind": "in_domain", "size": 9, "split": "test"}})
    data = build_experiment(config).dataset
    assert data.server["x"].shape[0] == 9 and data.test["x"].shape[0] == 27 - 9
    assert data.client_train_counts.sum() == 90  # no training row taken
    assert np.bincount(data.server["y"]).tolist() == [3, 3, 3]


def test_short_cnn_run_learns_and_writes_a_partition_report(image_root, tmp_path):
    config = _config(image_root, rounds={"num_rounds": 6}, eval={"every": 3})
    summary = run_experiment(config, tmp_path / "run", progress=False)
    assert summary["final"]["test_accuracy"] > 0.6
    assert ((tmp_path / "run" / "partition.png").is_file()
            and "| **all** |" in (tmp_path / "run" / "partition.md").read_text())


def test_saved_partition_reloads_to_the_same_clients(image_root, tmp_path):
    first = build_experiment(_config(image_root))
    from fedjax_lab.data.report import write_partition_report

    write_partition_report(first.dataset, tmp_path)
    again = build_experiment(_config(image_root, dataset={"partition": {
        "name": "iid", "num_clients": 6, "file": str(tmp_path / "partition.npz")}}))
    np.testing.assert_array_equal(again.dataset.client_train_ids, first.dataset.client_train_ids)


def test_batchnorm_resnet_and_feature_skew_run_end_to_end(image_root, tmp_path):
    config = _config(image_root, model={"name": "resnet8", "norm": "batch"}, client={"local_steps": 1},
                     dataset={"partition": {"name": "feature_skew", "num_clients": 6, "noise": 0.2},
                              "augment": "crop_flip"},
                     rounds={"num_rounds": 2}, eval={"every": 2})
    summary = run_experiment(config, tmp_path / "bn", progress=False)
    assert np.isfinite(summary["final"]["test_loss"])


@pytest.mark.parametrize("remat, saves, expected", [
    ("auto", 0.5, (2, True, ("blocks: the memory budget fits 2 clients at once with the residual blocks "
                             "rematerialised, 1 with them stored"))),
    ("auto", 1.0, (1, False, "off: rematerialising the residual blocks fits no more than 1 client at once")),
    ("off", 0.5, (1, False, None))])
def test_remat_auto_rematerialises_a_resnets_blocks_when_the_budget_then_fits_more_clients(
        image_root, monkeypatch, remat, saves, expected):
    """The decision, from each build's compiled need (here a stand-in: 0.2 of the budget, plus 0.7 a client
    with the blocks stored and ``saves`` times that rematerialised); the compiled need itself is XLA's."""
    from fedjax_lab.experiments import build, memory_fit

    def need(experiment, chunk):
        per_client = 0.7 * (saves if experiment.config.model.remat == "blocks" else 1.0)
        clients = chunk or experiment.plan.cohort_size
        return memory_fit.memory_budget(experiment.config) * (0.2 + per_client * clients)

    monkeypatch.setattr(build, "default_chunk_size", lambda *args: None)  # the whole cohort, as on a GPU
    monkeypatch.setattr(memory_fit, "_compiled_need", need)
    monkeypatch.setattr(build, "check_memory", lambda experiment: None)
    config = _config(image_root, model={"name": "resnet8", "norm": "group", "remat": remat},
                     rounds={"clients_per_round": 4, "layout": "rules"}, parallel={"memory_budget_gb": 1e-6})
    experiment = build_experiment(config)
    assert (experiment.plan.chunk_size, experiment.classifier.module.remat,
            experiment.layout.get("remat")) == expected
    assert experiment.config == config  # the run's config stays as written


def test_tfds_source_under_mock_data_builds_a_federated_dataset():
    pytest.importorskip("tensorflow_datasets")
    from tests.test_tfds_source import mock_tfds

    config = validate({"dataset": {"name": "mnist", "source": "tfds",
                                   "partition": {"name": "iid", "num_clients": 4}},
                       "model": {"name": "simple_cnn"}, "algorithm": {"name": "fedavg"},
                       "client": {"local_steps": 1}, "rounds": {"clients_per_round": 2}})
    with mock_tfds(num_examples=40):
        experiment = build_experiment(config)
    assert experiment.dataset.train["x"].shape == (40, 28, 28, 1) and experiment.dataset.num_clients == 4


def test_shakespeare_char_rnn_runs_a_round_with_per_client_metrics(tmp_path):
    if not (default_data_dir() / "shakespeare" / "shakespeare_tff.json.gz").is_file():
        pytest.skip("../shared/data not present")
    from fedjax_lab.experiments import load_config

    config = load_config("configs/shakespeare_fedavg.yaml", [
        "dataset.num_clients=6", "model.rnn_hidden=16", "client.local_epochs=null", "client.local_steps=2",
        "rounds.num_rounds=2", "rounds.clients_per_round=3", "eval.every=2", "client.learning_rate=0.5"])
    summary = run_experiment(config, tmp_path / "shakespeare", progress=False)
    final = summary["final"]
    assert (np.isfinite(final["test_loss"])
            and 0 <= final["client_accuracy_min"] <= final["client_accuracy_max"] <= 1)
    with pytest.raises(ConfigError, match="shakespeare needs char_rnn"):
        build_experiment(load_config("configs/shakespeare_fedavg.yaml", ["model.name=mlp"]))


def test_partition_command_reports_without_training(image_root, tmp_path, capsys):
    from fedjax_lab.experiments.cli import main

    config = tmp_path / "c.yaml"
    config.write_text("dataset: {name: image_folder, data_dir: '" + str(image_root) + "', partition: {name: "
                      "shards, num_clients: 5}}\nmodel: {name: simple_cnn}\nalgorithm: {name: fedavg}\n"
                      "client: {local_steps: 1}\nrounds: {clients_per_round: 2}\n")
    assert main(["partition", str(config), "--out", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert "| **all** | 30 | 30 | 30 | 90 |" in out and (tmp_path / "p" / "partition.png").is_file()


@pytest.mark.skipif(not HAVE_MNIST, reason="../shared/data not present")
def test_out_of_domain_server_data_comes_from_another_dataset():
    config = validate({"dataset": {"name": "mnist", "partition": {"name": "iid", "num_clients": 10},
                                   "server_data": {"kind": "out_of_domain", "dataset": "fashion_mnist",
                                                   "size": 50}},
                       "model": {"name": "logistic_regression"}, "algorithm": {"name": "fedavg"},
                       "client": {"local_steps": 1}, "rounds": {"clients_per_round": 2}})
    data = build_experiment(config).dataset
    fashion = np.load(default_data_dir() / "fashion_mnist" / "fashion_mnist.npz")["x_train"]
    rows = [np.flatnonzero((fashion == x).all(axis=(1, 2, 3))) for x in data.server["x"][:3]]
    assert data.server["x"].shape == (50, 28, 28, 1) and all(len(r) == 1 for r in rows)
    assert data.client_train_counts.sum() == 60000


@pytest.mark.skipif(not HAVE_MNIST, reason="../shared/data not present")
def test_bherd_case_2_on_parity_labels_deals_digits_not_parities():
    """BHerd's SVM task: client k of 5 holds the digits {k, k+5} (one even, one odd), labelled even (1) / odd
    (0)."""
    from fedjax_lab.experiments import load_config

    config = load_config("configs/bherd/svm_mnist.yaml", ["dataset.partition.case=2"])
    data = build_experiment(config).dataset
    digits = np.load(default_data_dir() / "mnist" / "mnist.npz")["y_train"]
    for k in range(5):
        rows = data.client_train_ids[k, :data.client_train_counts[k]]
        assert set(np.unique(digits[rows])) == {k, k + 5}
        np.testing.assert_array_equal(data.train["y"][rows], (digits[rows] % 2 == 0).astype(np.int32))
    assert data.num_classes == 2  # the sizes the BHerd digest reads off the reference code:
    assert list(data.client_train_counts) == [11344, 12660, 12223, 11982, 11791]


HAVE_CIFAR100 = (default_data_dir() / "cifar100").is_dir()


@pytest.mark.skipif(not (HAVE_MNIST and HAVE_CIFAR100), reason="../shared/data not present")
@pytest.mark.parametrize("name", ["paper_fashion_mnist", "paper_cifar10", "paper_cifar100"])
def test_feddle_paper_scale_configs_build_and_shape_check(name):
    """Table 5's federation (500 clients, N(20), the in-flight store of 500 jobs) compiles to the right
    shapes."""
    import jax

    from fedjax_lab.experiments import load_config

    experiment = build_experiment(load_config(f"configs/async/{name}.yaml"))
    assert experiment.dataset.num_clients == 500 and experiment.plan.capacity == 500
    state = jax.eval_shape(experiment.initial_state)
    out, metrics = jax.eval_shape(lambda s: experiment.run_rounds(s, experiment.inputs, num_rounds=1), state)
    assert (jax.tree.map(lambda a: a.shape, out.server_state)
            == jax.tree.map(lambda a: a.shape, state.server_state))
    assert metrics["staleness_counts"].shape == (1, 81)
    if name == "paper_cifar100":
        from fedjax_lab.data.sources import load_local
        from fedjax_lab.experiments.datasets import partition_rows

        data, config = experiment.dataset, experiment.config
        assert data.num_classes == 20
        fine = load_local("cifar100", labels="fine").train["y"]
        dealt = partition_rows(fine, config.dataset.partition, 100, config.seed)  # by the 100 fine classes
        for k in range(0, 500, 50):
            np.testing.assert_array_equal(np.sort(data.client_train_ids[k, :data.client_train_counts[k]]),
                                          np.sort(dealt[k]))


@pytest.mark.skipif(not (HAVE_MNIST and HAVE_CIFAR100), reason="../shared/data not present")
@pytest.mark.parametrize("name,other,classes", [("cpu_fashion_mnist_ood", "mnist", 10),
                                                ("cpu_cifar10_ood", "cifar100", 100),
                                                ("cpu_cifar100_ood", "cifar10", 10)])
def test_feddle_out_of_domain_configs_hold_another_datasets_images_and_labels(name, other, classes):
    """The out-of-domain server data is 10,000 images of another dataset with its own labels (CIFAR-100's fine
    ones even beside a superclass task), and Feddle-OOD and FedDF-OOD compile to the right shapes on it."""
    import jax

    from fedjax_lab.data.sources import load_local
    from fedjax_lab.experiments import load_config

    for algorithm in ([], ["algorithm={name: feddf}"]):
        experiment = build_experiment(load_config(f"configs/feddle/{name}.yaml", algorithm))
        server = experiment.dataset.server
        assert server["x"].shape == (10_000,) + experiment.dataset.input_shape
        assert len(np.unique(server["y"])) == classes
        source = load_local(other, labels="fine").train
        assert (server["x"][0] == source["x"]).all(axis=tuple(range(1, source["x"].ndim))).any()
        assert len(experiment.dataset.test["y"]) == 10_000  # evaluation on the whole test set
        state = jax.eval_shape(experiment.initial_state)
        out, _ = jax.eval_shape(lambda s, e=experiment: e.run_rounds(s, e.inputs, num_rounds=1), state)
        assert (jax.tree.map(lambda a: a.shape, out.server_state)
                == jax.tree.map(lambda a: a.shape, state.server_state))


@pytest.mark.skipif(not (HAVE_MNIST and HAVE_CIFAR100), reason="../shared/data not present")
@pytest.mark.parametrize("name", ["paper_fashion_mnist", "paper_cifar10"])
def test_fedcog_paper_scale_configs_build_and_shape_check(name):
    """Table 1's setting (10 clients, FedAvg then FedAvg + FedCOG from round 50) compiles to the right shapes,
    and NIID-2's class blocks give every client its block's classes. (CIFAR-100's config differs from
    CIFAR-10's in its data and blocks of 10 classes only; test_config validates it, and the suite's time is
    better spent elsewhere.)"""
    import jax

    from fedjax_lab.experiments import load_config

    blocks = "{name: class_blocks, num_clients: 10, classes: 2}"
    for overrides in ([], [f"dataset.partition={blocks}"]):
        experiment = build_experiment(load_config(f"configs/fedcog/{name}.yaml", overrides))
        state = jax.eval_shape(experiment.initial_state)
        out, _ = jax.eval_shape(lambda s, e=experiment: e.run_rounds(s, e.inputs, num_rounds=1), state)
        assert (jax.tree.map(lambda a: a.shape, out.server_state)
                == jax.tree.map(lambda a: a.shape, state.server_state))
        assert set(out.client_states) == {"fedcog"}
    data = experiment.dataset
    for k in range(10):
        assert len(np.unique(data.train["y"][data.client_train_ids[k, :data.client_train_counts[k]]])) == 2


@pytest.mark.skipif(not (HAVE_MNIST and HAVE_CIFAR100), reason="../shared/data not present")
@pytest.mark.parametrize("name", ["paper_cifar10", "cpu_fashion_mnist"])
def test_fedimpro_configs_build_and_shape_check(name):
    """Table 1's setting (ResNet-18 split after layer2, 10 clients, 5 a round) compiles to the right shapes:
    the shared statistics are [classes, features at the split]; the baselines' configs validate from the same
    file, and build on the small one."""
    import jax

    from fedjax_lab.experiments import load_config

    experiment = build_experiment(load_config(f"configs/fedimpro/{name}.yaml"))
    state = jax.eval_shape(experiment.initial_state)
    out, _ = jax.eval_shape(lambda s: experiment.run_rounds(s, experiment.inputs, num_rounds=1), state)
    stats = out.server_state.components["fedimpro"].stats
    features = 16 * 4 * 4 if name == "cpu_fashion_mnist" else 128 * 16 * 16
    assert stats.mean.shape == (experiment.dataset.num_classes, features)
    for baseline in ("{name: scaffold}", "{name: fednova}"):  # tracing ResNet-18 again adds nothing here
        config = load_config(f"configs/fedimpro/{name}.yaml", [f"algorithm={baseline}"])
        if name == "cpu_fashion_mnist":
            build_experiment(config)
