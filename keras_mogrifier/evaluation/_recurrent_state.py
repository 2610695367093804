"""Finding, saving, resetting and restoring a model's recurrent state.

The protocol (documented in docs/dynamic-evaluation.md): a model's recurrent
state variables are

- `layer.states` of every `keras.layers.RNN` sub-layer built with
  `stateful=True`, whose leading axis must equal the batch size; and
- the list `recurrent_state_variables` of the model or of any sub-layer that
  has that attribute, whose leading axis is a capacity: a call with a smaller
  batch `b` uses and updates the first `b` rows.

A model with neither starts every call from a zero state.
"""

import keras
from keras import ops


def _layers(model):
    if hasattr(model, "_flatten_layers"):
        return list(model._flatten_layers(include_self=True, recursive=True))
    return [model]


def find_state_variables(model):
    """Returns `(exact, capacity)`: two lists of state variables, no repeats."""
    seen = set()
    exact, capacity = [], []

    def add(variables, into):
        for v in variables or []:
            if id(v) not in seen:
                seen.add(id(v))
                into.append(v)

    for layer in _layers(model):
        if isinstance(layer, keras.layers.RNN) and layer.stateful and layer.states:
            add(keras.tree.flatten(layer.states), exact)
        add(getattr(layer, "recurrent_state_variables", None), capacity)
    return exact, capacity


def state_variables(model):
    exact, capacity = find_state_variables(model)
    return exact + capacity


def batch_size_error(model, batch_size, subject="`batch_size`"):
    """A message when `batch_size` streams cannot run through `model`, else None.

    `subject` names what is checked in the message, e.g. "`batch_size`".
    """
    exact, capacity = find_state_variables(model)
    for v in exact:
        if v.shape[0] != batch_size:
            return (
                f"Expected {subject} to equal the batch size of the model's "
                f"stateful recurrent layers ({v.shape[0]}, state {v.path!r}); "
                "a stateful `keras.layers.RNN` only runs at the batch size it "
                f"was built with. Received: {batch_size}"
            )
    for v in capacity:
        if v.shape[0] < batch_size:
            return (
                f"Expected {subject} to be at most the capacity of the "
                f"model's recurrent state ({v.shape[0]}, state {v.path!r}). "
                f"Received: {batch_size}"
            )
    return None


def snapshot(variables):
    """Copies of the current values (exact)."""
    return [ops.copy(v.value) for v in variables]


def assign(variables, values):
    for v, value in zip(variables, values):
        v.assign(value)


def reset(variables):
    for v in variables:
        v.assign(ops.zeros(v.shape, v.dtype))
