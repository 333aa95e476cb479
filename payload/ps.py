"""Parameter-server training for train.py --strategy ps: one module per task type's job.

    chief       trains with ParameterServerStrategy and model.fit (its coordinator sends the
                steps to the workers; the variables live on the ps tasks), saves a checkpoint
                each epoch into --checkpoint-dir
    worker, ps  serve: tf.distribute.Server(...).join(), until the launcher stops them
    evaluator   evaluates each new checkpoint in --checkpoint-dir on held-out data, and ends
                after the last epoch's

Every task first prints what it was given (TF_CONFIG and TFDEPLOY_TASK_TYPE) as a `given`
event line, so that a run's logs show each task's place in the cluster.
"""
import json
import os
import signal
import time

import tensorflow as tf
import tf_keras as keras

import common

# Checkpoints are read by the evaluator while the chief writes the next one.
CHECKPOINT_PREFIX = "ckpt"
EVAL_STEPS = 4
POLL_SECONDS = 0.5


def main(args, callbacks=()):
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    task_type, index = resolver.task_type, resolver.task_id
    common.emit("given", index, task_type=os.environ.get("TFDEPLOY_TASK_TYPE"),
               tf_config=json.loads(os.environ["TF_CONFIG"]))
    checkpoints = args.checkpoint_dir or os.path.join(args.output_dir, "checkpoints")
    if task_type in ("worker", "ps"):
        return serve(resolver, task_type, index)
    if task_type == "evaluator":
        return evaluate(args, checkpoints, index)
    if task_type != "chief":
        raise SystemExit("ps.py: task type %r has no job here" % task_type)
    return coordinate(args, resolver, checkpoints, callbacks)


def serve(resolver, task_type, index):
    """A worker or ps: a gRPC server the chief's coordinator uses, until stopped."""
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=task_type,
                                  task_index=index, protocol=resolver.rpc_layer or "grpc",
                                  start=True)
    common.emit("serving", index, type=task_type)
    server.join()
    return 0


def coordinate(args, resolver, checkpoints, callbacks):
    """The chief: model.fit under ParameterServerStrategy, a checkpoint each epoch."""
    cluster = resolver.cluster_spec().as_dict()
    workers = len(cluster.get("worker", []))
    common.emit("start", 0, workers=workers, ps=len(cluster.get("ps", [])),
               run_id=os.environ.get("TFDEPLOY_RUN_ID"), type="chief", chief=True,
               epochs=args.epochs, steps_per_epoch=args.steps_per_epoch)
    # Variables larger than 64 KiB are split over the ps tasks.
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=64 << 10, max_shards=max(1, len(cluster.get("ps", []))))
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=partitioner)
    # Connecting to the cluster installs TensorFlow's preemption handler for SIGTERM: put the
    # default back so that stopping the run with TERM works.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    keras.utils.set_random_seed(common.SEED)
    with strategy.scope():
        model = common.build_model(multi_input=False)
    # Each worker builds the dataset itself; model.fit under ParameterServerStrategy takes a
    # DatasetCreator (or a dataset) and needs steps_per_epoch (the data is infinite).
    dataset = keras.utils.experimental.DatasetCreator(
        lambda context: common.make_dataset(
            context.get_per_replica_batch_size(args.batch_size * workers), multi_input=False))
    os.makedirs(checkpoints, exist_ok=True)
    cbs = [common.JsonProgress(0), SaveCheckpoint(checkpoints),
           common.TensorBoardScalars(os.path.join(args.output_dir, "tensorboard"))]
    model.fit(dataset, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch,
              callbacks=cbs + list(callbacks), verbose=0)
    common.emit("done", 0)
    return 0


class SaveCheckpoint(keras.callbacks.Callback):
    """tf.train.Checkpoint of the model after each epoch: ckpt-1, ckpt-2..., one per epoch."""

    def __init__(self, directory):
        super().__init__()
        self.directory = directory
        self.checkpoint = None

    def on_epoch_end(self, epoch, logs=None):
        if self.checkpoint is None:
            self.checkpoint = tf.train.Checkpoint(model=self.model)
        path = self.checkpoint.save(os.path.join(self.directory, CHECKPOINT_PREFIX))
        common.emit("checkpoint", 0, epoch=epoch + 1, path=path)


def evaluate(args, checkpoints, index):
    """The evaluator: each new checkpoint restored into a local model and evaluated on a fixed
    held-out set, until the last epoch's. Prints plain lines (not epoch events: its loss is
    not the training loss)."""
    keras.utils.set_random_seed(common.SEED + 1)
    model = common.build_model(multi_input=False)
    x, y = common.synthetic_data()
    held_out = tf.data.Dataset.from_tensor_slices((x[-512:], y[-512:])).batch(64)
    checkpoint = tf.train.Checkpoint(model=model)
    print("evaluator: waiting for checkpoints in %s" % checkpoints, flush=True)
    seen = None
    while True:
        latest = tf.train.latest_checkpoint(checkpoints) if os.path.isdir(checkpoints) else None
        if latest and latest != seen:
            seen = latest
            checkpoint.restore(latest).expect_partial()
            loss, accuracy = model.evaluate(held_out, steps=EVAL_STEPS, verbose=0)
            print("evaluator: %s loss %.4f accuracy %.4f"
                  % (os.path.basename(latest), loss, accuracy), flush=True)
            if latest.endswith("-%d" % args.epochs):
                return 0
        time.sleep(POLL_SECONDS)
