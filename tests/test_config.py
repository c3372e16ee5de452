"""Bad input fails before anything is built or compiled, naming the field and what is allowed."""

from pathlib import Path

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
    (_with("algorithm", name="fedprx"),
     "algorithm.name: unknown name 'fedprx'; did you mean 'fedprox'? allowed: 'fedavg', 'fedavgm'"),
    (_with("algorithm", name="sgd"),
     "algorithm.name: unknown name 'sgd'; allowed: 'fedavg', 'fedavgm'"),  # none close
    (_with("client", learning_rate=float("inf")), "client.learning_rate: must be a finite number, got inf"),
    (_with("rounds", num_rounds=True),
     "rounds.num_rounds: expected a number or a name, got the boolean True"),
    (_with("algorithm", name="fedprox", temperature=0.5),
     ("algorithm.temperature: fedprox has no field 'temperature' (it is a field of fedcog, feddf, moon, "
      "vhl); fedprox's fields:")),

    (_with("algorithm", name="fedprox", mu=0.1, plugins=[{"name": "moon", "rho": 0.1}]),
     ("algorithm.plugins.0.rho: moon has no field 'rho' (it is a field of fedasync, fedsam); moon's fields: "
      "mu, name, temperature")),
    (_with("algorithm", name="fedavg", plugins=[{"name": "fedavg"}]),
     ("algorithm.plugins.0.name: unknown name 'fedavg'; fedavg is a method but not a plug-in; "
      "allowed: 'bherd'")),
    (_with("algorithm", name="fedprox", plugins=[{"name": "fedprox"}]),
     "algorithm.plugins: each method may appear once, got ['fedprox'] more than once"),
    (_with("algorithm", name="fedavg", plugins=[{"name": "fedwalk"}]),
     "algorithm: fedwalk needs data held by the server: set dataset.server_data"),
    (_with("dataset", name="imagenet"),
     ("dataset.name: unknown name 'imagenet'; did you mean 'image_folder'? allowed: 'synthetic', "
      "'gaussian_mixture'")),
    (_with("rounds", clients_per_round=31),
     "rounds.clients_per_round must be <= dataset.num_clients=30, got 31"),
    (_with("client", learning_rate=0), "client.learning_rate: Input should be greater than 0, got 0"),
    (_with("client", learning_rate=-0.1), "client.learning_rate: Input should be greater than 0, got -0.1"),
    (_with("algorithm", server_learning_rate=0.0),
     "algorithm.server_learning_rate: Input should be greater than 0"),
    (_with("client", learnin_rate=0.1), "client.learnin_rate: unknown key; did you mean 'learning_rate'?"),
    (_with("dataset", alhpa=0.5), "dataset.alhpa: unknown key; did you mean 'alpha'?"),
    (_with("roundz", num_rounds=3), "roundz: unknown key; did you mean 'rounds'?"),
    ({k: v for k, v in BASE.items() if k != "model"}, "model: required field is missing"),
    (_with("client", local_epochs=2), "set exactly one of client.local_steps and client.local_epochs"),
    (_with("rounds", clients_per_round=10, chunk_size=4),
     "rounds.chunk_size must divide rounds.clients_per_round=10"),
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

    configs = sorted(pathlib.Path(__file__).parent.parent.joinpath("configs").glob("**/*.yaml"))
    assert any(path.parent.name == "fedwalk" for path in configs)
    assert configs
    for path in configs:
        load_config(path)


