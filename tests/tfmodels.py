"""Keras models for the TensorFlow-source tests, generated at test time (run as a script: TensorFlow stays out of pytest).

    python tests/tfmodels.py OUT_DIR

writes, seeded, under OUT_DIR:
  cnn/            SavedModel (Keras model.export): Conv-BatchNorm-ReLU, DepthwiseConv-BatchNorm-ReLU6, GAP, Dense;
                  input `image` [None, 32, 32, 3] -> `output_0` [None, 10]; BatchNorm statistics as a trained model's
  cnn.keras       the same model as a Keras 3 file (input `image`, output layer `logits`)
  lstm/           SavedModel: a 2-layer LSTM over a fixed 50-step sequence, `sequence` [None, 50, 8] -> [None, 4]
  lstm.keras
  fixed/          SavedModel whose input has a fixed batch of 1 ([1, 32, 32, 3]): profiles cannot make it dynamic
  lgamma/         SavedModel using tf.math.lgamma, which tf2onnx cannot convert
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(out: Path) -> None:
    import keras
    import numpy as np
    import tensorflow as tf

    keras.utils.set_random_seed(0)

    def cnn(batch=None):
        image = keras.Input((32, 32, 3), batch_size=batch, name="image")
        x = keras.layers.Conv2D(16, 3, padding="same", use_bias=False)(image)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.ReLU()(x)
        x = keras.layers.DepthwiseConv2D(3, padding="same", use_bias=False)(x)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.ReLU(6.0)(x)
        x = keras.layers.GlobalAveragePooling2D()(x)
        model = keras.Model(image, keras.layers.Dense(10, name="logits")(x))
        rng = np.random.default_rng(0)
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

    for name, model in (("cnn", cnn()), ("lstm", lstm())):
        model.export(str(out / name), verbose=False)
        model.save(str(out / f"{name}.keras"))
    cnn(batch=1).export(str(out / "fixed"), verbose=False)

    class Lgamma(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="x")])
        def __call__(self, x):
            return {"y": tf.math.lgamma(tf.abs(x) + 1.0)}

    module = Lgamma()
    tf.saved_model.save(module, str(out / "lgamma"), signatures={"serving_default": module.__call__})


if __name__ == "__main__":
    main(Path(sys.argv[1]))
