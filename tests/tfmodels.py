"""Keras models for the TensorFlow-source tests, generated at test time (run as a script: TensorFlow stays out of
pytest).

    python tests/tfmodels.py OUT_DIR [--seed N] [--only cnn]

writes, seeded, under OUT_DIR:
  cnn/            SavedModel (Keras model.export): Conv-BatchNorm-ReLU, DepthwiseConv-BatchNorm-ReLU6, GAP, Dense;
                  input `image` [None, 32, 32, 3] -> `output_0` [None, 10]; BatchNorm statistics as a trained model's
  cnn.keras       the same model as a Keras 3 file (input `image`, output layer `logits`)
  cnn.h5          the same model as a legacy HDF5 Keras file
  lstm/           SavedModel: a 2-layer LSTM over a fixed 50-step sequence, `sequence` [None, 50, 8] -> [None, 4]
  lstm.keras
  fixed/          SavedModel whose input has a fixed batch of 1 ([1, 32, 32, 3]): profiles cannot make it dynamic
  lgamma/         SavedModel using tf.math.lgamma, which tf2onnx cannot convert
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(out: Path, seed: int = 0, only: str | None = None) -> None:
    import keras
    import numpy as np
    import tensorflow as tf

    keras.utils.set_random_seed(seed)

    def cnn():
        image = keras.Input((32, 32, 3), name="image")
        x = keras.layers.Conv2D(16, 3, padding="same", use_bias=False)(image)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.ReLU()(x)
        x = keras.layers.DepthwiseConv2D(3, padding="same", use_bias=False)(x)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.ReLU(6.0)(x)
        x = keras.layers.GlobalAveragePooling2D()(x)
        model = keras.Model(image, keras.layers.Dense(10, name="logits")(x))
        rng = np.random.default_rng(seed)
        for layer in model.layers:  # statistics as training would leave them: the fold into the Conv is really tested
            if isinstance(layer, keras.layers.BatchNormalization):
                channels = layer.moving_mean.shape[0]
                layer.moving_mean.assign(rng.normal(0, 0.5, channels).astype("float32"))
                layer.moving_variance.assign(rng.uniform(0.5, 2.0, channels).astype("float32"))
                layer.gamma.assign(rng.uniform(0.5, 1.5, channels).astype("float32"))
                layer.beta.assign(rng.normal(0, 0.2, channels).astype("float32"))
        return model

    def lstm():
        sequence = keras.Input((50, 8), name="sequence")
        x = keras.layers.LSTM(32, return_sequences=True)(sequence)
        x = keras.layers.LSTM(32)(x)
        return keras.Model(sequence, keras.layers.Dense(4, name="scores")(x))

    for name, make in (("cnn", cnn), ("lstm", lstm)):
        if only in (None, name):
            model = make()
            model.export(str(out / name), verbose=False)
            model.save(str(out / f"{name}.keras"))
            if name == "cnn":
                model.save(str(out / "cnn.h5"))
    if only is not None:
        return
    fixed = cnn()  # Keras' export relaxes the batch axis to None: a signature of its own fixes it to 1

    class Fixed(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = fixed

        @tf.function(input_signature=[tf.TensorSpec([1, 32, 32, 3], tf.float32, name="image")])
        def __call__(self, image):
            return {"output_0": self.model(image, training=False)}

    module_fixed = Fixed()
    tf.saved_model.save(module_fixed, str(out / "fixed"), signatures={"serving_default": module_fixed.__call__})

    class Lgamma(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="x")])
        def __call__(self, x):
            return {"y": tf.math.lgamma(tf.abs(x) + 1.0)}

    module = Lgamma()
    tf.saved_model.save(module, str(out / "lgamma"), signatures={"serving_default": module.__call__})


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=["cnn", "lstm"])
    options = parser.parse_args()
    main(options.out, options.seed, options.only)
