"""The notebooks' side: ``fca reproduce`` (every paper notebook through papermill, and a researcher's own), the
``NotebookRun`` every notebook builds, the execution of one notebook, ``tables``, the notebooks' facade, and
``explore_view``, the explorer notebook's view without widgets.
"""
