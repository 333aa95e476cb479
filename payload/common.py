"""What the payload's two ways of training share: the synthetic data and the data from
TFDEPLOY_DATA_DIR, the model, the JSON event lines the launcher reads, TensorBoard scalars,
and where a model is saved. train.py (MultiWorkerMirroredStrategy) and ps.py
(ParameterServerStrategy) both build on it.
"""
import glob
import json
import os
import shutil
import time

# Before TensorFlow is imported: its C++ INFO/WARNING chatter would bury the useful logs.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Keras 3 cannot run model.fit under MultiWorkerMirroredStrategy; tf_keras (Keras 2) can.
# The switch makes tf.keras mean tf_keras too, so nothing inside TF picks up Keras 3.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

SEED = 1234
NUM_SAMPLES = 4096
NUM_FEATURES_A = 12
NUM_FEATURES_B = 8
NUM_CLASSES = 4


def emit(event, task, **fields):
    """One JSON line on stdout, flushed at once: the launcher reads it live."""
    print(json.dumps({"event": event, "task": task, **fields}), flush=True)


def cluster_spec(environ=None):
    """The "cluster" part of TF_CONFIG, {} when TF_CONFIG is absent or names none."""
    environ = os.environ if environ is None else environ
    return json.loads(environ.get("TF_CONFIG") or "{}").get("cluster") or {}


def task_info(environ=None):
    """(task_type, task_index, number of training workers, is_chief) from TF_CONFIG.

    Without TF_CONFIG (or with one naming no cluster) this is a lone worker: ("worker", 0,
    1, True). The chief is the "chief" task, or worker 0 when the cluster has no chief.
    """
    environ = os.environ if environ is None else environ
    cluster = cluster_spec(environ)
    if not cluster:
        return "worker", 0, 1, True
    task = json.loads(environ["TF_CONFIG"]).get("task") or {}
    task_type = task.get("type", "worker")
    index = int(task.get("index", 0))
    if task_type not in ("chief", "worker"):
        raise SystemExit("train.py: task type %r does not train (only chief/worker)"
                         % task_type)
    workers = len(cluster.get("chief", [])) + len(cluster.get("worker", []))
    if "chief" in cluster:
        is_chief = task_type == "chief"
    else:
        is_chief = task_type == "worker" and index == 0
    return task_type, index, workers, is_chief


def synthetic_data():
    """Deterministic features and labels: every worker builds exactly the same arrays.

    Labels come from a fixed random "teacher" network, so there is something to learn
    and the label depends on both feature groups (which matters for --multi-input).
    """
    rng = np.random.default_rng(SEED)
    x = rng.standard_normal((NUM_SAMPLES, NUM_FEATURES_A + NUM_FEATURES_B)).astype("float32")
    w1 = rng.standard_normal((x.shape[1], 16)).astype("float32")
    w2 = rng.standard_normal((16, NUM_CLASSES)).astype("float32")
    y = np.argmax(np.tanh(x @ w1) @ w2, axis=1).astype("int64")
    return x, y


def load_data_dir(path, num_classes):
    """(x, y, file names) from every *.npz below `path` (sorted by name), or None when it holds
    none. Each file has `x` (examples x features) and `y` (one integer label per example)."""
    names = sorted(os.path.relpath(p, path)
                   for p in glob.glob(os.path.join(path, "**", "*.npz"), recursive=True))
    if not names:
        return None
    xs, ys = [], []
    for name in names:
        with np.load(os.path.join(path, name)) as arrays:
            if "x" not in arrays or "y" not in arrays:
                raise SystemExit("train.py: %s in %s needs arrays x and y (has %s)"
                                 % (name, path, ", ".join(arrays.files)))
            x, y = arrays["x"], arrays["y"]
        if x.ndim != 2 or y.ndim != 1 or len(x) != len(y):
            raise SystemExit("train.py: %s: x must be examples x features and y one label per "
                             "example (x %s, y %s)" % (name, x.shape, y.shape))
        if xs and x.shape[1] != xs[0].shape[1]:
            raise SystemExit("train.py: %s has %d features, %s has %d"
                             % (name, x.shape[1], names[0], xs[0].shape[1]))
        if len(y) and (y.min() < 0 or y.max() >= num_classes):
            raise SystemExit("train.py: %s: labels must be in [0, %d) (--num-classes), found "
                             "%d..%d" % (name, num_classes, y.min(), y.max()))
        xs.append(x.astype("float32"))
        ys.append(y.astype("int64"))
    x, y = np.concatenate(xs), np.concatenate(ys)
    if len(y) == 0:
        raise SystemExit("train.py: the *.npz files in %s hold no examples" % path)
    return x, y, names


