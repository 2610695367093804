import keras
from keras import ops

from keras_mogrifier._export import register
from keras_mogrifier.optimizers.two_tailed_controller import TwoTailedController


@register
class TwoTailedAveragingOptimizer(keras.optimizers.Optimizer):
    """Wraps an optimizer and keeps the two running means of Two-Tailed Averaging.

    After every update of the wrapped optimizer, inside the same (compiled)
    train step, both running means of the weights are updated:

    ```
    S ← S + 1    θS ← θS + (θ - θS) / S
    L ← L + 1    θL ← θL + (θ - θL) / L
    ```

    The means, their lengths `S` and `L` (`short_count`, `long_count`) and
    the state of the switching rule (`controller_state`) are optimizer
    variables: they are saved with the model or a checkpoint and restored by
    `load_model`, `load_weights` or `DivergenceRecovery`. The decisions
    (switch, restart) are taken every `E` steps by the
    `keras_mogrifier.callbacks.TwoTailedAveraging` callback, which calls
    `switch`, `restart_short` and `restart` here. Without the callback the
    two means stay equal: a plain Polyak average from the first step.

    Everything else is delegated to the wrapped optimizer: learning rate
    (readable and settable), `iterations`, clipping, weight decay, EMA and
    gradient accumulation (the means then take one iterate per real update).
    Under `mixed_float16`, `model.compile` wraps this optimizer in
    `keras.optimizers.LossScaleOptimizer`; steps it skips for non-finite
    gradients add nothing to the means. Only trainable variables are
    averaged.

    Args:
        inner_optimizer: `keras.optimizers.Optimizer`. The optimizer that
            computes the steps. Must not be a `LossScaleOptimizer` (wrap the
            other way round).
        name: str or None. Name of the optimizer.

    Example:

    >>> import numpy as np
    >>> from keras_mogrifier.optimizers import RectifiedAdam
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    >>> optimizer = TwoTailedAveragingOptimizer(RectifiedAdam(1e-3))
    >>> model.compile(optimizer=optimizer, loss="mse")
    >>> history = model.fit(np.ones((8, 3)), np.zeros((8, 1)), epochs=3,
    ...                     batch_size=4, verbose=0)
    >>> int(optimizer.short_count.numpy()), int(optimizer.long_count.numpy())
    (6, 6)

    Reference:
        - [Melis, 2022](https://arxiv.org/abs/2209.12581), Two-Tailed
          Averaging: Anytime, Adaptive, Once-in-a-While Optimal Weight
          Averaging for Better Generalization.
    """

    def __init__(self, inner_optimizer, name=None):
        if not isinstance(inner_optimizer, keras.optimizers.Optimizer):
            raise ValueError(
                "Expected `inner_optimizer` to be a keras.optimizers.Optimizer. "
                f"Received: inner_optimizer={inner_optimizer!r}"
            )
        if isinstance(inner_optimizer, keras.optimizers.LossScaleOptimizer):
            raise ValueError(
                "Expected `inner_optimizer` not to be a LossScaleOptimizer: "
                "wrap the other way round, LossScaleOptimizer("
                "TwoTailedAveragingOptimizer(optimizer)) (which "
                "`model.compile` does by itself under mixed_float16). "
                f"Received: inner_optimizer={inner_optimizer!r}"
            )
        super().__init__(learning_rate=0.0, name=name)
        self.inner_optimizer = inner_optimizer

    def build(self, var_list):
        if self.built:
            return
        self.inner_optimizer.build(var_list)
        self.short_count = self.add_variable(
            shape=(), dtype="int", initializer="zeros", name="short_count"
        )
        self.long_count = self.add_variable(
            shape=(), dtype="int", initializer="zeros", name="long_count"
        )
        initial = TwoTailedController.initial_state()
        self.controller_state = self.add_variable(
            shape=(len(initial),),
            dtype="float32",
            initializer=lambda shape, dtype: ops.convert_to_tensor(
                initial, dtype=dtype
            ),
            name="controller_state",
        )
        self._short_averages, self._long_averages = self.add_optimizer_variables(
            var_list, ["short_average", "long_average"]
        )
        super().build(var_list)

    @property
    def variables(self):
        return self._variables + self.inner_optimizer.variables

    @property
    def learning_rate(self):
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate):
        self.inner_optimizer.learning_rate = learning_rate

    @property
    def iterations(self):
        return self.inner_optimizer.iterations

    def scale_loss(self, loss):
        return self.inner_optimizer.scale_loss(loss)

    def apply(self, grads, trainable_variables=None):
        if not self.built:
            if trainable_variables is None:
                raise ValueError(
                    "Expected `trainable_variables` on the first call to "
                    "`apply`, to build the optimizer. Received: "
                    "trainable_variables=None"
                )
            with keras.name_scope(self.name, caller=self):
                self.build(trainable_variables)
        # `iterations` counts real updates (with gradient accumulation, not
        # every call), so an iterate is averaged exactly when one was made.
        # (`+ 0` reads the value now; the variable itself would be read late.)
        before = ops.add(self.inner_optimizer.iterations, 0)
        self.inner_optimizer.apply(grads, trainable_variables)
        after = ops.add(self.inner_optimizer.iterations, 0)
        self._update_averages(ops.cast(ops.greater(after, before), "int32"))

    def _update_averages(self, took_step):
        short_count = self.short_count + ops.cast(took_step, self.short_count.dtype)
        long_count = self.long_count + ops.cast(took_step, self.long_count.dtype)
        self.short_count.assign(short_count)
        self.long_count.assign(long_count)
        for variable, short, long in zip(
            self._trainable_variables, self._short_averages, self._long_averages
        ):
            if short is None:
                continue
            dtype = variable.dtype
            took = ops.cast(took_step, dtype)
            for average, count in ((short, short_count), (long, long_count)):
                rate = took / ops.cast(ops.maximum(count, 1), dtype)
                average.assign(
                    ops.add(average, ops.multiply(variable - average, rate))
                )

    def average_variables(self, which):
        """The optimizer variables holding `θS` (`"short"`) or `θL` (`"long"`).

        Aligned with the trainable variables the optimizer was built on;
        `None` for variables it does not average.
        """
        if which == "short":
            return list(self._short_averages)
        if which == "long":
            return list(self._long_averages)
        raise ValueError(
            f'Expected `which` to be "short" or "long". Received: which={which!r}'
        )

    @property
    def averaged_model_variables(self):
        """The model variables, aligned with `average_variables(...)`."""
        return list(self._trainable_variables)

    def switch(self):
        """`θL ← θS`, `L ← S`, then the short average restarts (`S ← 0`)."""
        # Copies: on JAX, assigning a variable shares its (immutable) buffer,
        # and a train step that donates both variables' buffers then fails.
        for short, long in zip(self._short_averages, self._long_averages):
            if short is not None:
                long.assign(ops.copy(short))
        self.long_count.assign(ops.copy(self.short_count))
        self.short_count.assign(ops.zeros((), self.short_count.dtype))

    def restart_short(self):
        """`S ← 0`: the next iterate starts a new short average."""
        self.short_count.assign(ops.zeros((), self.short_count.dtype))

    def restart(self):
        """`S ← 0` and `L ← 0`: both averages start again."""
        self.restart_short()
        self.long_count.assign(ops.zeros((), self.long_count.dtype))

    def finalize_variable_values(self, var_list):
        # Which weights end up in the model is the callback's decision.
        self.inner_optimizer.finalize_variable_values(var_list)

    def get_config(self):
        return {
            "name": self.name,
            "inner_optimizer": keras.saving.serialize_keras_object(
                self.inner_optimizer
            ),
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(
            config.pop("inner_optimizer"), custom_objects=custom_objects
        )
        return cls(inner, **config)
