"""The notebooks' side: ``fca reproduce`` (every paper notebook through papermill), the ``NotebookRun`` every
notebook builds, the execution of one notebook, and ``tables``, the notebooks' facade.
"""
