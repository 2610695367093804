"""What the backend modules share: every variable a model call may assign."""

import keras


def model_state(model):
    """`model.variables` and the states of stateful `keras.layers.RNN` layers.

    Keras creates a stateful RNN's state variables untracked, so they are not
    among `model.variables`; a call assigns them all the same.
    """
    variables = list(model.variables)
    seen = {id(v) for v in variables}
    for layer in model._flatten_layers(include_self=True, recursive=True):
        if isinstance(layer, keras.layers.RNN) and layer.stateful and layer.states:
            for v in keras.tree.flatten(layer.states):
                if id(v) not in seen:
                    seen.add(id(v))
                    variables.append(v)
    return variables
