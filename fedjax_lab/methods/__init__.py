"""FL methods, one package each: ``<name>/__init__.py`` holds the method's config with its paper's defaults,
``<name>/method.py`` the components it adds to the FedAvg round (or a plug-in wrapping any method) and its
builder. :mod:`fedjax_lab.methods.registry` finds and registers them all.

Importing this package, the registry or a method's package imports no JAX (configs validate without it); a
method's names load its ``method.py`` on first use, e.g. ``from fedjax_lab.methods.fedavg import fedavg``.
"""
