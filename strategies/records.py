"""Names of the records that cross the wire, shared by server and client halves.

Every message is a ``RecordDict``: the model in ``ARRAYS``, round settings in ``CONFIG``,
client results in ``METRICS``; a method adds its own ArrayRecords (e.g. SCAFFOLD's c).
"""

ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"

# ConfigRecord keys sent down with each training message.
ROUND = "server-round"
LR = "lr"
BETA = "beta"
EXPERIMENT = "experiment-id"  # the run directory's name: stable across a resume

# MetricRecord keys sent up.
NUM_EXAMPLES = "num-examples"
TRAIN_LOSS = "train-loss"
NUM_STEPS = "num-steps"
COMPUTE_SECONDS = "compute-seconds"  # local training wall time, measured in the client
STATE_FALLBACK = "state-fallback"  # 1 when the client's saved state was unusable (fell back)

# Query reply (client identity).
PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"
