"""The error a search raises when none of its trials completed."""


class SearchFailedError(RuntimeError):
    """No trial of a search completed.

    Raised by `run_language_model_search`, `run_dynamic_evaluation_search` and
    `DynamicEvaluationTuner.search` when every trial failed (or KerasTuner
    gave up after too many failures in a row). The message is the search's
    summary: how many trials ran, why each failed, and what to try; the
    scripts in `tuning/` print it and exit with status 1.

    Attributes:
        summary: str. The same text as the message.
        rows: list of dict. `trial_rows(tuner)`: every trial's status,
            values and error.
    """

    def __init__(self, summary, rows=()):
        super().__init__(summary)
        self.summary = summary
        self.rows = list(rows)
