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


class HostPadding:
    """Pads a loop's sequences on the host to one capacity per loop.

    A compiled loop over the leading axis of its sequences runs one
    program for calls of any length when the sequences it receives all have
    the same leading size: `pad(sequences)` returns the call's own length
    and the sequences padded with zeros to the capacity — the next power of
    two of the longest call so far, never shrinking — and `cut(outputs,
    length)` drops the padded entries of outputs stacked along the leading
    axis (on the host, as NumPy arrays, when there are any). Padding on the
    device would compile an operation for every length. The JAX and
    TensorFlow backends' loops share it; what runs on the padded entries is
    each loop's own business (JAX's never computes on them, TensorFlow's
    reads a mask).
    """

    def __init__(self):
        self.capacity = 0

    def pad(self, sequences):
        length = int(sequences[0].shape[0])
        self.capacity = max(self.capacity, 1 << max(0, length - 1).bit_length())
        if length == self.capacity:
            return length, list(sequences)
        arrays = [np.asarray(s) for s in sequences]
        return length, [
            np.concatenate([a, np.zeros((self.capacity - length,) + a.shape[1:], a.dtype)])
            for a in arrays
        ]

    def cut(self, outputs, length):
        if length >= self.capacity:
            return outputs
        return keras.tree.map_structure(lambda o: np.asarray(o)[:length], outputs)
