"""Every command and code block of the README runs as typed, on tiny settings: the runs' sizes are overridden
(``TINY``), the data-preparation command reads a small CIFAR-10 tarball in the official format made here, and
the error example's output must match the README's text exactly. The set-up block's ``venv``/``pip`` steps are
what CI itself runs on a fresh clone, and ``pytest`` is this suite; the rest of that block (the main job) runs
here."""

import contextlib
import io
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from fedjax_lab.experiments.cli import main

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
BLOCKS = re.findall(r"```(\w*)\n(.*?)```", README, flags=re.DOTALL)
TINY = {  # per config: the overrides that make its runs take seconds (replacing the README's value of a key)
    "configs/synthetic_fedavg.yaml": ["rounds.num_rounds=2", "eval.every=1", "client.local_epochs=1"],
    "configs/privacy/synthetic_dp_fedavg.yaml": ["rounds.num_rounds=2", "eval.every=1",
                                                "client.local_epochs=1", "dataset.num_clients=100",
                                                "rounds.clients_per_round=10", "privacy.delta=1e-3",
                                                "privacy.accountant=rdp"],  # PLDs take seconds each
    "configs/cifar10_fedavg.yaml": ["dataset.partition={name: iid, num_clients: 4}",
                                    "rounds.clients_per_round=2", "rounds.num_rounds=2", "eval.every=1",
                                    "client.local_epochs=1"],
}
# the Python blocks' sizes
SHORTER = {'["rounds.num_rounds=20"]': '["rounds.num_rounds=2", "client.local_epochs=1"]'}
SET_UP = ("python3 -m venv .venv", ".venv/bin/pip install", ".venv/bin/python -m pytest")


def commands(source: str) -> list[list[str]]:
    """The commands of a shell block: one per line (``&&`` chains split), comments dropped, the set-up steps
    CI runs left out, ``.venv/bin/`` prefixes removed."""
    out = []
    for line in source.splitlines():
        for part in line.split(" && "):
            part = part.strip()
            if part and not part.startswith("#") and not part.startswith(SET_UP):
                out.append(shlex.split(part.replace(".venv/bin/", ""), comments=True))
    return out


def tiny(args: list[str]) -> list[str]:
    """``fedjax-lab run|sweep CONFIG ...`` with its config's ``TINY`` overrides in place of the README's
    values."""
    if args[1] not in ("run", "sweep"):
        return args
    overrides = TINY[args[2]]  # a config the README runs must have its tiny settings here
    keys = {o.split("=", 1)[0] for o in overrides}
    kept = [a for a in args if "=" not in a or a.startswith("-") or a.split("=", 1)[0] not in keys]
    return kept + overrides


def run_command(args: list[str], source: Path) -> tuple[int, str]:
    if args[0] == "ls":
        return subprocess.run(args, check=False, capture_output=True, text=True).returncode, ""
    assert args[0] == "fedjax-lab", f"the README runs {args[0]!r}: teach this test to run it"
    args = [str(source) if a == str(Path("~/Downloads").expanduser()) or a == "~/Downloads" else a
            for a in args]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        status = main(tiny(args)[1:])
    return status, out.getvalue()


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A fresh folder with the repository's configs, as after a clone; a CIFAR-10 tarball in the official
    layout stands for the user's download."""
    from test_data_prepare import cifar10_tarball, official

    monkeypatch.setenv("FEDJAX_LAB_CACHE", str(tmp_path / "cache"))
    (tmp_path / "configs").symlink_to(REPO / "configs")
    downloads = tmp_path / "Downloads"
    downloads.mkdir()
    cifar10_tarball(downloads / "cifar-10-python.tar.gz", train_per_batch=40)
    official(monkeypatch, "cifar10", downloads)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_every_readme_block_runs_as_typed(workdir):
    ran = 0
    namespace: dict = {}
    for language, source in BLOCKS:
        if language == "bash":
            for args in commands(source):
                status, output = run_command(args, workdir / "Downloads")
                assert status == 0, f"{shlex.join(args)} exited {status}:\n{output[-2000:]}"
                ran += 1
        elif language == "console":
            command, *expected = source.rstrip("\n").split("\n")
            assert command.startswith("$ ")
            status, output = run_command(shlex.split(command[2:]), workdir / "Downloads")
            assert status == 2 and output.rstrip("\n").split("\n") == expected
            ran += 1
        elif language == "python":
            for long, short in SHORTER.items():
                source = source.replace(long, short)
            exec(source, namespace)  # noqa: S102 (running the README's code is the test)
            ran += 1
    assert ran >= 12 and all(long in README for long in SHORTER)
    assert ((workdir / "fedavg_vs_fedprox.png").is_file()
            and (workdir / "runs" / "demo" / "summary.json").is_file())
    assert (workdir / "data" / "cifar10" / "cifar10_webp_lossless.npz").is_file()


def test_the_readme_is_short_and_links_what_it_used_to_hold():
    assert len(README.splitlines()) <= 165
    for page in ("docs/configs.md", "docs/methods.md", "docs/metrics.md", "docs/reliability.md",
                 "docs/sweeps.md", "docs/data.md", "docs/benchmarks.md", "docs/scale.md", "docs/extending.md",
                 "docs/reproductions/README.md", "docs/reproductions/running.md"):
        assert f"]({page}" in README and (REPO / page).is_file(), page
    for link in re.findall(r"\]\(([^)#]+)", README):
        assert link.startswith("http") or (REPO / link).exists(), f"broken link {link}"
