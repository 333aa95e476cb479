"""Multi-worker training payload for tfdeploy.

Run by the launcher once per worker, with TF_CONFIG describing the cluster; run by hand
without TF_CONFIG it trains alone. With --strategy ps (a cluster with chief, worker, ps and
evaluator roles) the chief trains with ParameterServerStrategy and model.fit, the worker and
ps tasks serve it, and the evaluator evaluates the chief's checkpoints as they appear in
--checkpoint-dir (a directory the chief's and the evaluator's hosts both see; ps.py). It
trains a small classifier on synthetic data (common.py) and reports progress as one JSON
document per stdout line, which the launcher parses:

    {"event": "start", "task": 0, "workers": 2, "epochs": 3, "steps_per_epoch": 20, ...}
    {"event": "data", "task": 0, "files": ["a.npz"], "examples": 512, ...}  (TFDEPLOY_DATA_DIR)
    {"event": "first_step", "task": 0}
    {"event": "epoch", "task": 0, "epoch": 1, "loss": 1.23, "accuracy": 0.5, "seconds": 0.8}
    {"event": "resumed", "task": 0, "epoch": 2}   (BackupAndRestore: 2 epochs were done)
    {"event": "saved", "task": 0, "path": "..."}
    {"event": "done", "task": 0}
    {"event": "given", "task": 0, "tf_config": {...}, "task_type": "chief"}  (--strategy ps)

Environment read:
    TF_CONFIG             cluster and this task's place in it (absent: train alone)
    TFDEPLOY_OUTPUT_DIR   where the model and the TensorBoard logs (<dir>/tensorboard) are
                          written (default ./output; --output-dir wins)
    TFDEPLOY_RUN_ID       echoed in the start line
    TFDEPLOY_BACKUP_DIR   if set, fault tolerance with keras BackupAndRestore
    TFDEPLOY_DATA_DIR     if it holds *.npz files (arrays x: float features, one row per
                          example, and y: integer labels in [0, --num-classes)), train on
                          those instead of the synthetic data. Each task reads its own
                          host's directory: per-host shards, not split further between tasks.
"""
import argparse
import os
import signal
import sys

# First: common.py sets TensorFlow's environment (quiet C++ logs; tf.keras is tf_keras)
# before TensorFlow is loaded.
from common import (
    NUM_CLASSES, SEED, JsonProgress, TensorBoardScalars, build_model, cluster_spec, emit,
    load_data_dir, make_dataset, save_model, split_features, task_info
)

import tensorflow as tf  # noqa: E402  (after common: see above)
import tf_keras as keras  # noqa: E402


def make_strategy(multi_worker):
    """MultiWorkerMirroredStrategy reads TF_CONFIG itself. It must be created before any
    other TensorFlow op runs, since it (re)configures the runtime to join the cluster."""
    if not multi_worker:
        return tf.distribute.get_strategy()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    # Joining the cluster installs TensorFlow's own SIGTERM handler (a preemption notice),
    # after which SIGTERM no longer stops the process: training just goes on. Put the
    # default back so that stopping a run with TERM works. (While the constructor above
    # waits for the other workers, TERM is still swallowed; only KILL ends it there.)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return strategy


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3, help="default: 3")
    parser.add_argument("--steps-per-epoch", type=int, default=20, help="default: 20")
    parser.add_argument("--batch-size", type=int, default=32,
                        help="per worker; the global batch is this times the workers (32)")
    parser.add_argument("--multi-input", action="store_true",
                        help="two-input functional model (two branches concatenated)")
    parser.add_argument("--num-classes", type=int, default=NUM_CLASSES,
                        help="labels of TFDEPLOY_DATA_DIR's data are 0..N-1 (default: %d)"
                        % NUM_CLASSES)
    parser.add_argument("--strategy", choices=("multi-worker", "ps"), default="multi-worker",
                        help="multi-worker: MultiWorkerMirroredStrategy (default); ps: "
                        "ParameterServerStrategy, for a cluster with chief and ps roles")
    parser.add_argument("--checkpoint-dir",
                        help="--strategy ps: where the chief saves a checkpoint each epoch "
                        "and the evaluator reads them (default: <output dir>/checkpoints)")
    parser.add_argument("--output-dir",
                        default=os.environ.get("TFDEPLOY_OUTPUT_DIR") or "./output",
                        help="default: $TFDEPLOY_OUTPUT_DIR, else ./output")
    return parser.parse_args(argv)


def main(argv=None, callbacks=()):
    """Train, save, report. `callbacks` are extra keras callbacks run after ours (tests use
    this, e.g. to kill a worker mid-run)."""
    args = parse_args(argv)
    if args.strategy == "ps" and cluster_spec():
        import ps
        return ps.main(args, callbacks)
    task_type, index, workers, is_chief = task_info()
    # Printed before joining the cluster: creating the strategy blocks until every worker
    # has started, so "start" without "first_step" means "waiting for the others".
    emit("start", index, workers=workers, run_id=os.environ.get("TFDEPLOY_RUN_ID"),
         type=task_type, chief=is_chief, multi_input=args.multi_input, epochs=args.epochs,
         steps_per_epoch=args.steps_per_epoch)
    data = None
    data_dir = os.environ.get("TFDEPLOY_DATA_DIR")
    if data_dir:
        # Read before joining the cluster: a bad file fails this task at once.
        loaded = load_data_dir(data_dir, args.num_classes)
        if loaded is None:
            emit("data", index, dir=data_dir, files=[], examples=0, synthetic=True)
        else:
            data = loaded[:2]
            emit("data", index, dir=data_dir, files=loaded[2], examples=len(loaded[1]),
                 features=int(loaded[0].shape[1]), synthetic=False)
    # A cluster in TF_CONFIG (even of one worker) means the launcher runs us: join it.
    strategy = make_strategy(multi_worker=bool(cluster_spec()))

    # Same seeds on every worker: identical data order and, with the strategy's broadcast
    # of initial values from worker 0, identical weights, hence identical losses.
    keras.utils.set_random_seed(SEED)

    global_batch = args.batch_size * workers
    dataset = make_dataset(global_batch, args.multi_input, data)
    with strategy.scope():
        if data is None:
            model = build_model(args.multi_input)
        else:
            xa, xb = split_features(data[0][:1])
            model = build_model(args.multi_input, xa.shape[1], xb.shape[1], args.num_classes)

    cbs = []
    backup_dir = os.environ.get("TFDEPLOY_BACKUP_DIR")
    if backup_dir:
        # Resumes from the last finished epoch after a restart. Only the chief's backup
        # is kept (<dir>/chief) and every worker restores from that path, so with workers
        # on several hosts the launcher (--restarts) copies the chief's backup to each.
        cbs.append(keras.callbacks.BackupAndRestore(backup_dir=backup_dir))
    cbs.append(JsonProgress(index))
    if is_chief:
        # The other workers log the same aggregated values; the chief's logs are the run's.
        cbs.append(TensorBoardScalars(os.path.join(args.output_dir, "tensorboard")))
    cbs.extend(callbacks)

    model.fit(dataset, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch,
              callbacks=cbs, verbose=0)

    path = save_model(model, args.output_dir, index, is_chief)
    emit("saved", index, path=os.path.abspath(path), chief=is_chief)
    emit("done", index)
    return 0


if __name__ == "__main__":
    sys.exit(main())