def test_a_plugin_field_is_overridden_by_the_plugins_name(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("dataset: {name: synthetic}\nmodel: {name: mlp}\nclient: {local_steps: 5}\n"
                    "algorithm: {name: scaffold, plugins: [{name: fedprox, mu: 0.1}]}\n")
    config = load_config(path, ["algorithm.plugins.fedprox.mu=0.5"])
    assert config.algorithm.plugins[0].mu == 0.5
    with pytest.raises(ConfigError, match="no entry 'moon' in the list"):
        load_config(path, ["algorithm.plugins.moon.mu=0.5"])
    assert load_config(path, ["algorithm.plugins=[]"]).algorithm.plugins == ()


def test_config_errors_load_no_jax(tmp_path):
    """A bad config is refused before JAX is imported (what makes it take a fraction of a second: the time
    itself is not asserted here; a hang is caught by the subprocess's timeout)."""
    import subprocess
    import sys

    path = tmp_path / "c.yaml"
    path.write_text("dataset: {name: synthetic}\nmodel: {name: mlp}\nalgorithm: {name: fedavg}\n"
                    "client: {local_steps: 5}\n")
    code = ("import sys; from fedjax_lab.experiments.cli import main; "
            f"status = main(['run', {str(path)!r}, 'client.learning_rate=-1']); "
            "print(status, 'jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=120)
    assert out.stdout.split() == ["2", "False"], out
    assert "client.learning_rate: Input should be greater than 0" in out.stderr


@pytest.mark.parametrize("text, message", [
    ("dataset: {name: synthetic\nmodel: {name: mlp}\n", "is not valid YAML: line 2, column"),
    ("dataset:\n  name: synthetic\n   bad: 1\n", "is not valid YAML: line 3"),
])
def test_a_yaml_syntax_error_names_the_file_and_line(tmp_path, capsys, text, message):
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "broken.yaml" in err and message in err and "Traceback" not in err


def test_a_yaml_syntax_error_in_an_override_is_a_message(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("dataset: {name: synthetic}\nmodel: {name: mlp}\nalgorithm: {name: fedavg}\n"
                    "client: {local_steps: 5}\n")
    assert main(["run", str(path), "model.hidden=[16, 8"]) == 2
    assert "override 'model.hidden=[16, 8': the value is not valid YAML" in capsys.readouterr().err


def test_overrides_may_follow_options(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("dataset: {name: synthetic}\nmodel: {name: mlp}\nalgorithm: {name: fedavg}\n"
                    "client: {local_steps: 5}\n")
    # An invalid override placed after an option is parsed (and rejected by validation, not by argparse).
    assert main(["run", str(path), "--no-progress", "client.learning_rate=-1"]) == 2
    assert "client.learning_rate: Input should be greater than 0" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["file", "unwritable"])
def test_a_run_directory_that_cannot_hold_a_run_is_a_message(tmp_path, capsys, kind):
    import os

    path = tmp_path / "c.yaml"
    path.write_text("dataset: {name: synthetic}\nmodel: {name: mlp}\nalgorithm: {name: fedavg}\n"
                    "client: {local_steps: 5}\n")
    target = tmp_path / "target"
    if kind == "file":
        target.write_text("not a directory")
        expected = "is a file"
    else:
        target.mkdir()
        os.chmod(target, 0o500)
        expected = "cannot be written"
        if os.access(target, os.W_OK):  # root ignores permissions: use a path below a file instead
            target = tmp_path / "c.yaml" / "run"
    assert main(["run", str(path), "--run-dir", str(target)]) == 2
    err = capsys.readouterr().err
    assert ("is a file" in err or expected in err) and "Traceback" not in err


def test_independent_problems_are_reported_together():
    from fedjax_lab.experiments.config import ConfigError, validate

    raw = _with("client", learnin_rate=0.1)
    # a problem across sections, independent of the first
    raw.setdefault("rounds", {})["clients_per_round"] = 50
    raw["algorithm"] = {"name": "fedprox", "plugins": [{"name": "fedprox"}]}
    with pytest.raises(ConfigError) as caught:
        validate(raw)
    assert str(caught.value).splitlines()[1:] == [
        ("  client.learnin_rate: unknown key; did you mean 'learning_rate'? (allowed: batch_order, "
         "batch_size, drop_remainder, learning_rate, local_epochs, local_steps, momentum, optimizer, "
         "schedule, weight_decay)"),
        "  rounds.clients_per_round must be <= dataset.num_clients=30, got 50",
        "  algorithm.plugins: each method may appear once, got ['fedprox'] more than once"]


def test_a_problem_that_involves_a_wrong_field_is_not_reported_twice():
    from fedjax_lab.experiments.config import ConfigError, validate

    # its default (10) would not fit 5 clients: no made-up problem
    raw = _with("rounds", clients_per_round="many")
    raw["dataset"]["num_clients"] = 5
    with pytest.raises(ConfigError) as caught:
        validate(raw)
    assert len(str(caught.value).splitlines()) == 2 and \
        "rounds.clients_per_round: Input should be a valid integer" in str(caught.value)


def test_the_builder_names_no_method():
    """``experiments/`` (the builder: ``build.py``, ``algorithms.py``, ...) builds every method through the
    registry and the engine's round; it imports no method's package (a method declares what the builder needs,
    such as FedImpro's ``split``)."""
    import ast

    imported = set()
    for path in (Path(__file__).resolve().parents[1] / "fedjax_lab" / "experiments").glob("*.py"):
        tree = ast.parse(path.read_text())
        imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        imported |= {f"{node.module}.{a.name}" for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) for a in node.names}
    allowed = ("fedjax_lab.methods.registry", "fedjax_lab.methods.server_optimizers")
    methods = {m for m in imported if m.startswith("fedjax_lab.methods.") and not m.startswith(allowed)}
    assert not methods, methods


def test_each_method_is_a_folder_of_its_config_and_its_code():
    """Every package under ``methods/`` holds its config (``__init__.py``, importing no more than pydantic and
    the registry's mechanism) and its code (``method.py``, with ``build``), and registers what it holds."""
    import ast

    from fedjax_lab.methods import registry

    folders = [p for p in (Path(__file__).resolve().parents[1] / "fedjax_lab" / "methods").iterdir()
               if (p / "__init__.py").exists()]
    assert len(folders) >= 24
    registered = {spec.config.__module__.rsplit(".", 1)[-1] for spec in registry.REGISTRY.values()}
    for folder in folders:
        tree = ast.parse((folder / "__init__.py").read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert imported <= {"__future__", "typing", "pydantic",
                            "fedjax_lab.methods.registry"}, (folder, imported)

        code = ast.parse((folder / "method.py").read_text())
        assert "build" in {n.name for n in code.body if isinstance(n, ast.FunctionDef)}, folder
        assert folder.name in registered, folder


def test_methods_draw_keys_from_named_streams_not_numbers():
    """A method's randomness comes from ``randomness`` (``setup_key``, ``named_key``) or ``component_key``: no
    key made from a literal seed (outside ``jax.eval_shape``, where it only gives shapes) and no bare number
    folded into a context's or the run's key, whose collisions nothing would catch."""
    import ast

    found = []
    for path in sorted((Path(__file__).resolve().parents[1] / "fedjax_lab" / "methods").glob("*/method.py")):
        tree = ast.parse(path.read_text())
        shapes_only = {id(a) for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) ==
                       "jax.eval_shape" for a in ast.walk(n)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or id(node) in shapes_only:
                continue
            name = ast.unparse(node.func)
            if name == "jax.random.key" or (name == "jax.random.fold_in" and "context.key" in ast.unparse(
                    node.args[0]) and isinstance(node.args[1], ast.Constant)):
                found.append(f"{path.parent.name}:{node.lineno} {ast.unparse(node)}")
    assert not found, found


def test_no_method_factory_takes_more_than_six_positional_arguments():
    """Two swapped floats raise no error: past six arguments, a method's calls pass keywords."""
    import ast

    crowded = []
    for path in sorted((Path(__file__).resolve().parents[1] / "fedjax_lab" / "methods").glob("**/*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and len(node.args) > 6 and not isinstance(node.func, ast.Attribute):
                crowded.append(f"{path.parent.name}/{path.name}:{node.lineno} {ast.unparse(node.func)}")
    assert not crowded, crowded
