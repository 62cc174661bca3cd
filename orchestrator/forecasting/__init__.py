"""The forecast: what a job will make (sections, tokens, words, A5 pages) and how long it will take, before it runs.

model.py makes it (:func:`forecast`: an outline or a shape and the backends' step times -> :class:`Forecast`),
simulate.py is the fleet simulated request by request, lengths.py the reply lengths, pages.py the page model,
budget.py fits a shape to ``--pages`` / ``--minutes`` (:func:`fit_budget`), and probe.py says where the step
times come from (:func:`probe_fits`, :func:`fits_from_ladder`). Every calibration constant sits beside the data it
was fitted on.
"""

from .budget import fit_budget
from .model import Forecast, StepFit, forecast
from .probe import fits_from_ladder, probe_fits

__all__ = ["Forecast", "StepFit", "fit_budget", "fits_from_ladder", "forecast", "probe_fits"]
