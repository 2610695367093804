import math
import numbers

import keras
from keras import ops

from keras_mogrifier import _validation
from keras_mogrifier._export import register

# Below this value of x = t·(-ln β₂) the rectification term uses a power
# series; above it the closed form has no cancellation worth mentioning.
_SERIES_LIMIT = 0.5


@register
class RectifiedAdam(keras.optimizers.Optimizer):
    """Rectified Adam (RAdam), as `torch.optim.RAdam` defines it.

    Adam's adaptive step has a large variance in the first steps, when the
    second-moment estimate `v` averages only a few squared gradients. RAdam
    measures the length of that average with the approximated simple moving
    average length `ρ_t` and, while it is too short, takes the un-adapted
    (momentum-SGD) step instead; afterwards it scales the adaptive step by the
    rectification term `r_t`:

    ```
    m_t = β₁ m + (1 - β₁) g                 v_t = β₂ v + (1 - β₂) g²
    m̂_t = m_t / (1 - β₁ᵗ)
    ρ∞  = 2 / (1 - β₂) - 1                  ρ_t = ρ∞ - 2 t β₂ᵗ / (1 - β₂ᵗ)
    if ρ_t > 5:
        r_t = sqrt((ρ_t - 4)(ρ_t - 2) ρ∞ / ((ρ∞ - 4)(ρ∞ - 2) ρ_t))
        θ  -= lr · m̂_t · r_t · sqrt(1 - β₂ᵗ) / (sqrt(v_t) + ε)
    else:
        θ  -= lr · m̂_t
    ```

    The two branches are selected with `ops.where`, so the step compiles
    (`jit_compile=True`, XLA) and has no data-dependent control flow. For
    `β₂` near 1 the textbook `ρ_t` subtracts two numbers close to `ρ∞`
    (≈ 2000 for `β₂ = 0.999`) and loses three to four digits in float32,
    enough to misplace the switch at `ρ_t = 5`. Here `ρ_t` is computed as
    `c + (2/a) · (1 - x / expm1(x))` with `a = -ln β₂`, `x = t·a` and a
    float64 constant `c = 2/(1-β₂) - 2/a - 1`, using a power series of
    `1 - x/expm1(x)` for small `x`; the bias corrections use `expm1` too.
    The result matches float64 to float32 precision at every step.

    Weight decay: with `decoupled_weight_decay=True` (the default, the
    convention of every Keras optimizer and of `keras.optimizers.AdamW`)
    `θ ← θ - lr · weight_decay · θ` before the step, which is
    `torch.optim.RAdam(..., decoupled_weight_decay=True)`. With
    `decoupled_weight_decay=False`, `weight_decay · θ` is added to the
    gradient (after clipping) as an L2 penalty, which is torch's default.
    `exclude_from_weight_decay` works for both.

    All base options work as in `keras.optimizers.Adam`: `clipnorm`,
    `clipvalue`, `global_clipnorm`, `use_ema`, `loss_scale_factor`,
    `gradient_accumulation_steps`. Under `mixed_float16`, `model.compile`
    wraps the optimizer in `keras.optimizers.LossScaleOptimizer` as usual.

    Args:
        learning_rate: float, `keras.optimizers.schedules.LearningRateSchedule`
            or callable. The learning rate `lr`; a float must be finite and
            non-negative. Defaults to `0.001`.
        beta_1: float in [0, 1). Decay rate of the first moment. Defaults to
            `0.9`.
        beta_2: float in [0, 1). Decay rate of the second moment. With
            `beta_2 <= 2/3`, `ρ∞ <= 5` and every step is un-adapted.
            Defaults to `0.999`.
        epsilon: float > 0. Added to `sqrt(v_t)` (outside the square root,
            as in torch); with 0, a weight whose gradients have all been 0
            (an embedding row no batch used) would become NaN. Defaults to `1e-8` (torch's default, not Keras's
            `1e-7`).
        decoupled_weight_decay: bool. See above. Defaults to `True`.
        weight_decay: float or None. Weight decay coefficient. Defaults to
            `None` (no decay).
        clipnorm: float or None. Clip each gradient to this norm.
        clipvalue: float or None. Clip each gradient element to
            `[-clipvalue, clipvalue]`.
        global_clipnorm: float or None. Clip all gradients jointly to this
            global norm (the Mogrifier paper uses 10).
        use_ema: bool. Keep an exponential moving average of the weights,
            as in every Keras optimizer. Defaults to `False`.
        ema_momentum: float. EMA momentum. Defaults to `0.99`.
        ema_overwrite_frequency: int or None. See `keras.optimizers.Adam`.
        loss_scale_factor: float or None. Static loss scale.
        gradient_accumulation_steps: int or None. Average gradients over this
            many batches before each update; `t` counts updates.
        name: str or None. Name of the optimizer.

    Example:

    >>> import numpy as np
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    >>> model.compile(
    ...     optimizer=RectifiedAdam(learning_rate=1e-3, global_clipnorm=10.0),
    ...     loss="mse",
    ... )
    >>> x, y = np.ones((8, 3)), np.zeros((8, 1))
    >>> history = model.fit(x, y, epochs=2, verbose=0)
    >>> int(model.optimizer.iterations.numpy())
    2

    Reference:
        - [Liu et al., 2020](https://arxiv.org/abs/1908.03265), On the
          Variance of the Adaptive Learning Rate and Beyond.
        - `torch.optim.RAdam` (the definition followed here).
    """

    def __init__(
        self,
        learning_rate=0.001,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-8,
        decoupled_weight_decay=True,
        weight_decay=None,
        clipnorm=None,
        clipvalue=None,
        global_clipnorm=None,
        use_ema=False,
        ema_momentum=0.99,
        ema_overwrite_frequency=None,
        loss_scale_factor=None,
        gradient_accumulation_steps=None,
        name=None,
        **kwargs,
    ):
        if isinstance(learning_rate, numbers.Real):
            # A schedule or a callable is checked by Keras (or not at all).
            learning_rate = _validation.non_negative_float(
                "learning_rate", learning_rate
            )
        beta_1 = _validation.rate("beta_1", beta_1)
        beta_2 = _validation.rate("beta_2", beta_2)
        # ε = 0 divides 0 by 0 for a weight whose gradients have all been 0
        # so far (an embedding row no batch used), which is NaN.
        epsilon = _validation.positive_float("epsilon", epsilon)
        if not isinstance(decoupled_weight_decay, bool):
            raise ValueError(
                "Expected `decoupled_weight_decay` to be a bool. Received: "
                f"decoupled_weight_decay={decoupled_weight_decay!r}"
            )
        if weight_decay is not None:
            weight_decay = _validation.non_negative_float(
                "weight_decay", weight_decay
            )
        super().__init__(
            learning_rate=learning_rate,
            name=name,
            weight_decay=weight_decay,
            clipnorm=clipnorm,
            clipvalue=clipvalue,
            global_clipnorm=global_clipnorm,
            use_ema=use_ema,
            ema_momentum=ema_momentum,
            ema_overwrite_frequency=ema_overwrite_frequency,
            loss_scale_factor=loss_scale_factor,
            gradient_accumulation_steps=gradient_accumulation_steps,
            **kwargs,
        )
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.decoupled_weight_decay = decoupled_weight_decay

        # Step-independent constants, in float64 Python arithmetic.
        self._rho_inf = 2.0 / (1.0 - beta_2) - 1.0
        self._can_rectify = self._rho_inf > 5.0
        if self._can_rectify:
            a = -math.log(beta_2)
            self._log_beta_2 = a
            self._two_over_log = 2.0 / a
            self._rho_offset = 2.0 / (1.0 - beta_2) - 2.0 / a - 1.0
            self._rect_scale = self._rho_inf / (
                (self._rho_inf - 4.0) * (self._rho_inf - 2.0)
            )
        self._log_beta_1 = math.log(beta_1) if beta_1 > 0.0 else None

    def build(self, var_list):
        if self.built:
            return
        super().build(var_list)
        self._momentums, self._velocities = self.add_optimizer_variables(
            var_list, ["momentum", "velocity"]
        )

    def _step_constants(self, step):
        """Per-step scalars, in float32: `(1 - β₁ᵗ, sqrt(1 - β₂ᵗ), ρ_t, r_t)`.

        `step` is the 1-based step `t` as a float32 tensor. Without
        rectification (`ρ∞ <= 5`) `ρ_t` and `r_t` are returned as `None`.
        """
        if self._log_beta_1 is None:
            bias_correction_1 = ops.ones_like(step)
        else:
            bias_correction_1 = -ops.expm1(step * self._log_beta_1)
        if not self._can_rectify:
            return bias_correction_1, None, None, None
        x = step * self._log_beta_2
        bias_correction_2 = -ops.expm1(-x)
        # g(x) = 1 - x / expm1(x) = x/2 - x²/12 + x⁴/720 - x⁶/30240 + x⁸/1209600
        # (the Bernoulli series); truncation error < 1e-10 relative at x = 0.5.
        xs = ops.minimum(x, _SERIES_LIMIT)
        x2 = xs * xs
        series = xs * 0.5 - x2 * (
            1.0 / 12.0
            - x2 * (1.0 / 720.0 - x2 * (1.0 / 30240.0 - x2 / 1209600.0))
        )
        # The closed form, kept finite where the series is used.
        xc = ops.maximum(x, _SERIES_LIMIT)
        closed = 1.0 - xc / ops.expm1(xc)
        g = ops.where(x < _SERIES_LIMIT, series, closed)
        rho = self._rho_offset + self._two_over_log * g
        # r_t is only used where ρ_t > 5; clamp so the other branch is finite.
        rho_safe = ops.maximum(rho, 5.0)
        rect = ops.sqrt(
            (rho_safe - 4.0) * (rho_safe - 2.0) / rho_safe * self._rect_scale
        )
        return bias_correction_1, ops.sqrt(bias_correction_2), rho, rect

    def update_step(self, gradient, variable, learning_rate):
        dtype = variable.dtype
        lr = ops.cast(learning_rate, dtype)
        gradient = ops.cast(gradient, dtype)
        if hasattr(gradient, "indices"):
            # Sparse slices (TensorFlow's embedding gradients) may repeat a
            # row; densify so that repeated rows are summed before squaring.
            gradient = ops.add(ops.zeros(variable.shape, dtype), gradient)
        if (
            not self.decoupled_weight_decay
            and self.weight_decay
            and self._use_weight_decay(variable)
        ):
            gradient = ops.add(
                gradient, ops.multiply(variable, ops.cast(self.weight_decay, dtype))
            )
        step = ops.cast(self.iterations + 1, "float32")
        bc1, sqrt_bc2, rho, rect = self._step_constants(step)

        index = self._get_variable_index(variable)
        m = self._momentums[index]
        v = self._velocities[index]
        self.assign_add(m, ops.multiply(ops.subtract(gradient, m), 1 - self.beta_1))
        self.assign_add(
            v, ops.multiply(ops.subtract(ops.square(gradient), v), 1 - self.beta_2)
        )
        step_size = lr / ops.cast(bc1, dtype)
        if rho is None:
            self.assign_sub(variable, ops.multiply(m, step_size))
            return
        # Branch-free: scale = a / (sqrt(v) + ε) + b with the scalars
        # (a, b) = (r_t sqrt(1 - β₂ᵗ), 0) if ρ_t > 5 else (0, 1).
        rectified = rho > 5.0
        a = ops.cast(ops.where(rectified, rect * sqrt_bc2, 0.0), dtype)
        b = ops.cast(ops.where(rectified, 0.0, 1.0), dtype)
        denominator = ops.add(ops.sqrt(v), ops.cast(self.epsilon, dtype))
        scale = ops.add(ops.divide(a, denominator), b)
        self.assign_sub(variable, ops.multiply(ops.multiply(m, step_size), scale))

    def _apply_weight_decay(self, variables):
        # The coupled (L2) form is added to the gradient in `update_step`.
        if self.decoupled_weight_decay:
            super()._apply_weight_decay(variables)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "beta_1": self.beta_1,
                "beta_2": self.beta_2,
                "epsilon": self.epsilon,
                "decoupled_weight_decay": self.decoupled_weight_decay,
            }
        )
        return config

