"""A job file's driver as spark-submit runs it: spark-submit takes a Python file, not a module.

    spark-submit --master yarn --deploy-mode cluster --conf spark.sql.shuffle.partitions=16 \
        "$(python -c 'import sparkeos.jobs.submit as s; print(s.__file__)')" people-etl.yaml

The settings spark-submit is given (--master, --conf, spark-defaults.conf) win over the job file's `spark:` section.
Restarts are the cluster manager's (spark.yarn.maxAppAttempts, the standalone master's --supervise), not the job
file's `restart`, which `sparkeos run` applies.
"""

import os
import sys

if __name__ == "__main__":
    # Python puts this file's directory first on sys.path, where spec.py or audit.py would shadow modules of the
    # same name elsewhere: the driver imports sparkeos as installed.
    here = os.path.dirname(os.path.realpath(__file__))
    sys.path[:] = [entry for entry in sys.path if os.path.realpath(entry or os.curdir) != here]

    from sparkeos.jobs.runner import submit_main

    sys.exit(submit_main())
