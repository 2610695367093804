"""Saving of `LanguageModel`: the weights manifest checked on load."""

import json

import numpy as np
from keras import ops

# The key under which a saved model records the paths and shapes of its
# weights, checked on load (a config that does not match its weights).
_MANIFEST_KEY = "weights_manifest"


class SavingMixin:
    """A saved model records its weights' paths; loading checks them first."""

    def _weights_manifest(self):
        """`[[path, shape], ...]` of every weight but the carried state."""
        states = {id(v) for v in getattr(self, "recurrent_state_variables", [])}
        return sorted(
            [_local_path(v), [int(d) for d in v.shape]]
            for v in self.weights
            if id(v) not in states
        )

    def save_own_variables(self, store):
        super().save_own_variables(store)
        # The weights this config makes, so that loading them into a model
        # of another config is refused rather than half done.
        store[_MANIFEST_KEY] = np.frombuffer(
            json.dumps(self._weights_manifest()).encode("utf-8"), dtype=np.uint8
        )

    def load_weights(self, filepath, *args, **kwargs):
        # Keras goes on loading the other layers after one fails and raises
        # at the end: the model's weights (and state) are put back then.
        saved = [ops.copy(v.value) for v in self.variables]
        try:
            return super().load_weights(filepath, *args, **kwargs)
        except BaseException:
            for variable, value in zip(self.variables, saved):
                variable.assign(value)
            raise

    def load_own_variables(self, store):
        # Runs before any sub-layer is loaded: a refusal changes nothing.
        keys = list(store.keys())
        if _MANIFEST_KEY in keys:
            saved = json.loads(
                bytes(np.asarray(store[_MANIFEST_KEY], dtype=np.uint8)).decode("utf-8")
            )
            mine = self._weights_manifest()
            if saved != mine:
                saved_shapes = {path: shape for path, shape in saved}
                my_shapes = {path: shape for path, shape in mine}
                missing = sorted(set(saved_shapes) - set(my_shapes))
                extra = sorted(set(my_shapes) - set(saved_shapes))
                reshaped = sorted(
                    f"{p} {saved_shapes[p]} → {my_shapes[p]}"
                    for p in set(saved_shapes) & set(my_shapes)
                    if saved_shapes[p] != my_shapes[p]
                )
                raise ValueError(
                    "Expected the saved weights to be those of this model's "
                    "configuration (was the config edited, or the weights "
                    "saved from another model?). Received: weights this "
                    f"config has no place for: {missing[:8]}; weights it "
                    f"needs that were not saved: {extra[:8]}; other shapes: "
                    f"{reshaped[:8]}"
                )
            store = {key: store[key] for key in keys if key != _MANIFEST_KEY}
        super().load_own_variables(store)


def _local_path(variable):
    # Drop the model's own name, keep the path inside it.
    return variable.path.split("/", 1)[-1]
