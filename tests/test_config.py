"""Bad input fails before anything is built or compiled, naming the field and what is allowed."""

import pytest

from fedjax_lab.experiments import ConfigError, load_config, validate
from fedjax_lab.experiments.cli import main

BASE = {"dataset": {"name": "synthetic"}, "model": {"name": "logistic_regression"},
        "algorithm": {"name": "fedavg"}, "client": {"local_steps": 5}}


def _with(section, **fields):
    raw = {k: dict(v) for k, v in BASE.items()}
    raw.setdefault(section, {}).update(fields)
    return raw


@pytest.mark.parametrize("raw, message", [
    (_with("algorithm", name="fedsgd"), "algorithm.name: Input should be 'fedavg', 'fedavgm', 'fedadam'"),
    (_with("dataset", name="imagenet"), "dataset.name: unknown name 'imagenet'; allowed: 'synthetic', 'gaussian_mixture'"),
    (_with("rounds", clients_per_round=31), "rounds.clients_per_round must be <= dataset.num_clients=30, got 31"),
    (_with("client", learning_rate=0), "client.learning_rate: Input should be greater than 0, got 0"),
    (_with("client", learning_rate=-0.1), "client.learning_rate: Input should be greater than 0, got -0.1"),
    (_with("algorithm", server_learning_rate=0.0), "algorithm.server_learning_rate: Input should be greater than 0"),
    (_with("client", learnin_rate=0.1), "client.learnin_rate: unknown key; did you mean 'learning_rate'?"),
    (_with("dataset", alhpa=0.5), "dataset.alhpa: unknown key; did you mean 'alpha'?"),
    (_with("roundz", num_rounds=3), "roundz: unknown key; did you mean 'rounds'?"),
    ({k: v for k, v in BASE.items() if k != "model"}, "model: required field is missing"),
    (_with("client", local_epochs=2), "set exactly one of client.local_steps and client.local_epochs"),
    (_with("rounds", clients_per_round=10, chunk_size=4), "rounds.chunk_size must divide rounds.clients_per_round=10"),
])
def test_bad_config_is_rejected_with_field_and_allowed_values(raw, message):
    with pytest.raises(ConfigError) as error:
        validate(raw)
    assert message in str(error.value)


def test_overrides_are_parsed_as_yaml_and_applied(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("dataset: {name: synthetic}\nmodel: {name: mlp}\nalgorithm: {name: fedadam}\n"
                    "client: {local_steps: 5}\n")
    config = load_config(path, ["client.learning_rate=1e-3", "model.hidden=[16, 8]", "dataset.iid=true"])
    assert config.client.learning_rate == 1e-3 and config.model.hidden == (16, 8) and config.dataset.iid
    with pytest.raises(ConfigError, match="client.momentun: unknown key; did you mean 'momentum'"):
        load_config(path, ["client.momentun=0.9"])
    with pytest.raises(ConfigError, match="must look like dotted.key=value"):
        load_config(path, ["client.momentum"])


def test_cli_reports_bad_config_and_missing_file_without_running(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("dataset: {name: synthetic}\nmodel: {name: mlp}\nalgorithm: {name: fedavg}\n"
                    "client: {local_steps: 5}\n")
    assert main(["run", str(path), "rounds.clients_per_round=100", "--run-dir", str(tmp_path / "run")]) == 2
    assert "rounds.clients_per_round must be <= dataset.num_clients=30, got 100" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    assert main(["run", str(tmp_path / "nope.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_every_shipped_config_is_valid():
    import pathlib

    configs = sorted(pathlib.Path(__file__).parent.parent.joinpath("configs").glob("*.yaml"))
    assert configs
    for path in configs:
        load_config(path)
