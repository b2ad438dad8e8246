"""Rank FAIL_RANK exits with status FAIL_CODE (or kills itself with SIGKILL); others sleep.
Every rank prints its process id first (``PID n``)."""
import os
import signal
import sys
import time

rank = int(os.environ["RANK"])
print(f"PID {os.getpid()}", flush=True)
if rank == int(os.environ.get("FAIL_RANK", "1")):
    time.sleep(float(os.environ.get("FAIL_AFTER", "0.2")))
    code = os.environ.get("FAIL_CODE", "3")
    if code == "KILL":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(int(code))
time.sleep(600)
