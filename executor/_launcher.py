"""The tiny program between the executor and a query process: arm the parent-death signal,
then exec the query. Run as `python -I -S _launcher.py ERRFD PARENT_PID -- PROGRAM ARGS...`.

Why a separate program rather than a `preexec_fn`: code between fork and exec in a threaded
parent (the agent has zmq and worker threads) may deadlock on a lock some other thread held at
fork time; Python documents `preexec_fn` as unsafe there. This program runs single-threaded.

What it does, on Linux:
1. `prctl(PR_SET_PDEATHSIG, SIGKILL)`: when the thread that forked us dies, the kernel kills
   us. The setting survives `execv` (not setuid programs), so it covers the query process.
2. If our parent is already gone (it died before step 1), exit at once.
3. Mark ERRFD close-on-exec and `execv` the program. A successful exec closes ERRFD, so the
   executor reads EOF; a failed one writes the reason to ERRFD and exits 127, so the executor
   can raise ExecFailedError with that reason instead of seeing a mysterious exit.

Limits: the death signal reaches only this process (the query's main process), not processes
it starts itself; those share its process group and die by `killpg` on every normal path
(kill, shutdown, the main process's exit), not when the executor is SIGKILLed. Elsewhere than
Linux there is no death signal. Stdlib only: this runs before anything of tq is importable.
"""

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> None:
    errfd, parent = int(argv[1]), int(argv[2])
    program = argv[4:]
    os.set_inheritable(errfd, False)  # exec closes it: EOF there means "started"
    try:
        if sys.platform.startswith("linux"):
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:
            os.write(errfd, b"the executor exited before the process started")
            os._exit(126)
        os.execv(program[0], program)
    except OSError as exc:
        os.write(errfd, f"{program[0]}: {exc.strerror or exc}".encode(errors="replace"))
        os._exit(127)


if __name__ == "__main__":
    main(sys.argv)