def split_features(x):
    """The two inputs of --multi-input: the first 3/5 of the columns and the rest
    (NUM_FEATURES_A and NUM_FEATURES_B for the synthetic data)."""
    cut = max(1, x.shape[1] * 3 // 5)
    return x[:, :cut], x[:, cut:]


def make_dataset(global_batch, multi_input, data=None):
    """Infinite, batched dataset of the *global* batch size; the strategy splits each
    global batch between the workers.

    Synthetic data, AutoShardPolicy.DATA: the default (AUTO) first tries to give each worker
    its own files; in-memory data has none, so AUTO falls back to DATA with a warning in the
    log. Saying DATA outright: every worker runs the same pipeline and keeps only its share
    of each batch. The pipeline must therefore be identical on all workers: fixed seeds.

    `data` (x, y) from TFDEPLOY_DATA_DIR is this host's own shard: sharding is OFF, each
    worker feeds its share of every global batch from its own data.
    """
    if data is None:
        (x, y), policy = synthetic_data(), tf.data.experimental.AutoShardPolicy.DATA
    else:
        (x, y), policy = data, tf.data.experimental.AutoShardPolicy.OFF
    xa, xb = split_features(x)
    features = {"a": xa, "b": xb} if multi_input else x
    ds = tf.data.Dataset.from_tensor_slices((features, y))
    ds = ds.shuffle(len(y), seed=SEED, reshuffle_each_iteration=True)
    ds = ds.repeat().batch(global_batch, drop_remainder=True)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = policy
    return ds.with_options(options).prefetch(tf.data.AUTOTUNE)


def build_model(multi_input, features_a=NUM_FEATURES_A, features_b=NUM_FEATURES_B,
                num_classes=NUM_CLASSES):
    """A small MLP classifier; with multi_input, a functional model with two inputs whose
    branches are concatenated."""
    if multi_input:
        in_a = keras.Input(shape=(features_a,), name="a")
        in_b = keras.Input(shape=(features_b,), name="b")
        branch_a = keras.layers.Dense(32, activation="relu", name="branch_a")(in_a)
        branch_b = keras.layers.Dense(16, activation="relu", name="branch_b")(in_b)
        merged = keras.layers.Concatenate(name="merge")([branch_a, branch_b])
        hidden = keras.layers.Dense(32, activation="relu", name="hidden")(merged)
        out = keras.layers.Dense(num_classes, name="logits")(hidden)
        model = keras.Model(inputs=[in_a, in_b], outputs=out, name="two_branch")
    else:
        model = keras.Sequential([
            keras.Input(shape=(features_a + features_b,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(num_classes),
        ], name="mlp")
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"])
    return model


class JsonProgress(keras.callbacks.Callback):
    """Prints the first_step line once and one epoch line per epoch."""

    def __init__(self, task):
        super().__init__()
        self.task = task
        self.first_step_seen = False
        self.epoch_started = 0.0
        # Batch logs stay tensors: no host sync per batch just for this callback.
        self._supports_tf_logs = True

    def on_train_batch_end(self, batch, logs=None):
        if self.first_step_seen:
            return
        self.first_step_seen = True
        # Reading a value waits for the step to finish, so the line means "a step ran".
        # The value itself is not reported: under MultiWorkerMirroredStrategy, tf_keras
        # sums batch logs over the workers (N times the loss); epoch logs are right.
        if hasattr(logs, "fetch"):
            logs.fetch()     # ParameterServerStrategy: the logs are a RemoteValue
        else:
            for value in (logs or {}).values():
                float(value)
                break
        emit("first_step", self.task)

    def on_train_begin(self, logs=None):
        self.resume_checked = False

    def on_epoch_begin(self, epoch, logs=None):
        # BackupAndRestore (run before us) makes fit start after the last backed-up epoch:
        # a first epoch other than 0 means this attempt resumed a previous one.
        if not getattr(self, "resume_checked", True) and epoch > 0:
            emit("resumed", self.task, epoch=epoch)
        self.resume_checked = True
        self.epoch_started = time.monotonic()

    def on_epoch_end(self, epoch, logs=None):
        # Metrics are aggregated over all workers, so every worker prints the same values.
        metrics = {k: float(v) for k, v in (logs or {}).items()}
        fields = {"epoch": epoch + 1, "loss": metrics.pop("loss", float("nan"))}
        fields.update(metrics)
        fields["seconds"] = round(time.monotonic() - self.epoch_started, 3)
        emit("epoch", self.task, **fields)


class TensorBoardScalars(keras.callbacks.Callback):
    """Each epoch's loss and metrics as TensorBoard scalars, laid out as tf_keras's TensorBoard
    callback lays them out (<dir>/train, <dir>/validation; tags epoch_loss, epoch_accuracy...).

    Written with TensorFlow's own summary ops: tf_keras's TensorBoard callback needs the
    tensorboard package for tf.summary.scalar (TBNotInstalledError without it), which
    TensorFlow no longer installs. Viewing the logs needs it, writing them does not."""

    def __init__(self, log_dir):
        super().__init__()
        self.log_dir = log_dir
        self.writers = {}
        self.scalar = tf.compat.v1.SummaryMetadata()
        self.scalar.plugin_data.plugin_name = "scalars"

    def on_epoch_end(self, epoch, logs=None):
        for key, value in (logs or {}).items():
            split, name = ("validation", key[4:]) if key.startswith("val_") else ("train", key)
            if split not in self.writers:
                self.writers[split] = tf.summary.create_file_writer(
                    os.path.join(self.log_dir, split))
            with self.writers[split].as_default():
                tf.summary.write("epoch_" + name, tf.constant(float(value), tf.float32),
                                 step=epoch, metadata=self.scalar)
        for writer in self.writers.values():
            writer.flush()

    def on_train_end(self, logs=None):
        for writer in self.writers.values():
            writer.close()


def save_model(model, output_dir, index, is_chief):
    """Every worker saves: saving reads distributed variables, which may run collective
    ops that hang unless all workers take part. Only the chief's copy is kept; the others
    write to a per-worker temp dir and delete it."""
    if is_chief:
        path = os.path.join(output_dir, "model")
        temp_dir = None
    else:
        temp_dir = os.path.join(output_dir, "workertemp_%d" % index)
        path = os.path.join(temp_dir, "model")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    model.save(path)
    if temp_dir is not None:
        shutil.rmtree(temp_dir, ignore_errors=True)
    return path
