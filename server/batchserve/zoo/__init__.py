"""Example models, trained here on data that ships with a package, exported through the CLI.

`make models` runs ``python -m batchserve.zoo``; needs the ``export`` extra (torch).
"""
