"""Names of the records that cross the wire, shared by server and client halves.

Every message is a ``RecordDict``: the model in ``ARRAYS``, round settings in ``CONFIG``,
client results in ``METRICS``; a method adds its own ArrayRecords (e.g. SCAFFOLD's c).
Settings of the round (round, lr, beta, upload kind) travel in the message; settings of the
run (local epochs, batch size, the method's parameters) both apps read from the same run
config, which Flower hands to each of them.
"""

from collections.abc import Mapping

ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"

# ConfigRecord keys sent down with each training message.
ROUND = "server-round"
LR = "lr"
BETA = "beta"
UPLOAD_DELTA = "upload-delta"  # bool: the model upload is Delta_i (``update``), not w_iK
# (``model``); the round asks for one and the reply's CONFIG record says which it holds
EXPERIMENT = "experiment-id"  # the run directory's name: stable across a resume
ACCOUNTED_ROUND = "accounted-round"  # int, per client: the round of its last reply the server
# aggregated (0: none); the client starts its server-summed state from that version
KEEP_ROUND = "keep-round"  # int, per client, rounds=async only: the round of the state its task
# in flight at the server's last checkpoint started from; kept on disk (beside the newest two)
# so that the task, redone after a resume, starts from it again (server_app/async_resume.py)
KEEP_ACCOUNTED = "keep-accounted"  # int, per client, rounds=async only, methods with server-summed
# state: the client's accounted round at the server's last checkpoint; kept on disk too, since
# its accounted round may move on before the next checkpoint and a resume names this one again
COMPRESSION = "compression"  # str: the codec of the uploads (``fedinit.methods.compression``), in a
# train message when the run compresses (absent: off) and in the reply's CONFIG record, which
# the server checks against the run's (``fedinit.methods.upload_codec``)
CLIENT_ID = "client-id"  # int: the client the message is for (a node without a partition-id
# trains as this client; one with a partition-id refuses a message naming another)

PERSONAL_EVAL = "personal-eval"  # bool in an evaluate message: personalized evaluation
EVAL_CHOICES = "eval-choices"  # ArrayRecord in a personalized-evaluation message: the method's
# group models, stacked (``weights.stacked``); the client is scored on the one with the
# lowest loss on its own training data (IFCA's inference rule), not on ARRAYS
FEDERATED_EVAL = "federated-eval"  # bool in an evaluate message: the global model's loss and
# accuracy on the client's local test split (the accuracy curve without a central test set)

# MetricRecord keys sent up.
NUM_EXAMPLES = "num-examples"
TRAIN_LOSS = "train-loss"
NUM_STEPS = "num-steps"
COMPUTE_SECONDS = "compute-seconds"  # local training wall time, measured in the client
STATE_FALLBACK = "state-fallback"  # 1 when the client's saved state was unusable (fell back)

# The round's aggregate metrics the strategy shell returns (the experiment adds its own and
# ``server_app.results.ROUND_FIELDS`` lists every column of a round row).
NUM_REPLIES = "num-replies"  # replies aggregated
NUM_REJECTED = "num-rejected"  # replies refused by a check or the norm filter
NUM_MISSING = "num-missing"  # sampled clients that did not answer in time
NORM_LIMIT_USED = "norm-limit-used"  # the largest upload norm / its limit this round
BYTES_UP = "bytes-up"  # the encoded upload payload bytes of the round's decoded replies
BYTES_DOWN = "bytes-down"  # the serialized content bytes of the round's train messages sent
# (strategies/download_bytes.py)
AGGREGATED = "aggregated"  # True when the round's replies (an async flush's buffer) moved the
# global model: the one mark sync, secure, personalized and async rows share (a row
# without it, from an older run, reads through server_app.results.was_aggregated)
DIVERGENCE = "divergence"  # the paper's (1/|S|) sum ||w_iK - w_{t+1}||^2
ROUND_TRAIN_LOSS = TRAIN_LOSS  # the example-weighted mean of the replies' train-loss
SHELL_METRICS = (ROUND_TRAIN_LOSS, DIVERGENCE, NUM_REPLIES, NUM_REJECTED, NUM_MISSING,
                 NORM_LIMIT_USED)

# Personalized evaluation reply: accuracies on the client's local test split.
NUM_TEST = "num-test-examples"
ACC_GLOBAL = "acc-global"  # (a) the global model w_t
ACC_FINETUNED = "acc-finetuned"  # (b) w_t after finetune-epochs local epochs
ACC_OWN = "acc-own"  # (c) the client's own model (absent when it has none yet)
SERVED_CHOICE = "served-choice"  # int: which of EVAL_CHOICES the client chose as (a) (absent
# when the message carried none)
DIVERGENCE_EVAL = "divergence-eval"  # bool in an evaluate message: the paper's divergence
# term, ||w_prev_i - w_t||^2 from the client's stored last local model (w_0 before any)
SQ_DISTANCE = "sq-distance"  # its reply: that squared distance (float64 sum)
HAS_TRAINED = "has-trained"  # its reply: 1 when w_prev_i is a trained model, 0 for w_0
EVAL_LOSS = "eval-loss"  # an evaluate reply: mean cross-entropy of the received model
EVAL_ACC = "eval-acc"  # an evaluate reply: accuracy of the received model

# Query reply (client identity).
PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"


def kept_rounds(config: Mapping[str, object]) -> tuple[int, ...]:
    """The rounds a train message asks the client to keep on disk beside its newest two
    (``KEEP_ROUND``, ``KEEP_ACCOUNTED``; absent: none)."""
    return tuple(int(config[k]) for k in (KEEP_ROUND, KEEP_ACCOUNTED)  # type: ignore[call-overload]
                 if k in config)
