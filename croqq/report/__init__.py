"""`croqq report`: a self-contained HTML report of a results repo, built from the repo alone.

``model`` reads the branch tip into a small model, ``sweeps`` finds the manifest's sweep lines,
``duty`` bins the GPU step intervals, ``plots`` draws (matplotlib, Agg), ``sections`` decides what each
section shows, ``html`` writes the page, ``progress`` reports on stderr, ``build`` checks the input and
publishes the page atomically.
"""
