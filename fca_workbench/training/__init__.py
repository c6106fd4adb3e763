"""Training: ``fca train`` (its settings, run folder, model card and the mini-audit every N steps) and
``FCACallback``, the same mini-audit inside a ``transformers.Trainer``.
"""
