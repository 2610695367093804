"""What the backend modules share besides `model_state`."""

import contextlib

import keras
import numpy as np
from keras import ops


@contextlib.contextmanager
def patched(obj, name, replacement):
    """`obj.name` is `replacement` within the block (an instance attribute)."""
    had = name in vars(obj)
    previous = vars(obj).get(name)
    setattr(obj, name, replacement)
    try:
        yield
    finally:
        if had:
            setattr(obj, name, previous)
        else:
            delattr(obj, name)


def all_finite(gradients):
    """A scalar bool tensor: every element of every gradient is finite."""
    checks = [ops.all(ops.isfinite(g)) for g in gradients if g is not None]
    if not checks:
        return ops.convert_to_tensor(True)
    return ops.all(ops.stack(checks))


def trainer_variables(model):
    """Every variable a Keras trainer carries: model, optimizer, metrics."""
    variables, seen = [], set()
    optimizer = getattr(model, "optimizer", None)
    groups = [model.variables, getattr(model, "metrics_variables", [])]
    if isinstance(optimizer, keras.optimizers.Optimizer) and optimizer.built:
        groups.append(optimizer.variables)
    for group in groups:
        for v in group:
            if id(v) not in seen:
                seen.add(id(v))
                variables.append(v)
    return variables


def check_dataset_on_host(dataset, check):
    """`dataset` (a `tf.data.Dataset`) with `check(index, element)` on each element.

    `check` runs on the host, in the input pipeline (`tf.numpy_function`),
    with the element's NumPy values and its index in the epoch, before the
    element reaches the training loop; what it raises stops the iteration
    there. tf.data is TensorFlow's whatever the Keras backend, so every
    backend module uses this one implementation; TensorFlow is imported
    only when it is called (a `tf.data.Dataset` exists, so it is there).
    Elements holding sparse or ragged tensors pass unchecked.
    """
    import tensorflow as tf

    def checked(index, element):
        flat = tf.nest.flatten(element)
        if not all(isinstance(t, tf.Tensor) for t in flat):
            return element

        def run(index, *values):
            check(int(index), tf.nest.pack_sequence_as(element, list(values)))
            return np.True_

        done = tf.numpy_function(run, [index, *flat], Tout=tf.bool, stateful=True)
        with tf.control_dependencies([done]):
            flat = [tf.identity(t) for t in flat]
        return tf.nest.pack_sequence_as(element, flat)

    return dataset.enumerate().map(checked)
