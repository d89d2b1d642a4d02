"""The one array type every layer passes around: a model as a list of numpy arrays, in the
order of the model's parameters (and so of every model-shaped state and upload)."""

import numpy as np

Weights = list[np.ndarray]
