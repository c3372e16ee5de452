"""FL methods, one per file, each the components it adds to the FedAvg round (or a plug-in wrapping any method),
registered with its config in :mod:`fedjax_lab.methods.registry`.

Importing this package imports no JAX (the registry validates configs without it); import the method modules
themselves, e.g. ``from fedjax_lab.methods.fedavg import fedavg``.
"""
