"""fedjax_lab: a federated-learning simulator written as pure JAX functions.

Subpackages: ``engine`` (the round loop and its pieces), ``methods`` (one algorithm per file), ``data``,
``models`` and ``experiments`` (configs, runs, plots, the command line).
"""

__version__ = "0.1.0"
